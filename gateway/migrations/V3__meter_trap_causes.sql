-- Traps by cause of each meter record, as a JSON object
-- ({"deadline exceeded": 3}); '{}' when it had none.
ALTER TABLE meters ADD COLUMN trap_causes TEXT NOT NULL DEFAULT '{}';
