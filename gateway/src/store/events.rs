//! NF events, and the log lines and traps among them.

use super::{Store, StoreError, i, u};
use rusqlite::params;
use sluice_control::{EventBatch, NfEvent};

impl Store {
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
