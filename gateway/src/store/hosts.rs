//! The host registry: hosts and dispatchers, their ceilings, drain marks
//! and groups.

use super::{Store, StoreError};
use rusqlite::{OptionalExtension, params};

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

impl Store {
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
}
