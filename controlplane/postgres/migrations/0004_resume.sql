-- A paused run its owner asked to resume goes back to the queue with
-- resume set: the worker that leases it restores it from its checkpoint
-- instead of starting it afresh.
ALTER TABLE runs ADD COLUMN resume INTEGER NOT NULL DEFAULT 0;
