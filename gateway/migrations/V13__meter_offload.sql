-- Packets and bytes decided by an NF's flow offload entries (sluice:nf@0.5.0)
-- without a call: metered beside the packets handed to the NF. Records from
-- before offload have none.
ALTER TABLE meters ADD COLUMN offloaded_packets INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN offloaded_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN offload_returns_dropped INTEGER NOT NULL DEFAULT 0;
