//! Meter records (stored once by id) and the usage summed from them.

use super::{Store, StoreError, i, u};
use rusqlite::params;
use rusqlite::types::Value;
use sluice_control::{MeterRecord, Meters};

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
    /// The sums, traps by cause included. The gauges (`table_bytes`,
    /// `flow_state_bytes`) are the state held at the end of the latest
    /// window in the range: each host's latest record of the deployment's
    /// NF counts in the row of the module version it metered; summed over
    /// hosts.
    pub sums: Meters,
    /// Records summed.
    pub records: u64,
    /// The exact sum of the records' `state_byte_ms`: `sums.state_byte_ms`
    /// saturates at `u64::MAX` (about 5,124 GB-hours), which a month of a
    /// few GB held can pass.
    pub state_byte_ms: u128,
}

impl UsageSums {
    /// Adds another row (another NF or version over the same range):
    /// sums, records, and state held.
    pub fn add(&mut self, o: &UsageSums) {
        self.sums.add(&o.sums);
        self.records += o.records;
        self.state_byte_ms = self.state_byte_ms.saturating_add(o.state_byte_ms);
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
            let fixed = "id, tenant_id, deployment_id, host, nf, module, version, digest, window_start_ms, window_end_ms, \
                         received_ms, trap_causes";
            let n = 12 + Meters::COLUMNS.len();
            let slots: Vec<String> = (1..=n).map(|k| format!("?{k}")).collect();
            let sql = format!(
                "INSERT OR IGNORE INTO meters ({fixed}, {}) VALUES ({})",
                Meters::COLUMNS.join(", "),
                slots.join(", ")
            );
            let mut st = tx.prepare_cached(&sql)?;
            for r in recs {
                let mut row: Vec<Value> = vec![
                    Value::Text(r.id.clone()),
                    Value::Text(r.tenant.clone()),
                    Value::Text(r.deployment.clone()),
                    Value::Text(r.host.clone()),
                    Value::Text(r.nf.clone()),
                    Value::Text(r.module.clone()),
                    Value::Text(r.version.clone()),
                    Value::Text(r.digest.clone()),
                    Value::Integer(i(r.window_start_ms)),
                    Value::Integer(i(r.window_end_ms)),
                    Value::Integer(now_ms),
                    Value::Text(serde_json::to_string(&r.meters.trap_causes).unwrap_or_else(|_| "{}".into())),
                ];
                row.extend(r.meters.values().into_iter().map(|v| Value::Integer(i(v))));
                new += st.execute(rusqlite::params_from_iter(row))?;
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
        let counters = Meters::COUNTER_COLUMNS;
        // (`state_byte_ms` is summed in halves above: its full SUM could
        // overflow.)
        let sums: Vec<String> =
            counters.iter().map(|c| if *c == "state_byte_ms" { "0".into() } else { format!("SUM({c})") }).collect();
        let mut st = db.prepare(&format!(
            "SELECT nf, module, version, deployment_id, COUNT(*), SUM(state_byte_ms >> 32), SUM(state_byte_ms & 4294967295),
                    {}
             FROM meters WHERE tenant_id = ?1 AND window_start_ms >= ?2 AND window_start_ms < ?3
             GROUP BY deployment_id, nf, module, version ORDER BY deployment_id, nf, module, version",
            sums.join(", ")
        ))?;
        let rows = st.query_map(params![tenant_id, from_ms, to_ms], |r| {
            let state_byte_ms = (u128::from(u(r.get(5)?)) << 32) + u128::from(u(r.get(6)?));
            let values = (0..counters.len()).map(|k| r.get(7 + k).map(u)).collect::<Result<Vec<u64>, _>>()?;
            let mut sums = Meters::from_values(&values);
            // SQLite's SUM of the 64-bit column could not overflow (see
            // above); the exact figure is `state_byte_ms` of the row.
            sums.state_byte_ms = u64::try_from(state_byte_ms).unwrap_or(u64::MAX);
            Ok(UsageSums {
                nf: r.get(0)?,
                module: r.get(1)?,
                version: r.get(2)?,
                deployment: r.get(3)?,
                sums,
                records: u(r.get(4)?),
                state_byte_ms,
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
                *row.sums.trap_causes.entry(cause).or_default() += n;
            }
        }
        // State held now: each host's latest record of each deployment's
        // NF (whatever version it ran), in the row of that version.
        let mut st = db.prepare(
            "SELECT deployment_id, nf, module, version, table_bytes, flow_state_bytes FROM (
                 SELECT deployment_id, nf, module, version, table_bytes, flow_state_bytes, ROW_NUMBER() OVER (
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
                (u(r.get(4)?), u(r.get(5)?)),
            ))
        })?;
        for h in held {
            let (deployment, nf, module, version, (tables, flows)) = h?;
            if let Some(row) = out
                .iter_mut()
                .find(|u| u.deployment == deployment && u.nf == nf && u.module == module && u.version == version)
            {
                row.sums.table_bytes = row.sums.table_bytes.saturating_add(tables);
                row.sums.flow_state_bytes = row.sums.flow_state_bytes.saturating_add(flows);
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
