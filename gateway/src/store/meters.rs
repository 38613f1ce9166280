//! Meter records (stored once by id) and the usage summed from them.

use super::{Store, StoreError, i, u};
use rusqlite::params;
use sluice_control::{MeterRecord, MeterSums};
use std::collections::BTreeMap;

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

impl Store {
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

    /// How many meter records are stored (all tenants).
    pub fn meter_count(&self) -> Result<u64, StoreError> {
        let n: i64 = self.db().query_row("SELECT COUNT(*) FROM meters", [], |r| r.get(0))?;
        Ok(u(n))
    }
}
