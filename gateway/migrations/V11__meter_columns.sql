-- One column per meter counter and gauge, named as the JSON field of the
-- host's meters (sluice_meters::Meters::COLUMNS), so that insert and
-- select are built from that one list.
--
-- `state_bytes` held all the state at the window's end; it becomes
-- `table_bytes` beside `flow_state_bytes` (records from before count all
-- their state as table state, which is what their sum reads).
ALTER TABLE meters RENAME COLUMN state_bytes TO table_bytes;
ALTER TABLE meters ADD COLUMN flow_state_bytes INTEGER NOT NULL DEFAULT 0;
-- Records from before count their table operations in `state_ops` and
-- none of the following.
ALTER TABLE meters ADD COLUMN state_rejected INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN table_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN table_ops INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN table_errors INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN table_rejected INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN table_expired INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN log_dropped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN instantiations INTEGER NOT NULL DEFAULT 0;
