-- State an NF held, per meter record: byte-milliseconds over the window
-- (what is billed, in GB-hours) and the bytes held at the window's end.
ALTER TABLE meters ADD COLUMN state_byte_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN state_bytes INTEGER NOT NULL DEFAULT 0;
