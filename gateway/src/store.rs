//! The gateway's metadata in SQLite: tenants, API keys (hashed), modules,
//! deployments and meter records.
//!
//! Meter records are keyed by their id, and inserted with `INSERT OR
//! IGNORE`: a record delivered twice is stored once. That, and acking a
//! record only after its insert committed, is what makes billing exact
//! under redelivery. WAL mode lets readers (reports) run beside the writer.
//!
//! The schema is versioned: `gateway/migrations/V<n>__<what>.sql`, applied
//! in order at open by refinery (which records them in
//! `refinery_schema_history`).

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use sluice_control::{EventBatch, MeterRecord, MeterSums, NfEvent};
use sluice_traffic::Attachment;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// Storage errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database: {0}")]
    Sql(#[from] rusqlite::Error),
    /// The schema could not be brought up to date.
    #[error("migrating database {path}: {reason}")]
    Migration {
        /// Database file.
        path: String,
        /// Cause.
        reason: String,
    },
    /// A row changed (or was created) by another request in the meantime.
    #[error("{0}")]
    Conflict(String),
    /// A deployment's traffic attachment overlaps one of another
    /// deployment of its host group (the message says whose, naming the
    /// other deployment only to its own tenant).
    #[error("{0}")]
    Overlap(String),
    /// A stored document could not be decoded.
    #[error("database holds a malformed {what}: {reason}")]
    Corrupt {
        /// What.
        what: &'static str,
        /// Cause.
        reason: String,
    },
}

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantRow {
    /// Id.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// Creation time, ms.
    pub created_ms: i64,
}

/// A host the operator registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRow {
    /// Host id.
    pub id: String,
    /// Its group.
    pub group: String,
    /// Its NATS nkey public key.
    pub nkey: Option<String>,
    /// Registered, ms.
    pub created_ms: i64,
    /// A dispatcher (reads its group's ownership table only), not a host.
    pub dispatcher: bool,
    /// Packets per second it can process at most (none: the gateway's
    /// default): its meter records may claim no more.
    pub max_pps: Option<u64>,
    /// Bits per second it can process at most (none: the default).
    pub max_bps: Option<u64>,
}

/// A registered host's ceiling: packets and bits per second (none: the
/// gateway's default).
pub type HostCeiling = (Option<u64>, Option<u64>);

/// A module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleRow {
    /// Id.
    pub id: String,
    /// Owner.
    pub tenant_id: String,
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// SHA-256, hex.
    pub digest: String,
    /// Bytes.
    pub size: i64,
    /// `sluice:nf` version it targets.
    pub contract: String,
    /// Upload time, ms.
    pub created_ms: i64,
}

/// A deployment (its spec is JSON: [`crate::api::DeploymentSpecDoc`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentRow {
    /// Id.
    pub id: String,
    /// Owner.
    pub tenant_id: String,
    /// Name.
    pub name: String,
    /// Host group.
    pub group: String,
    /// Revision.
    pub revision: i64,
    /// The chain with resolved modules, JSON.
    pub spec: String,
    /// Which traffic of the group's hosts is this deployment's (none: a
    /// deployment of a development group).
    pub attachments: Vec<Attachment>,
    /// What its NFs see of fragmented IP datagrams.
    pub fragments: sluice_runtime::fragments::FragmentMode,
    /// Created, ms.
    pub created_ms: i64,
    /// Last changed, ms.
    pub updated_ms: i64,
}

/// Sums of meter records grouped by NF, module and version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageSums {
    /// NF name in the chain.
    pub nf: String,
    /// Module name.
    pub module: String,
    /// Module version.
    pub version: String,
    /// Deployment id.
    pub deployment: String,
    /// The sums.
    pub sums: MeterSums,
    /// Records summed.
    pub records: u64,
    /// Traps by cause.
    pub trap_causes: BTreeMap<String, u64>,
    /// The exact sum of the records' `state_byte_ms`: `sums.state_byte_ms`
    /// saturates at `u64::MAX` (about 5,124 GB-hours), which a month of a
    /// few GB held can pass.
    pub state_byte_ms: u128,
    /// Bytes of state held at the end of the latest window in the range (a
    /// gauge): each host's latest record of the deployment's NF counts in
    /// the row of the module version it metered; summed over hosts.
    pub state_bytes: u64,
}

impl UsageSums {
    /// Adds another row: sums, records, traps by cause, and state held.
    pub fn add(&mut self, o: &UsageSums) {
        self.sums.add(&o.sums);
        self.records += o.records;
        for (cause, n) in &o.trap_causes {
            *self.trap_causes.entry(cause.clone()).or_default() += n;
        }
        self.state_byte_ms = self.state_byte_ms.saturating_add(o.state_byte_ms);
        self.state_bytes = self.state_bytes.saturating_add(o.state_bytes);
    }
}

/// One point of a usage time series.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesPoint {
    /// NF.
    pub nf: String,
    /// Module version.
    pub version: String,
    /// Bucket start, ms.
    pub t_ms: i64,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// Guest ns.
    pub cpu_ns: u64,
    /// Invocations.
    pub invocations: u64,
}

/// The SQLite database.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The attachments stored in column `idx` (a JSON array).
fn attachments_column(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<Vec<Attachment>> {
    let text: String = r.get(idx)?;
    serde_json::from_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e)))
}

/// See [`Store::check_overlap`]; `db` may be a transaction.
fn check_overlap(
    db: &Connection,
    tenant_id: &str,
    group: &str,
    except: Option<&str>,
    attachments: &[Attachment],
) -> Result<(), StoreError> {
    if attachments.is_empty() {
        return Ok(());
    }
    let mut st = db.prepare_cached(
        "SELECT tenant_id, name, attachments FROM deployments
         WHERE grp = ?1 AND (?2 IS NULL OR id <> ?2) AND attachments <> '[]' ORDER BY created_ms, id",
    )?;
    let rows = st.query_map(params![group, except], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, attachments_column(r, 2)?))
    })?;
    for row in rows {
        let (owner, name, theirs) = row?;
        for mine in attachments {
            let Some(other) = theirs.iter().find(|t| mine.overlaps(t)) else { continue };
            let whose = if owner == tenant_id {
                format!("'{other}' of this tenant's deployment '{name}'")
            } else {
                "the traffic of another tenant's deployment".to_string()
            };
            return Err(StoreError::Overlap(format!(
                "attachment '{mine}' overlaps {whose} in host group '{group}': each packet belongs to one \
                 deployment; narrow it (another port, vlan or dst prefix) or free that traffic first"
            )));
        }
    }
    Ok(())
}

