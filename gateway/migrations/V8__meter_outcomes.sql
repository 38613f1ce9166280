-- What became of the packets an NF was handed, per meter record:
-- forwarded, dropped, given the failure policy, and (of the forwarded)
-- rewritten. Records from before this version count 0 for each.
ALTER TABLE meters ADD COLUMN forwarded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN dropped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN policy INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meters ADD COLUMN rewritten INTEGER NOT NULL DEFAULT 0;
