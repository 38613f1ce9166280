//! Deployments: revisions written compare-and-set, their modules, the
//! groups they were ever placed on, and the overlap check of their traffic
//! attachments.

use super::{Store, StoreError};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use sluice_traffic::Attachment;

/// A deployment (its spec is the resolved chain, JSON).
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
    /// What a host's death may lose of its flows' state.
    pub durability: sluice_control::Durability,
    /// Created, ms.
    pub created_ms: i64,
    /// Last changed, ms.
    pub updated_ms: i64,
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
                "INSERT INTO deployments (id, tenant_id, name, grp, revision, spec, created_ms, updated_ms, attachments, fragments, durability)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
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
                    d.fragments.name(),
                    d.durability.name()
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
                "UPDATE deployments SET grp = ?2, revision = ?3, spec = ?4, updated_ms = ?5, attachments = ?7, fragments = ?8,
                 durability = ?9 WHERE id = ?1 AND revision = ?6",
                params![
                    d.id,
                    d.group,
                    d.revision,
                    d.spec,
                    d.updated_ms,
                    d.revision - 1,
                    attachments,
                    d.fragments.name(),
                    d.durability.name()
                ],
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
            durability: {
                let text: String = r.get(10)?;
                text.parse().map_err(|e: String| {
                    rusqlite::Error::FromSqlConversionFailure(10, rusqlite::types::Type::Text, e.into())
                })?
            },
        })
    }

    const DEPLOYMENT_COLS: &str = "SELECT id, tenant_id, name, grp, revision, spec, created_ms, updated_ms, attachments, fragments, durability FROM deployments";

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

    /// Whether deployment `deployment` of `tenant` was ever placed on `group`.
    pub fn was_placed(&self, deployment: &str, tenant: &str, group: &str) -> Result<bool, StoreError> {
        let n: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM placements WHERE deployment_id = ?1 AND tenant_id = ?2 AND grp = ?3",
            params![deployment, tenant, group],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }
}
