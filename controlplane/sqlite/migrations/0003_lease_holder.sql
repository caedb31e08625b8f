-- A lease is bound to the worker credential it was handed to (lease_holder)
-- and to a secret token, of which only the SHA-256 is kept (hex). Leases
-- held when this runs have neither: their workers' calls are refused (403)
-- and the leases expire as "worker lost" (or are requeued).
ALTER TABLE runs ADD COLUMN lease_holder TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN lease_token_hash TEXT NOT NULL DEFAULT '';
