//! Tenants, their API keys (hashed) and the host groups each may deploy to.

use super::{Store, StoreError};
use rusqlite::{OptionalExtension, params};

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

impl Store {
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
}