impl Store {
    /// Opens (creating) the database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mut conn = conn;
        embedded::migrations::runner()
            .run(&mut conn)
            .map_err(|e| StoreError::Migration { path: path.display().to_string(), reason: e.to_string() })?;
        Ok(Store { conn: Mutex::new(conn) })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the database takes writes now: a write transaction is
    /// begun and rolled back (for `/readyz`).
    pub fn check_writable(&self) -> Result<(), StoreError> {
        self.db().execute_batch("BEGIN IMMEDIATE; ROLLBACK;")?;
        Ok(())
    }

    /// Creates a tenant with its first key. `None` if the name is taken.
    pub fn create_tenant(&self, t: &TenantRow, key_hash: &str, prefix: &str) -> Result<bool, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let n = tx.execute(
            "INSERT OR IGNORE INTO tenants (id, name, created_ms) VALUES (?1, ?2, ?3)",
            params![t.id, t.name, t.created_ms],
        )?;
        if n == 0 {
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO api_keys (hash, tenant_id, prefix, created_ms) VALUES (?1, ?2, ?3, ?4)",
            params![key_hash, t.id, prefix, t.created_ms],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// Adds a key to a tenant. `false` if there is no such tenant.
    pub fn add_key(&self, tenant_id: &str, key_hash: &str, prefix: &str, now_ms: i64) -> Result<bool, StoreError> {
        let db = self.db();
        let exists: Option<String> =
            db.query_row("SELECT id FROM tenants WHERE id = ?1", [tenant_id], |r| r.get(0)).optional()?;
        if exists.is_none() {
            return Ok(false);
        }
        db.execute(
            "INSERT INTO api_keys (hash, tenant_id, prefix, created_ms) VALUES (?1, ?2, ?3, ?4)",
            params![key_hash, tenant_id, prefix, now_ms],
        )?;
        Ok(true)
    }

    /// A tenant's API keys: `(prefix, created_ms)`, oldest first.
    pub fn keys(&self, tenant_id: &str) -> Result<Vec<(String, i64)>, StoreError> {
        let db = self.db();
        let mut st =
            db.prepare("SELECT prefix, created_ms FROM api_keys WHERE tenant_id = ?1 ORDER BY created_ms, prefix")?;
        let rows = st.query_map([tenant_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Revokes the tenant's key(s) starting with `prefix`; how many matched
    /// (nothing is revoked when more than one key matches).
    pub fn revoke_key(&self, tenant_id: &str, prefix: &str) -> Result<usize, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let n: i64 = tx.query_row(
            "SELECT COUNT(*) FROM api_keys WHERE tenant_id = ?1 AND prefix = ?2",
            params![tenant_id, prefix],
            |r| r.get(0),
        )?;
        if n == 1 {
            tx.execute("DELETE FROM api_keys WHERE tenant_id = ?1 AND prefix = ?2", params![tenant_id, prefix])?;
            tx.commit()?;
        }
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Replaces the key with hash `old` by a new one, atomically.
    pub fn rotate_key(&self, old_hash: &str, new_hash: &str, prefix: &str, now_ms: i64) -> Result<bool, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let tenant: Option<String> =
            tx.query_row("SELECT tenant_id FROM api_keys WHERE hash = ?1", [old_hash], |r| r.get(0)).optional()?;
        let Some(tenant) = tenant else { return Ok(false) };
        tx.execute("DELETE FROM api_keys WHERE hash = ?1", [old_hash])?;
        tx.execute(
            "INSERT INTO api_keys (hash, tenant_id, prefix, created_ms) VALUES (?1, ?2, ?3, ?4)",
            params![new_hash, tenant, prefix, now_ms],
        )?;
        tx.commit()?;
        Ok(true)
    }

    /// The host groups a tenant may deploy to.
    pub fn grants(&self, tenant_id: &str) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT grp FROM tenant_groups WHERE tenant_id = ?1 ORDER BY grp")?;
        let rows = st.query_map([tenant_id], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Sets the host groups a tenant may deploy to. `false` if there is no
    /// such tenant. Deployments already on a group taken away keep running
    /// until the tenant moves or deletes them.
    pub fn set_grants(&self, tenant_id: &str, groups: &[String]) -> Result<bool, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let exists: Option<String> =
            tx.query_row("SELECT id FROM tenants WHERE id = ?1", [tenant_id], |r| r.get(0)).optional()?;
        if exists.is_none() {
            return Ok(false);
        }
        tx.execute("DELETE FROM tenant_groups WHERE tenant_id = ?1", [tenant_id])?;
        for g in groups {
            tx.execute("INSERT OR IGNORE INTO tenant_groups (tenant_id, grp) VALUES (?1, ?2)", params![tenant_id, g])?;
        }
        tx.commit()?;
        Ok(true)
    }

    /// Registers a host; `false` if the id or the nkey is taken.
    pub fn add_host(&self, h: &HostRow) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "INSERT OR IGNORE INTO hosts (id, grp, nkey, created_ms, role, max_pps, max_bps)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                h.id,
                h.group,
                h.nkey,
                h.created_ms,
                if h.dispatcher { "dispatcher" } else { "host" },
                h.max_pps.and_then(|v| i64::try_from(v).ok()),
                h.max_bps.and_then(|v| i64::try_from(v).ok())
            ],
        )?;
        Ok(n == 1)
    }

