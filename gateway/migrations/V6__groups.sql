-- Host groups: the operator's scaling settings and the version of each
-- group's flow-ownership table (it only grows, across gateway restarts).
CREATE TABLE group_settings (
    grp TEXT PRIMARY KEY,
    min_hosts INTEGER NOT NULL DEFAULT 1,
    max_hosts INTEGER,
    target_load REAL,
    table_version INTEGER NOT NULL DEFAULT 0
);
-- A drained host stays registered and heard, but owns no flows.
ALTER TABLE hosts ADD COLUMN drained INTEGER NOT NULL DEFAULT 0;
