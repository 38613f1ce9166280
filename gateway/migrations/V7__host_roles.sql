-- A registered identity is a host (runs deployments, heartbeats, bills) or
-- a dispatcher (steers a group's traffic by its ownership table; may only
-- read that table).
ALTER TABLE hosts ADD COLUMN role TEXT NOT NULL DEFAULT 'host';
