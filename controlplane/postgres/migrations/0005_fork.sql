-- A fork is a run of its parent's task, started from the parent's
-- checkpoint or stored home: parent_run_id names the parent, and prompt,
-- when not empty, is the fork's own prompt instead of the task's.
ALTER TABLE runs ADD COLUMN parent_run_id TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN prompt TEXT NOT NULL DEFAULT '';
