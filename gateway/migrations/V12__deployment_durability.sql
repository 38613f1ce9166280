-- What a host's death may lose of a deployment's flow state: 'periodic'
-- (replicated every interval: the last interval's changes) or
-- 'replicated' (output commit: a packet that changed its flow's state
-- leaves only once the flow's next owner holds the change).
ALTER TABLE deployments ADD COLUMN durability TEXT NOT NULL DEFAULT 'periodic';