    /// Removes a host from the registry.
    pub fn remove_host(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.db().execute("DELETE FROM hosts WHERE id = ?1", [id])? == 1)
    }

    /// Every registered host.
    pub fn registered_hosts(&self) -> Result<Vec<HostRow>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT id, grp, nkey, created_ms, role, max_pps, max_bps FROM hosts ORDER BY id")?;
        let rows = st.query_map([], |r| {
            Ok(HostRow {
                id: r.get(0)?,
                group: r.get(1)?,
                nkey: r.get(2)?,
                created_ms: r.get(3)?,
                dispatcher: r.get::<_, String>(4)? == "dispatcher",
                max_pps: r.get::<_, Option<i64>>(5)?.and_then(|v| u64::try_from(v).ok()),
                max_bps: r.get::<_, Option<i64>>(6)?.and_then(|v| u64::try_from(v).ok()),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Sets or clears a registered host's drained mark; `false` if no
    /// such host.
    pub fn set_drained(&self, id: &str, drained: bool) -> Result<bool, StoreError> {
        Ok(self.db().execute("UPDATE hosts SET drained = ?2 WHERE id = ?1 AND role = 'host'", params![id, drained])?
            == 1)
    }

    /// The registered hosts marked drained.
    pub fn drained_hosts(&self) -> Result<std::collections::BTreeSet<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT id FROM hosts WHERE drained != 0")?;
        let rows = st.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The operator's settings of every group that has any.
    pub fn group_settings(&self) -> Result<BTreeMap<String, crate::groups::GroupSettings>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT grp, min_hosts, max_hosts, target_load FROM group_settings ORDER BY grp")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                crate::groups::GroupSettings { min_hosts: r.get(1)?, max_hosts: r.get(2)?, target_load: r.get(3)? },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Stores a group's settings.
    pub fn set_group_settings(&self, group: &str, s: &crate::groups::GroupSettings) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO group_settings (grp, min_hosts, max_hosts, target_load) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (grp) DO UPDATE SET min_hosts = ?2, max_hosts = ?3, target_load = ?4",
            params![group, s.min_hosts, s.max_hosts, s.target_load],
        )?;
        Ok(())
    }

    /// The next version of a group's ownership table, at least `after + 1`
    /// (counted up durably: versions never repeat).
    pub fn next_table_version(&self, group: &str, after: u64) -> Result<u64, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX - 1);
        let v: i64 = self.db().query_row(
            "INSERT INTO group_settings (grp, table_version) VALUES (?1, ?2 + 1)
             ON CONFLICT (grp) DO UPDATE SET table_version = MAX(table_version, ?2) + 1
             RETURNING table_version",
            params![group, after],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(v).unwrap_or(0))
    }

    /// The ceiling a registered host (not a dispatcher) was given, packets
    /// and bits per second (each none: the gateway's default); none when
    /// it is not registered.
    pub fn host_ceiling(&self, id: &str) -> Result<Option<HostCeiling>, StoreError> {
        Ok(self
            .db()
            .query_row("SELECT max_pps, max_bps FROM hosts WHERE id = ?1 AND role = 'host'", [id], |r| {
                let get = |i: usize| r.get::<_, Option<i64>>(i).map(|v| v.and_then(|v| u64::try_from(v).ok()));
                Ok((get(0)?, get(1)?))
            })
            .optional()?)
    }

    /// The group of a registered host (dispatchers have none here: they
    /// may not heartbeat, bill or report events).
    pub fn host_group(&self, id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .db()
            .query_row("SELECT grp FROM hosts WHERE id = ?1 AND role = 'host'", [id], |r| r.get(0))
            .optional()?)
    }

    /// Whether deployment `deployment` of `tenant` was ever placed on `group`.
    pub fn was_placed(&self, deployment: &str, tenant: &str, group: &str) -> Result<bool, StoreError> {
        let n: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM placements WHERE deployment_id = ?1 AND tenant_id = ?2 AND grp = ?3",
            params![deployment, tenant, group],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    /// The prefix of the key with this hash.
    pub fn key_prefix(&self, key_hash: &str) -> Result<Option<String>, StoreError> {
        Ok(self.db().query_row("SELECT prefix FROM api_keys WHERE hash = ?1", [key_hash], |r| r.get(0)).optional()?)
    }

    /// The tenant a key hash belongs to.
    pub fn tenant_by_key(&self, key_hash: &str) -> Result<Option<TenantRow>, StoreError> {
        Ok(self
            .db()
            .query_row(
                "SELECT t.id, t.name, t.created_ms FROM api_keys k JOIN tenants t ON t.id = k.tenant_id WHERE k.hash = ?1",
                [key_hash],
                |r| Ok(TenantRow { id: r.get(0)?, name: r.get(1)?, created_ms: r.get(2)? }),
            )
            .optional()?)
    }

    /// Every tenant.
    pub fn tenants(&self) -> Result<Vec<TenantRow>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT id, name, created_ms FROM tenants ORDER BY created_ms, id")?;
        let rows = st.query_map([], |r| Ok(TenantRow { id: r.get(0)?, name: r.get(1)?, created_ms: r.get(2)? }))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Stores a module; `false` if the tenant already has this name and version.
    pub fn insert_module(&self, m: &ModuleRow) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "INSERT OR IGNORE INTO modules (id, tenant_id, name, version, digest, size, contract, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![m.id, m.tenant_id, m.name, m.version, m.digest, m.size, m.contract, m.created_ms],
        )?;
        Ok(n == 1)
    }

    fn module_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ModuleRow> {
        Ok(ModuleRow {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            name: r.get(2)?,
            version: r.get(3)?,
            digest: r.get(4)?,
            size: r.get(5)?,
            contract: r.get(6)?,
            created_ms: r.get(7)?,
        })
    }

    /// A tenant's modules.
    pub fn modules(&self, tenant_id: &str) -> Result<Vec<ModuleRow>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(
            "SELECT id, tenant_id, name, version, digest, size, contract, created_ms FROM modules WHERE tenant_id = ?1 ORDER BY name, created_ms",
        )?;
        let rows = st.query_map([tenant_id], Self::module_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One of a tenant's modules, by id or `name@version`.
    pub fn module(&self, tenant_id: &str, reference: &str) -> Result<Option<ModuleRow>, StoreError> {
        let db = self.db();
        let cols = "SELECT id, tenant_id, name, version, digest, size, contract, created_ms FROM modules";
        let row = match reference.split_once('@') {
            Some((name, version)) => db
                .query_row(
                    &format!("{cols} WHERE tenant_id = ?1 AND name = ?2 AND version = ?3"),
                    params![tenant_id, name, version],
                    Self::module_row,
                )
                .optional()?,
            None => db
                .query_row(
                    &format!("{cols} WHERE tenant_id = ?1 AND id = ?2"),
                    params![tenant_id, reference],
                    Self::module_row,
                )
                .optional()?,
        };
        Ok(row)
    }

    /// Names of the deployments using a module.
    pub fn module_users(&self, module_id: &str) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(
            "SELECT d.name FROM deployment_modules dm JOIN deployments d ON d.id = dm.deployment_id WHERE dm.module_id = ?1 ORDER BY d.name",
        )?;
        let rows = st.query_map([module_id], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Deletes a module unless a deployment uses it: `Err(names)` then.
    pub fn delete_module(&self, tenant_id: &str, id: &str) -> Result<Result<bool, Vec<String>>, StoreError> {
        let users = self.module_users(id)?;
        if !users.is_empty() {
            return Ok(Err(users));
        }
        let n = self.db().execute("DELETE FROM modules WHERE tenant_id = ?1 AND id = ?2", params![tenant_id, id])?;
        Ok(Ok(n == 1))
    }

    /// Whether any module (of any tenant) still has this digest.
    pub fn digest_in_use(&self, digest: &str) -> Result<bool, StoreError> {
        let n: i64 = self.db().query_row("SELECT COUNT(*) FROM modules WHERE digest = ?1", [digest], |r| r.get(0))?;
        Ok(n > 0)
    }

    /// Stores a new deployment (revision 1) or the next revision of an
    /// existing one, if it is still at `d.revision - 1` (compare-and-set:
    /// of two concurrent updates one wins, the other gets
    /// [`StoreError::Conflict`]); a name taken meanwhile is a conflict too.
    ///
    /// An attachment of `d` that overlaps one of another deployment of
    /// its group (any tenant's) is [`StoreError::Overlap`]. The check and
    /// the write are one transaction that holds the database's write lock
    /// from its start, so of two deployments claiming the same traffic at
    /// once only one is stored.
    pub fn put_deployment(&self, d: &DeploymentRow, module_ids: &[String]) -> Result<(), StoreError> {
        let mut db = self.db();
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        check_overlap(&tx, &d.tenant_id, &d.group, Some(&d.id), &d.attachments)?;
        let attachments = serde_json::to_string(&d.attachments)
            .map_err(|e| StoreError::Corrupt { what: "attachment", reason: e.to_string() })?;
        if d.revision <= 1 {
            let inserted = tx.execute(
                "INSERT INTO deployments (id, tenant_id, name, grp, revision, spec, created_ms, updated_ms, attachments, fragments)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT DO NOTHING",
                params![
                    d.id,
                    d.tenant_id,
                    d.name,
                    d.group,
                    d.revision,
                    d.spec,
                    d.created_ms,
                    d.updated_ms,
                    attachments,
                    d.fragments.name()
                ],
            )?;
            if inserted == 0 {
                return Err(StoreError::Conflict(format!(
                    "a deployment named '{}' was created at the same time; update it with PUT",
                    d.name
                )));
            }
        } else {
            let updated = tx.execute(
                "UPDATE deployments SET grp = ?2, revision = ?3, spec = ?4, updated_ms = ?5, attachments = ?7, fragments = ?8
                 WHERE id = ?1 AND revision = ?6",
                params![d.id, d.group, d.revision, d.spec, d.updated_ms, d.revision - 1, attachments, d.fragments.name()],
            )?;
            if updated == 0 {
                return Err(StoreError::Conflict(format!(
                    "deployment '{}' is no longer at revision {}: another update came first; GET it and try again",
                    d.name,
                    d.revision - 1
                )));
            }
        }
        tx.execute(
            "INSERT OR IGNORE INTO placements (deployment_id, tenant_id, grp) VALUES (?1, ?2, ?3)",
            params![d.id, d.tenant_id, d.group],
        )?;
        tx.execute("DELETE FROM deployment_modules WHERE deployment_id = ?1", [&d.id])?;
        for m in module_ids {
            tx.execute(
                "INSERT OR IGNORE INTO deployment_modules (deployment_id, module_id) VALUES (?1, ?2)",
                params![d.id, m],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Whether `attachments`, for a deployment of `tenant_id` in `group`,
    /// overlap those of another deployment there (not counting
    /// `except`, the deployment's own): [`StoreError::Overlap`] if so. A
    /// request checks this before its costly work; [`Store::put_deployment`]
    /// checks again as it writes.
    pub fn check_overlap(
        &self,
        tenant_id: &str,
        group: &str,
        except: Option<&str>,
        attachments: &[Attachment],
    ) -> Result<(), StoreError> {
        check_overlap(&self.db(), tenant_id, group, except, attachments)
    }

    fn deployment_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeploymentRow> {
        Ok(DeploymentRow {
            id: r.get(0)?,
            tenant_id: r.get(1)?,
            name: r.get(2)?,
            group: r.get(3)?,
            revision: r.get(4)?,
            spec: r.get(5)?,
            created_ms: r.get(6)?,
            updated_ms: r.get(7)?,
            attachments: attachments_column(r, 8)?,
            fragments: {
                let text: String = r.get(9)?;
                text.parse().map_err(|e: String| {
                    rusqlite::Error::FromSqlConversionFailure(9, rusqlite::types::Type::Text, e.into())
                })?
            },
        })
    }

    const DEPLOYMENT_COLS: &str = "SELECT id, tenant_id, name, grp, revision, spec, created_ms, updated_ms, attachments, fragments FROM deployments";

    /// A tenant's deployments.
    pub fn deployments(&self, tenant_id: &str) -> Result<Vec<DeploymentRow>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(&format!("{} WHERE tenant_id = ?1 ORDER BY created_ms, id", Self::DEPLOYMENT_COLS))?;
        let rows = st.query_map([tenant_id], Self::deployment_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every deployment of a host group (all tenants).
    pub fn group_deployments(&self, group: &str) -> Result<Vec<DeploymentRow>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(&format!("{} WHERE grp = ?1 ORDER BY created_ms, id", Self::DEPLOYMENT_COLS))?;
        let rows = st.query_map([group], Self::deployment_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every host group with deployments.
    pub fn groups(&self) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT DISTINCT grp FROM deployments ORDER BY grp")?;
        let rows = st.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One of a tenant's deployments, by id or name.
    pub fn deployment(&self, tenant_id: &str, id_or_name: &str) -> Result<Option<DeploymentRow>, StoreError> {
        Ok(self
            .db()
            .query_row(
                &format!("{} WHERE tenant_id = ?1 AND (id = ?2 OR name = ?2)", Self::DEPLOYMENT_COLS),
                params![tenant_id, id_or_name],
                Self::deployment_row,
            )
            .optional()?)
    }

    /// Deletes one of a tenant's deployments.
    pub fn delete_deployment(&self, tenant_id: &str, id: &str) -> Result<bool, StoreError> {
        let n =
            self.db().execute("DELETE FROM deployments WHERE tenant_id = ?1 AND id = ?2", params![tenant_id, id])?;
        Ok(n == 1)
    }

    /// Stores meter records idempotently (one transaction); returns how
    /// many were new.
    pub fn insert_meters(&self, recs: &[MeterRecord], now_ms: i64) -> Result<usize, StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let mut new = 0;
        {
            let mut st = tx.prepare_cached(
                "INSERT OR IGNORE INTO meters (id, tenant_id, deployment_id, host, nf, module, version, digest, window_start_ms, window_end_ms,
                 invocations, packets, bytes, cpu_ns, state_ops, traps, errors, events, received_ms, trap_causes,
                 state_byte_ms, state_bytes, forwarded, dropped, policy, rewritten)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22,
                         ?23, ?24, ?25, ?26)",
            )?;
            for r in recs {
                new += st.execute(params![
                    r.id,
                    r.tenant,
                    r.deployment,
                    r.host,
                    r.nf,
                    r.module,
                    r.version,
                    r.digest,
                    i(r.window_start_ms),
                    i(r.window_end_ms),
                    i(r.sums.invocations),
                    i(r.sums.packets),
                    i(r.sums.bytes),
                    i(r.sums.cpu_ns),
                    i(r.sums.state_ops),
                    i(r.sums.traps),
                    i(r.sums.errors),
                    i(r.sums.events),
                    now_ms,
                    serde_json::to_string(&r.trap_causes).unwrap_or_else(|_| "{}".into()),
                    i(r.sums.state_byte_ms),
                    i(r.state_bytes),
                    i(r.sums.forwarded),
                    i(r.sums.dropped),
                    i(r.sums.policy),
                    i(r.sums.rewritten)
                ])?;
            }
        }
        tx.commit()?;
        Ok(new)
    }

    /// A tenant's usage with window start in `[from, to)`, by NF, module,
    /// version and deployment.
    pub fn usage(&self, tenant_id: &str, from_ms: i64, to_ms: i64) -> Result<Vec<UsageSums>, StoreError> {
        let db = self.db();
        // State byte-ms is summed in two halves (high and low 32 bits of
        // each record), which cannot overflow SQLite's 64-bit SUM, and put
        // together exactly here.
        let mut st = db.prepare(
            "SELECT nf, module, version, deployment_id, SUM(invocations), SUM(packets), SUM(bytes), SUM(cpu_ns), SUM(state_ops),
                    SUM(traps), SUM(errors), SUM(events), COUNT(*), SUM(state_byte_ms >> 32), SUM(state_byte_ms & 4294967295),
                    SUM(forwarded), SUM(dropped), SUM(policy), SUM(rewritten)
             FROM meters WHERE tenant_id = ?1 AND window_start_ms >= ?2 AND window_start_ms < ?3
             GROUP BY deployment_id, nf, module, version ORDER BY deployment_id, nf, module, version",
        )?;
        let rows = st.query_map(params![tenant_id, from_ms, to_ms], |r| {
            let state_byte_ms = (u128::from(u(r.get(13)?)) << 32) + u128::from(u(r.get(14)?));
            Ok(UsageSums {
                nf: r.get(0)?,
                module: r.get(1)?,
                version: r.get(2)?,
                deployment: r.get(3)?,
                sums: MeterSums {
                    invocations: u(r.get(4)?),
                    packets: u(r.get(5)?),
                    bytes: u(r.get(6)?),
                    cpu_ns: u(r.get(7)?),
                    state_ops: u(r.get(8)?),
                    traps: u(r.get(9)?),
                    errors: u(r.get(10)?),
                    events: u(r.get(11)?),
                    state_byte_ms: u64::try_from(state_byte_ms).unwrap_or(u64::MAX),
                    forwarded: u(r.get(15)?),
                    dropped: u(r.get(16)?),
                    policy: u(r.get(17)?),
                    rewritten: u(r.get(18)?),
                },
                records: u(r.get(12)?),
                trap_causes: BTreeMap::new(),
                state_byte_ms,
                state_bytes: 0,
            })
        })?;
        let mut out: Vec<UsageSums> = rows.collect::<Result<_, _>>()?;
        // Traps by cause, from the records' JSON objects, into their rows.
        let mut st = db.prepare(
            "SELECT m.deployment_id, m.nf, m.module, m.version, j.key, SUM(j.value)
             FROM meters m, json_each(m.trap_causes) j
             WHERE m.tenant_id = ?1 AND m.window_start_ms >= ?2 AND m.window_start_ms < ?3 AND m.traps > 0
             GROUP BY m.deployment_id, m.nf, m.module, m.version, j.key",
        )?;
        let causes = st.query_map(params![tenant_id, from_ms, to_ms], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                u(r.get(5)?),
            ))
        })?;
        for c in causes {
            let (deployment, nf, module, version, cause, n) = c?;
            if let Some(row) = out
                .iter_mut()
                .find(|u| u.deployment == deployment && u.nf == nf && u.module == module && u.version == version)
            {
                *row.trap_causes.entry(cause).or_default() += n;
            }
        }
        // State held now: each host's latest record of each deployment's
        // NF (whatever version it ran), in the row of that version.
        let mut st = db.prepare(
            "SELECT deployment_id, nf, module, version, state_bytes FROM (
                 SELECT deployment_id, nf, module, version, state_bytes, ROW_NUMBER() OVER (
                     PARTITION BY deployment_id, nf, host ORDER BY window_end_ms DESC, received_ms DESC, id DESC) AS latest
                 FROM meters WHERE tenant_id = ?1 AND window_start_ms >= ?2 AND window_start_ms < ?3)
             WHERE latest = 1",
        )?;
        let held = st.query_map(params![tenant_id, from_ms, to_ms], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                u(r.get(4)?),
            ))
        })?;
        for h in held {
            let (deployment, nf, module, version, bytes) = h?;
            if let Some(row) = out
                .iter_mut()
                .find(|u| u.deployment == deployment && u.nf == nf && u.module == module && u.version == version)
            {
                row.state_bytes = row.state_bytes.saturating_add(bytes);
            }
        }
        Ok(out)
    }

    /// A tenant's usage over time in buckets of `step_ms`, per NF and version.
    pub fn series(
        &self,
        tenant_id: &str,
        from_ms: i64,
        to_ms: i64,
        step_ms: i64,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(
            "SELECT nf, version, (window_start_ms / ?4) * ?4 AS t, SUM(packets), SUM(bytes), SUM(cpu_ns), SUM(invocations)
             FROM meters WHERE tenant_id = ?1 AND window_start_ms >= ?2 AND window_start_ms < ?3
             GROUP BY nf, version, t ORDER BY nf, version, t",
        )?;
        let rows = st.query_map(params![tenant_id, from_ms, to_ms, step_ms.max(1)], |r| {
            Ok(SeriesPoint {
                nf: r.get(0)?,
                version: r.get(1)?,
                t_ms: r.get(2)?,
                packets: u(r.get(3)?),
                bytes: u(r.get(4)?),
                cpu_ns: u(r.get(5)?),
                invocations: u(r.get(6)?),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Stores a batch of NF events and keeps only the newest `keep` of each
    /// tenant it touched.
    pub fn insert_events(&self, batch: &EventBatch, now_ms: i64, keep: u64) -> Result<(), StoreError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let mut tenants = std::collections::BTreeSet::new();
        {
            let mut st = tx.prepare_cached(
                "INSERT INTO events (tenant_id, deployment_id, host, nf, version, kind, level, timestamp_ns, flow, fields, received_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            )?;
            for e in &batch.events {
                let fields = serde_json::to_string(&e.fields).unwrap_or_else(|_| "{}".into());
                st.execute(params![
                    e.tenant,
                    e.deployment,
                    batch.host,
                    e.nf,
                    e.version,
                    e.kind,
                    e.level,
                    i(e.timestamp_ns),
                    e.flow,
                    fields,
                    now_ms
                ])?;
                tenants.insert(e.tenant.clone());
            }
        }
        // NF log lines and traps are kept apart from the NFs' own events: a
        // chatty NF must not push its tenant's alerts out.
        for t in tenants {
            for logs in [false, true] {
                tx.execute(
                    "DELETE FROM events WHERE tenant_id = ?1 AND (kind LIKE 'sluice.%') = ?3 AND seq <= (
                       SELECT seq FROM events WHERE tenant_id = ?1 AND (kind LIKE 'sluice.%') = ?3
                       ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
                    params![t, i(keep), logs],
                )?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// A tenant's newest events (optionally of one deployment and kind).
    pub fn events(
        &self,
        tenant_id: &str,
        deployment_id: Option<&str>,
        kind: Option<&str>,
        since_ms: Option<i64>,
        before_seq: Option<i64>,
        limit: u64,
    ) -> Result<Vec<(i64, String, i64, NfEvent)>, StoreError> {
        let db = self.db();
        let mut st = db.prepare(
            "SELECT host, deployment_id, nf, version, kind, level, timestamp_ns, flow, fields, received_ms, seq FROM events
             WHERE tenant_id = ?1 AND (?2 IS NULL OR deployment_id = ?2)
               AND (?3 IS NULL OR kind = ?3) AND (?3 IS NOT NULL OR kind NOT LIKE 'sluice.%')
               AND (?5 IS NULL OR received_ms >= ?5) AND (?6 IS NULL OR seq < ?6)
             ORDER BY seq DESC LIMIT ?4",
        )?;
        let rows = st.query_map(params![tenant_id, deployment_id, kind, i(limit), since_ms, before_seq], |r| {
            let fields: String = r.get(8)?;
            Ok((
                r.get::<_, i64>(10)?,
                r.get::<_, String>(0)?,
                r.get::<_, i64>(9)?,
                NfEvent {
                    tenant: tenant_id.to_string(),
                    deployment: r.get(1)?,
                    nf: r.get(2)?,
                    version: r.get(3)?,
                    kind: r.get(4)?,
                    level: r.get(5)?,
                    timestamp_ns: u(r.get(6)?),
                    flow: r.get(7)?,
                    fields: serde_json::from_str(&fields).unwrap_or_default(),
                },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// A tenant's NF log lines and traps (events of the host's `sluice.`
    /// kinds), in order: those after sequence number `after`, else the
    /// newest `limit`; filtered by deployment, NF, levels and time
    /// received (ms).
    pub fn logs(&self, tenant_id: &str, q: &LogQuery<'_>) -> Result<Vec<LogRow>, StoreError> {
        let db = self.db();
        let levels = q.levels.join(",");
        let order = if q.after.is_some() { "ASC" } else { "DESC" };
        let mut st = db.prepare(&format!(
            "SELECT seq, received_ms, host, deployment_id, nf, version, kind, level, timestamp_ns, fields FROM events
             WHERE tenant_id = ?1 AND kind IN ('sluice.log', 'sluice.trap')
               AND (?2 IS NULL OR deployment_id = ?2) AND (?3 IS NULL OR nf = ?3)
               AND instr(',' || ?4 || ',', ',' || level || ',') > 0
               AND (?5 IS NULL OR received_ms >= ?5) AND (?6 IS NULL OR seq > ?6)
             ORDER BY seq {order} LIMIT ?7"
        ))?;
        let rows =
            st.query_map(params![tenant_id, q.deployment, q.nf, levels, q.since_ms, q.after, i(q.limit)], |r| {
                let fields: String = r.get(9)?;
                Ok(LogRow {
                    seq: r.get(0)?,
                    received_ms: r.get(1)?,
                    host: r.get(2)?,
                    event: NfEvent {
                        tenant: tenant_id.to_string(),
                        deployment: r.get(3)?,
                        nf: r.get(4)?,
                        version: r.get(5)?,
                        kind: r.get(6)?,
                        level: r.get(7)?,
                        timestamp_ns: u(r.get(8)?),
                        flow: None,
                        fields: serde_json::from_str(&fields).unwrap_or_default(),
                    },
                })
            })?;
        let mut out: Vec<LogRow> = rows.collect::<Result<_, _>>()?;
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    /// How many meter records are stored (all tenants).
    pub fn meter_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self.db().query_row("SELECT COUNT(*) FROM meters", [], |r| r.get(0))?;
        Ok(u(n))
    }
}

/// Which log lines [`Store::logs`] returns.
#[derive(Debug, Clone, Default)]
pub struct LogQuery<'a> {
    /// Only this deployment (id).
    pub deployment: Option<&'a str>,
    /// Only this NF (name in the chain).
    pub nf: Option<&'a str>,
    /// The levels wanted (`debug`, `info`, `warn`, `error`).
    pub levels: Vec<&'static str>,
    /// Only lines received at or after this time, ms since the epoch.
    pub since_ms: Option<i64>,
    /// Only lines after this sequence number (oldest first); none: the
    /// newest.
    pub after: Option<i64>,
    /// At most this many.
    pub limit: u64,
}

/// One stored log line or trap of an NF: the event that carried it, with
/// its sequence number, when the gateway received it and from which host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    pub seq: i64,
    pub received_ms: i64,
    pub host: String,
    pub event: NfEvent,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
    use super::*;

    fn rec(id: &str, packets: u64) -> MeterRecord {
        MeterRecord {
            id: id.into(),
            host: "h".into(),
            tenant: "t1".into(),
            deployment: "d1".into(),
            nf: "fw".into(),
            module: "firewall".into(),
            version: "1.0.0".into(),
            digest: "x".into(),
            window_start_ms: 1000,
            window_end_ms: 2000,
            sums: MeterSums {
                invocations: 1,
                packets,
                bytes: packets * 64,
                cpu_ns: 10,
                state_ops: 2,
                ..Default::default()
            },
            trap_causes: Default::default(),
            state_bytes: 0,
        }
    }

    #[test]
    fn meter_records_are_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        assert_eq!(s.insert_meters(&[rec("a", 5), rec("b", 7)], 0).unwrap(), 2);
        assert_eq!(s.insert_meters(&[rec("a", 5), rec("c", 1)], 0).unwrap(), 1);
        let u = s.usage("t1", 0, 10_000).unwrap();
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].sums.packets, 13);
        assert_eq!(u[0].records, 3);
        assert!(s.usage("t2", 0, 10_000).unwrap().is_empty());
        assert!(s.usage("t1", 1001, 10_000).unwrap().is_empty());
    }

    #[test]
    fn state_byte_ms_is_summed_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        let mut a = rec("a", 1);
        a.sums.state_byte_ms = u64::MAX / 4;
        a.state_bytes = 4096;
        let mut b = rec("b", 1);
        b.sums.state_byte_ms = 7;
        s.insert_meters(&[a, b], 0).unwrap();
        let u = s.usage("t1", 0, 10_000).unwrap();
        assert_eq!(u[0].sums.state_byte_ms, u64::MAX / 4 + 7);
        assert_eq!(u[0].state_byte_ms, u128::from(u64::MAX / 4 + 7));
    }

    #[test]
    fn state_byte_ms_past_what_sqlite_and_u64_can_sum_stays_exact() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        // Five records of i64::MAX byte-ms each: SQLite's SUM would fail
        // with an overflow, and the u64 sums saturate.
        let big = u64::try_from(i64::MAX).unwrap();
        let recs: Vec<MeterRecord> = (0..5)
            .map(|n| {
                let mut r = rec(&format!("r{n}"), 1);
                r.sums.state_byte_ms = big;
                r
            })
            .collect();
        s.insert_meters(&recs, 0).unwrap();
        let u = s.usage("t1", 0, 10_000).unwrap();
        assert_eq!(u[0].state_byte_ms, 5 * u128::from(big));
        assert_eq!(u[0].sums.state_byte_ms, u64::MAX);
    }

    #[test]
    fn state_held_is_each_hosts_latest_record_in_the_row_of_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        let at = |id: &str, host: &str, version: &str, end: u64, bytes: u64| {
            let mut r = rec(id, 1);
            r.host = host.into();
            r.version = version.into();
            r.window_start_ms = end - 1000;
            r.window_end_ms = end;
            r.state_bytes = bytes;
            r
        };
        s.insert_meters(
            &[
                // Host a ran 1.0.0, then 2.0.0, which holds 300 bytes now.
                at("a1", "a", "1.0.0", 2000, 100),
                at("a2", "a", "1.0.0", 3000, 200),
                at("a3", "a", "2.0.0", 4000, 300),
                // Host b still runs 1.0.0 with 50 bytes.
                at("b1", "b", "1.0.0", 2000, 70),
                at("b2", "b", "1.0.0", 3500, 50),
            ],
            0,
        )
        .unwrap();
        let u = s.usage("t1", 0, 10_000).unwrap();
        let held = |version: &str| u.iter().find(|r| r.version == version).unwrap().state_bytes;
        assert_eq!((held("1.0.0"), held("2.0.0")), (50, 300));
        // In a range that ends before host a's upgrade, its latest record
        // there counts.
        let u = s.usage("t1", 0, 2500).unwrap();
        assert_eq!(u.iter().map(|r| (r.version.as_str(), r.state_bytes)).collect::<Vec<_>>(), [("1.0.0", 270)]);
    }

    #[test]
    fn trap_causes_are_summed_into_usage() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        let mut a = rec("a", 5);
        a.sums.traps = 3;
        a.trap_causes = [("panic".to_string(), 2), ("deadline exceeded".to_string(), 1)].into();
        let mut b = rec("b", 5);
        b.sums.traps = 4;
        b.trap_causes = [("panic".to_string(), 4)].into();
        let mut other = rec("c", 1);
        other.nf = "other".into();
        s.insert_meters(&[a, b, other], 0).unwrap();
        let u = s.usage("t1", 0, 10_000).unwrap();
        let fw = u.iter().find(|r| r.nf == "fw").unwrap();
        assert_eq!(fw.sums.traps, 7);
        assert_eq!(fw.trap_causes, [("deadline exceeded".to_string(), 1), ("panic".to_string(), 6)].into());
        assert!(u.iter().find(|r| r.nf == "other").unwrap().trap_causes.is_empty());
    }

    #[test]
    fn only_the_newest_events_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        let ev = |tenant: &str, kind: &str| NfEvent {
            tenant: tenant.into(),
            deployment: "d1".into(),
            nf: "fw".into(),
            version: "1".into(),
            kind: kind.into(),
            level: "info".into(),
            timestamp_ns: 1,
            flow: None,
            fields: [("k".to_string(), "v".to_string())].into(),
        };
        let batch = EventBatch {
            host: "h".into(),
            events: (0..10).map(|n| ev("t1", &format!("k{n}"))).chain([ev("t2", "other")]).collect(),
            dropped: 0,
        };
        s.insert_events(&batch, 0, 4).unwrap();
        let got = s.events("t1", None, None, None, None, 100).unwrap();
        let kinds: Vec<&str> = got.iter().map(|(_, _, _, e)| e.kind.as_str()).collect();
        assert_eq!(kinds, ["k9", "k8", "k7", "k6"]);
        assert_eq!(got[0].3.fields["k"], "v");
        // Paging back: the events before the last one seen, newest first.
        let older = s.events("t1", None, None, None, Some(got[1].0), 100).unwrap();
        let kinds: Vec<&str> = older.iter().map(|(_, _, _, e)| e.kind.as_str()).collect();
        assert_eq!(kinds, ["k7", "k6"]);
        assert_eq!(s.events("t1", Some("d1"), Some("k8"), None, None, 100).unwrap().len(), 1);
        assert_eq!(s.events("t1", Some("d2"), None, None, None, 100).unwrap().len(), 0);
        assert_eq!(s.events("t2", None, None, None, None, 100).unwrap().len(), 1);
        // Received after a time: none are, later than now.
        assert_eq!(s.events("t1", None, None, Some(i64::MAX), None, 100).unwrap().len(), 0);

        // Log lines are kept apart: a flood of them leaves the events, and
        // the events list leaves them out.
        let lines = EventBatch {
            host: "h".into(),
            events: (0..10)
                .map(|n| NfEvent { level: if n % 2 == 0 { "info" } else { "error" }.into(), ..ev("t1", "sluice.log") })
                .collect(),
            dropped: 0,
        };
        s.insert_events(&lines, 5, 4).unwrap();
        assert_eq!(s.events("t1", None, None, None, None, 100).unwrap().len(), 4);
        let q = |levels: Vec<&'static str>, after: Option<i64>| LogQuery {
            levels,
            after,
            limit: 100,
            ..Default::default()
        };
        let all = s.logs("t1", &q(vec!["debug", "info", "warn", "error"], None)).unwrap();
        assert_eq!(all.len(), 4);
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "oldest first");
        assert_eq!(s.logs("t1", &q(vec!["error"], None)).unwrap().len(), 2);
        assert_eq!(s.logs("t1", &q(vec!["debug", "info", "warn", "error"], Some(all[1].seq))).unwrap().len(), 2);
        assert_eq!(s.logs("t2", &q(vec!["debug", "info", "warn", "error"], None)).unwrap().len(), 0);
    }

    #[test]
    fn a_deployed_module_cannot_be_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        s.create_tenant(&TenantRow { id: "t1".into(), name: "acme".into(), created_ms: 0 }, "h", "p").unwrap();
        assert!(
            !s.create_tenant(&TenantRow { id: "t2".into(), name: "acme".into(), created_ms: 0 }, "h2", "p").unwrap()
        );
        let m = ModuleRow {
            id: "m1".into(),
            tenant_id: "t1".into(),
            name: "fw".into(),
            version: "1".into(),
            digest: "d".into(),
            size: 1,
            contract: "0.2.0".into(),
            created_ms: 0,
        };
        assert!(s.insert_module(&m).unwrap());
        assert!(!s.insert_module(&ModuleRow { id: "m2".into(), ..m.clone() }).unwrap());
        assert_eq!(s.module("t1", "fw@1").unwrap().unwrap().id, "m1");
        assert!(s.module("t2", "m1").unwrap().is_none());
        let d = DeploymentRow {
            id: "d1".into(),
            tenant_id: "t1".into(),
            name: "edge".into(),
            group: "g".into(),
            revision: 1,
            spec: "{}".into(),
            attachments: Vec::new(),
            fragments: sluice_runtime::fragments::FragmentMode::Reassemble,
            created_ms: 0,
            updated_ms: 0,
        };
        s.put_deployment(&d, &["m1".into()]).unwrap();
        // The same name again, and an update from a stale revision: conflicts.
        let again = DeploymentRow { id: "d9".into(), ..d.clone() };
        assert!(matches!(s.put_deployment(&again, &[]), Err(StoreError::Conflict(_))));
        let two = DeploymentRow { revision: 2, spec: "{\"v\":2}".into(), ..d.clone() };
        s.put_deployment(&two, &["m1".into()]).unwrap();
        assert!(matches!(s.put_deployment(&two, &["m1".into()]), Err(StoreError::Conflict(_))));
        let stored = s.deployment("t1", "edge").unwrap().unwrap();
        assert_eq!((stored.revision, stored.fragments), (2, sluice_runtime::fragments::FragmentMode::Reassemble));
        assert_eq!(s.delete_module("t1", "m1").unwrap(), Err(vec!["edge".to_string()]));
        assert!(s.delete_deployment("t1", "d1").unwrap());
        assert_eq!(s.delete_module("t1", "m1").unwrap(), Ok(true));
    }

    fn attached(id: &str, tenant: &str, group: &str, revision: i64, attachments: &[&str]) -> DeploymentRow {
        DeploymentRow {
            id: id.into(),
            tenant_id: tenant.into(),
            name: format!("name-{id}"),
            group: group.into(),
            revision,
            spec: "[]".into(),
            attachments: attachments.iter().map(|a| a.parse().unwrap()).collect(),
            fragments: Default::default(),
            created_ms: 0,
            updated_ms: 0,
        }
    }

    fn overlap_message(r: Result<(), StoreError>) -> String {
        match r {
            Err(StoreError::Overlap(m)) => m,
            other => panic!("expected an overlap, got {other:?}"),
        }
    }

    #[test]
    fn overlapping_attachments_are_refused_in_a_group() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("g.db")).unwrap();
        for (id, name) in [("t1", "acme"), ("t2", "globex")] {
            s.create_tenant(&TenantRow { id: id.into(), name: name.into(), created_ms: 0 }, id, id).unwrap();
        }
        let web = attached("d1", "t1", "edge", 1, &["port=0,vlan=100", "port=1,dst=10.0.0.0/8"]);
        s.put_deployment(&web, &[]).unwrap();
        assert_eq!(s.deployment("t1", "d1").unwrap().unwrap().attachments, web.attachments);

        // Another tenant's overlapping claim: refused, without naming the deployment.
        let theirs = attached("d2", "t2", "edge", 1, &["port=0,vlan=100,dst=192.168.0.0/16"]);
        let m = overlap_message(s.put_deployment(&theirs, &[]));
        assert!(m.contains("another tenant's deployment") && !m.contains("name-d1") && !m.contains("vlan=100'"), "{m}");
        assert!(m.contains("'port=0,vlan=100,dst=192.168.0.0/16'"), "{m}");
        assert!(s.deployment("t2", "d2").unwrap().is_none());
        // The same tenant's: refused, naming its deployment and attachment.
        let mine = attached("d3", "t1", "edge", 1, &["port=1,dst=10.9.0.0/16"]);
        let m = overlap_message(s.put_deployment(&mine, &[]));
        assert!(m.contains("'name-d1'") && m.contains("'port=1,dst=10.0.0.0/8'"), "{m}");
        // The pre-check says the same.
        assert!(matches!(s.check_overlap("t1", "edge", None, &mine.attachments), Err(StoreError::Overlap(_))));

        // Disjoint claims, and the same claim in another group, are fine.
        s.put_deployment(&attached("d4", "t2", "edge", 1, &["port=0,vlan=200", "port=1,dst=11.0.0.0/8"]), &[]).unwrap();
        s.put_deployment(&attached("d5", "t2", "lab", 1, &["port=0,vlan=100"]), &[]).unwrap();
        // An update is not judged against its own previous attachments...
        s.put_deployment(&attached("d1", "t1", "edge", 2, &["port=0,vlan=100", "port=1,dst=10.1.0.0/16"]), &[])
            .unwrap();
        // ...but a move into a group goes through the check there.
        let m = overlap_message(s.put_deployment(&attached("d5", "t2", "edge", 2, &["port=0,vlan=100"]), &[]));
        assert!(m.contains("host group 'edge'"), "{m}");
        assert_eq!(s.deployment("t2", "d5").unwrap().unwrap().group, "lab");
        // Deleting a deployment frees its traffic.
        assert!(s.delete_deployment("t1", "d1").unwrap());
        s.put_deployment(&theirs, &[]).unwrap();
        // Development deployments (no attachments) never overlap.
        s.put_deployment(&attached("d6", "t1", "edge", 1, &[]), &[]).unwrap();
    }

    #[test]
    fn concurrent_claims_on_the_same_traffic_store_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.db");
        let s = std::sync::Arc::new(Store::open(&path).unwrap());
        for t in ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"] {
            s.create_tenant(&TenantRow { id: t.into(), name: t.into(), created_ms: 0 }, t, t).unwrap();
        }
        let threads: Vec<_> = (0..8)
            .map(|n| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let d = attached(&format!("d{n}"), &format!("t{n}"), "edge", 1, &["port=0,vlan=7"]);
                    s.put_deployment(&d, &[])
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
        assert!(results.iter().all(|r| r.is_ok() || matches!(r, Err(StoreError::Overlap(_)))));
        // A second handle on the same file (another connection) is held to it too.
        let other = Store::open(&path).unwrap();
        let d = attached("d9", "t0", "edge", 1, &["port=0"]);
        assert!(matches!(other.put_deployment(&d, &[]), Err(StoreError::Overlap(_))));
    }
}
