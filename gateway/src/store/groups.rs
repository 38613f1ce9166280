//! Host groups: the operator's scaling settings and the durable counter of
//! ownership-table versions.

use super::{Store, StoreError};
use crate::model::GroupSettings;
use rusqlite::params;
use std::collections::BTreeMap;

impl Store {
    /// The operator's settings of every group that has any.
    pub fn group_settings(&self) -> Result<BTreeMap<String, GroupSettings>, StoreError> {
        let db = self.db();
        let mut st = db.prepare("SELECT grp, min_hosts, max_hosts, target_load FROM group_settings ORDER BY grp")?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                GroupSettings { min_hosts: r.get(1)?, max_hosts: r.get(2)?, target_load: r.get(3)? },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Stores a group's settings.
    pub fn set_group_settings(&self, group: &str, s: &GroupSettings) -> Result<(), StoreError> {
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
}
