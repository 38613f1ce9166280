//! Uploaded modules (their blobs live on disk, by digest).

use super::{Store, StoreError};
use rusqlite::{OptionalExtension, params};

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

impl Store {
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
}
