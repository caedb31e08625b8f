CREATE TABLE tasks (
	id TEXT PRIMARY KEY,
	user_id TEXT NOT NULL,
	conversation_id TEXT NOT NULL,
	prompt TEXT NOT NULL,
	spec TEXT NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE TABLE runs (
	id TEXT PRIMARY KEY,
	task_id TEXT NOT NULL REFERENCES tasks(id),
	session_id TEXT NOT NULL DEFAULT '',
	previous_run_id TEXT NOT NULL DEFAULT '',
	status TEXT NOT NULL,
	created_at BIGINT NOT NULL,
	leased_at BIGINT,
	started_at BIGINT,
	ended_at BIGINT,
	worker_id TEXT NOT NULL DEFAULT '',
	epoch BIGINT NOT NULL DEFAULT 0,
	lease_expires_at BIGINT,
	lease_state TEXT NOT NULL DEFAULT '',
	cancel_requested INTEGER NOT NULL DEFAULT 0,
	attempts INTEGER NOT NULL DEFAULT 0,
	exit_code INTEGER,
	error TEXT NOT NULL DEFAULT '',
	prompt_tokens BIGINT NOT NULL DEFAULT 0,
	completion_tokens BIGINT NOT NULL DEFAULT 0,
	output TEXT NOT NULL DEFAULT '',
	output_truncated INTEGER NOT NULL DEFAULT 0,
	trace_path TEXT NOT NULL DEFAULT '',
	artifact TEXT NOT NULL DEFAULT '',
	changes TEXT NOT NULL DEFAULT '',
	container TEXT NOT NULL DEFAULT '',
	stream_next BIGINT NOT NULL DEFAULT 0,
	stream_ended INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_queue ON runs (status, created_at, id);
CREATE INDEX runs_lease ON runs (lease_state, lease_expires_at);
CREATE INDEX runs_created ON runs (created_at, id);
CREATE TABLE output_chunks (
	run_id TEXT NOT NULL REFERENCES runs(id),
	off BIGINT NOT NULL,
	data BLOB NOT NULL,
	PRIMARY KEY (run_id, off)
);
