-- Hosts registered by the operator: only these may heartbeat and send
-- meter records, and only for deployments placed on their group. `nkey` is
-- the host's NATS public key (none for hosts of an unauthenticated bus).
CREATE TABLE hosts (
    id TEXT PRIMARY KEY,
    grp TEXT NOT NULL,
    nkey TEXT UNIQUE,
    created_ms INTEGER NOT NULL
);
-- The host groups each tenant may deploy to, granted by the operator.
CREATE TABLE tenant_groups (
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    grp TEXT NOT NULL,
    PRIMARY KEY (tenant_id, grp)
);
-- Every group a deployment was ever placed on, kept after it moves or is
-- deleted: meter records that arrive late are still checked against it.
CREATE TABLE placements (
    deployment_id TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    PRIMARY KEY (deployment_id, grp)
);
INSERT OR IGNORE INTO placements (deployment_id, tenant_id, grp) SELECT id, tenant_id, grp FROM deployments;
INSERT OR IGNORE INTO tenant_groups (tenant_id, grp) SELECT DISTINCT tenant_id, grp FROM deployments;
