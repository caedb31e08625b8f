CREATE TABLE workers (
	id TEXT PRIMARY KEY,
	capacity TEXT NOT NULL,
	labels TEXT NOT NULL,
	last_seen BIGINT NOT NULL
);
CREATE INDEX workers_seen ON workers (last_seen);
