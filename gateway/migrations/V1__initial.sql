-- The schema as first released (every statement tolerates a database made
-- before migrations were tracked).
CREATE TABLE IF NOT EXISTS tenants (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    hash TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    prefix TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS modules (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    contract TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    UNIQUE (tenant_id, name, version)
);
CREATE TABLE IF NOT EXISTS deployments (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id),
    name TEXT NOT NULL,
    grp TEXT NOT NULL,
    revision INTEGER NOT NULL,
    spec TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE TABLE IF NOT EXISTS deployment_modules (
    deployment_id TEXT NOT NULL REFERENCES deployments(id) ON DELETE CASCADE,
    module_id TEXT NOT NULL REFERENCES modules(id),
    PRIMARY KEY (deployment_id, module_id)
);
CREATE TABLE IF NOT EXISTS meters (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    host TEXT NOT NULL,
    nf TEXT NOT NULL,
    module TEXT NOT NULL,
    version TEXT NOT NULL,
    digest TEXT NOT NULL,
    window_start_ms INTEGER NOT NULL,
    window_end_ms INTEGER NOT NULL,
    invocations INTEGER NOT NULL,
    packets INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    cpu_ns INTEGER NOT NULL,
    state_ops INTEGER NOT NULL,
    traps INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    events INTEGER NOT NULL,
    received_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS meters_tenant_time ON meters (tenant_id, window_start_ms);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    host TEXT NOT NULL,
    nf TEXT NOT NULL,
    version TEXT NOT NULL,
    kind TEXT NOT NULL,
    level TEXT NOT NULL,
    timestamp_ns INTEGER NOT NULL,
    flow TEXT,
    fields TEXT NOT NULL,
    received_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_tenant ON events (tenant_id, seq);
