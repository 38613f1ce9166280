-- The traffic attachments of each deployment (which packets of its
-- group's hosts are its own), as a JSON array of objects
-- ([{"port": 0, "vlan": 100, "dst": "10.1.0.0/16", "out": 1}]); '[]' for
-- a deployment of a development group, which has none.
ALTER TABLE deployments ADD COLUMN attachments TEXT NOT NULL DEFAULT '[]';
