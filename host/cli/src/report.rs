//! The run report: the summary people read and the JSON tools read.

use serde::Serialize;
use sluice_runtime::Meters;
use std::collections::BTreeMap;

/// Meters of one NF, summed over workers.
#[derive(Debug, Clone, Serialize)]
pub struct NfReport {
    /// NF name.
    pub name: String,
    /// SHA-256 of the component.
    pub digest: String,
    /// Position in the chain.
    pub position: usize,
    /// Counters (invocations, packets, bytes, cpu_ns, traps and their
    /// causes, ...).
    #[serde(flatten)]
    pub meters: Meters,
    /// The NF's declared state tables at the end of the run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableReport>,
}

/// Most entries of one table written to the report (the largest values).
pub const MAX_REPORTED_ENTRIES: usize = 1000;

/// Most bytes of one byte-table value written to the report: a table's
/// values may be 64 KiB each, a report stays readable.
pub const MAX_REPORTED_VALUE_BYTES: usize = 64;

/// A declared state table at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct TableReport {
    /// The declaration.
    pub spec: sluice_state::TableSpec,
    /// Entries held, summed over workers (eventual: merged entries).
    pub entries: u64,
    /// Eventual tables: the merged values, largest first (at most
    /// [`MAX_REPORTED_ENTRIES`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<(u64, u64)>,
    /// Global byte tables (single-writer and read-only): the entries in
    /// key order, at most [`MAX_REPORTED_ENTRIES`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bytes: Vec<BytesEntry>,
    /// Release tables: the pool's counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<sluice_state::PoolStats>,
}

/// One entry of a byte table in a report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BytesEntry {
    /// The key, hex.
    pub key: String,
    /// The value, hex: its first [`MAX_REPORTED_VALUE_BYTES`] bytes.
    pub value: String,
    /// The value's whole length in bytes.
    pub len: usize,
}

impl BytesEntry {
    /// The first [`MAX_REPORTED_ENTRIES`] of `entries` (sorted by key) as
    /// a report shows them.
    pub fn list(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<BytesEntry> {
        entries
            .iter()
            .take(MAX_REPORTED_ENTRIES)
            .map(|(k, v)| BytesEntry {
                key: hex::encode(k),
                value: hex::encode(v.get(..MAX_REPORTED_VALUE_BYTES).unwrap_or(v)),
                len: v.len(),
            })
            .collect()
    }
}

impl NfReport {
    /// Empty reports for the NFs of a chain, in order.
    pub fn for_chain(specs: &[sluice_runtime::NfSpec]) -> Vec<NfReport> {
        specs
            .iter()
            .enumerate()
            .map(|(i, s)| NfReport {
                name: s.module.name().to_string(),
                digest: s.module.digest().to_string(),
                position: i,
                meters: Meters::default(),
                tables: Vec::new(),
            })
            .collect()
    }
}

/// A structured event, as written to the report.
#[derive(Debug, Clone, Serialize)]
pub struct EventRecord {
    /// Emitting NF.
    pub nf: String,
    /// Event kind.
    pub kind: String,
    /// Level.
    pub level: String,
    /// Packet time.
    pub timestamp_ns: u64,
    /// Flow of the packet, if any.
    pub flow: Option<String>,
    /// Fields.
    pub fields: BTreeMap<String, String>,
}

/// A run's events as its report keeps them: every one counted, in all and
/// by `<nf>/<kind>`, and logged at debug level (`sluice::event`); the
/// first [`MAX_REPORTED_EVENTS`] in packet-time order kept whole.
#[derive(Debug, Default)]
pub struct EventLog {
    /// Events in all.
    pub total: u64,
    /// Events by NF and kind.
    pub by_kind: BTreeMap<String, u64>,
    /// The events kept.
    pub kept: Vec<EventRecord>,
}

impl EventLog {
    /// Counts, logs and keeps `events`.
    pub fn take(&mut self, events: impl IntoIterator<Item = sluice_runtime::EmittedEvent>) {
        for e in events {
            self.total += 1;
            *self.by_kind.entry(format!("{}/{}", e.nf, e.event.kind)).or_default() += 1;
            tracing::debug!(target: "sluice::event", nf = %e.nf, kind = %e.event.kind, flow = ?e.flow, fields = ?e.event.fields, "event");
            if self.kept.len() < MAX_REPORTED_EVENTS {
                self.kept.push(EventRecord::of(e));
            }
        }
    }

    /// Adds another worker's log: the counts summed, the events kept in
    /// packet-time order (the first [`MAX_REPORTED_EVENTS`] of both).
    pub fn merge(&mut self, other: EventLog) {
        self.total += other.total;
        for (kind, n) in other.by_kind {
            *self.by_kind.entry(kind).or_default() += n;
        }
        self.kept.extend(other.kept);
        self.kept.sort_by_key(|e| e.timestamp_ns);
        self.kept.truncate(MAX_REPORTED_EVENTS);
    }
}

/// The summary's line of events by kind (empty without events).
pub fn events_summary(by_kind: &BTreeMap<String, u64>) -> String {
    if by_kind.is_empty() {
        return String::new();
    }
    let kinds: Vec<String> = by_kind.iter().map(|(k, v)| format!("{v} {k}")).collect();
    format!("  events: {}\n", kinds.join(", "))
}

impl EventRecord {
    /// An emitted event as the report writes it.
    pub fn of(e: sluice_runtime::EmittedEvent) -> EventRecord {
        EventRecord {
            nf: e.nf.to_string(),
            kind: e.event.kind,
            level: sluice_runtime::bindings::level_name(e.event.level).into(),
            timestamp_ns: e.timestamp_ns,
            flow: e.flow.map(|k| k.to_string()),
            fields: e.event.fields.into_iter().collect(),
        }
    }
}

/// A hot swap performed during a run.
#[derive(Debug, Clone, Serialize)]
pub struct SwapRecord {
    /// NF swapped.
    pub nf: String,
    /// First packet the new version processed.
    pub at_packet: u64,
    /// SHA-256 of the new version.
    pub digest: String,
    /// `ok`, or why it was refused (the old version kept running).
    pub result: String,
}

/// What reading the input found.
#[derive(Debug, Clone, Serialize)]
pub struct InputReport {
    /// Input file.
    pub path: String,
    /// Records longer than the snap length (kept).
    pub over_snaplen: u64,
    /// Packets skipped for a non-Ethernet interface.
    pub skipped_link_type: u64,
    /// Where the file was cut off, if it was.
    pub truncated_at: Option<u64>,
    /// Why.
    pub truncation_reason: Option<String>,
}

/// Events kept in the report; more are counted only.
pub const MAX_REPORTED_EVENTS: usize = 10_000;

/// The report of one `sluice-host run`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Packets read.
    pub packets_in: u64,
    /// Packets written.
    pub packets_out: u64,
    /// Packets dropped (by NFs or failure policies).
    pub packets_dropped: u64,
    /// Batches formed (NF calls per NF of the chain, per worker, summed).
    pub batches: u64,
    /// Traps over all NFs.
    pub traps: u64,
    /// Worker threads.
    pub workers: usize,
    /// The cores workers were given (`"0-1"`).
    pub cores: String,
    /// The cores each worker ran on, as the OS reported its affinity once
    /// pinned.
    pub worker_cores: Vec<String>,
    /// Packets per batch.
    pub batch_size: usize,
    /// How packets were spread over the workers.
    pub spread: sluice_traffic::Spread,
    /// Wall time of processing (excluding loading and compiling), ns.
    pub wall_ns: u64,
    /// Million packets per second over `wall_ns`.
    pub mpps: f64,
    /// Where the output went.
    pub output: Option<String>,
    /// Input details.
    pub input: InputReport,
    /// Per-NF meters, in chain order.
    pub nfs: Vec<NfReport>,
    /// The chain's order and its own decisions.
    pub chain: ChainReport,
    /// Events emitted in total.
    pub events_total: u64,
    /// Hot swaps, in order.
    pub swaps: Vec<SwapRecord>,
    /// Events by NF and kind (all of them, not only the reported ones).
    pub events_by_kind: BTreeMap<String, u64>,
    /// The first [`MAX_REPORTED_EVENTS`] events.
    pub events: Vec<EventRecord>,
    /// The process's peak resident memory (Linux `VmHWM`), bytes.
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
}

/// This process's peak resident memory in bytes, where the OS tells it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

impl NfReport {
    /// The NF's summary line (every packet is forwarded, dropped or given
    /// the failure policy: `fwd + drop + policy = pkts`), and its traps by
    /// cause if it trapped.
    pub fn summary(&self) -> String {
        let m = &self.meters;
        let per_pkt = if m.packets > 0 { m.cpu_ns as f64 / m.packets as f64 } else { 0.0 };
        let mut s = format!(
            "  [{}] {:<12} {:>9} pkts {:>8} calls  fwd {:>9}  drop {:>9}  policy {:>7}  rewr {:>7}  traps {:>3}  errors {:>3}  {:>7.1} ns/pkt  events {}\n",
            self.position,
            self.name,
            m.packets,
            m.invocations,
            m.forwarded,
            m.dropped,
            m.policy,
            m.rewritten,
            m.traps,
            m.errors,
            per_pkt,
            m.events
        );
        if !m.trap_causes.is_empty() {
            let causes: Vec<String> = m.trap_causes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            s.push_str(&format!("      trap causes: {}; policy applied to {} packets\n", causes.join(", "), m.policy));
        }
        s
    }
}

impl Report {
    /// The human-readable summary.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let secs = self.wall_ns as f64 / 1e9;
        s.push_str(&format!(
            "packets: {} in, {} out, {} dropped | batches: {} | traps: {} | {:.3} Mpps | wall {:.3} s | {} worker(s) on cores {}, batch {}\n",
            self.packets_in,
            self.packets_out,
            self.packets_dropped,
            self.batches,
            self.traps,
            self.mpps,
            secs,
            self.workers,
            self.cores,
            self.batch_size
        ));
        s.push_str(&self.chain.summary());
        for nf in &self.nfs {
            let m = &nf.meters;
            s.push_str(&nf.summary());
            for t in &nf.tables {
                let mode = match t.spec.consistency {
                    sluice_state::Consistency::Local => "local".to_string(),
                    sluice_state::Consistency::Eventual { merge, .. } => format!("eventual/{merge:?}").to_lowercase(),
                    sluice_state::Consistency::Release { .. } => "release".to_string(),
                    sluice_state::Consistency::SingleWriter { .. } => "single-writer".to_string(),
                };
                let scope = match t.spec.scope {
                    sluice_state::Scope::PerFlow => "per-flow",
                    sluice_state::Scope::Global => "global",
                };
                let access = match t.spec.access {
                    sluice_state::Access::ReadOnly => "read-only",
                    sluice_state::Access::ReadWrite => "read-write",
                };
                let kind = match t.spec.kind {
                    sluice_state::Kind::Counter => "counter",
                    sluice_state::Kind::Bytes => "bytes",
                };
                let mut line =
                    format!("      table {:<14} {scope} {access} {kind} {mode}: {} entries", t.spec.name, t.entries);
                if let Some(p) = &t.pool {
                    line.push_str(&format!(
                        " | pool {} held of {}, {} rebalances, {} refused",
                        p.bound, p.size, p.rebalances, p.exhausted
                    ));
                }
                s.push_str(&line);
                s.push('\n');
            }
            if m.table_calls > 0 {
                s.push_str(&format!(
                    "      state: {} calls, {} items, {} errors, {} refused, {} expired, {} bytes held\n",
                    m.table_calls, m.table_ops, m.table_errors, m.table_rejected, m.table_expired, m.table_bytes
                ));
            }
        }
        for sw in &self.swaps {
            s.push_str(&format!(
                "  swap of {} at packet {} to {}: {}\n",
                sw.nf,
                sw.at_packet,
                sw.digest.get(..12).unwrap_or(&sw.digest),
                sw.result
            ));
        }
        s.push_str(&events_summary(&self.events_by_kind));
        if let Some(at) = self.input.truncated_at {
            s.push_str(&format!(
                "  input cut off at byte {at} ({}); packets before it were processed\n",
                self.input.truncation_reason.as_deref().unwrap_or("damaged")
            ));
        }
        if self.input.skipped_link_type > 0 {
            s.push_str(&format!("  skipped {} packets of non-Ethernet interfaces\n", self.input.skipped_link_type));
        }
        if self.input.over_snaplen > 0 {
            s.push_str(&format!("  {} records longer than the snap length (kept)\n", self.input.over_snaplen));
        }
        if let Some(o) = &self.output {
            s.push_str(&format!("output: {o}\n"));
        }
        s
    }
}

impl Report {
    /// What a run of one NF must reproduce besides its output bytes: the
    /// packet counts, the first NF's meters, the events (kind, level,
    /// packet time, flow, fields) and its tables. The conformance suite and
    /// `sluice nf test` compare it as `expected.json`.
    pub fn expected(&self) -> serde_json::Value {
        let Some(nf) = self.nfs.first() else { return serde_json::Value::Null };
        let m = &nf.meters;
        let events: Vec<serde_json::Value> = self
        .events
        .iter()
        .map(|e| serde_json::json!({"kind": e.kind, "level": e.level, "timestamp_ns": e.timestamp_ns, "flow": e.flow, "fields": e.fields}))
        .collect();
        let tables: serde_json::Map<String, serde_json::Value> = nf
            .tables
            .iter()
            .map(|t| {
                let mut table = serde_json::json!({"entries": t.entries, "values": t.values, "pool": t.pool});
                if !t.bytes.is_empty()
                    && let Some(o) = table.as_object_mut()
                {
                    o.insert("bytes".into(), serde_json::json!(t.bytes));
                }
                (t.spec.name.clone(), table)
            })
            .collect();
        serde_json::json!({
            "packets_in": self.packets_in,
            "packets_out": self.packets_out,
            "packets_dropped": self.packets_dropped,
            "meters": {
                "invocations": m.invocations,
                "packets": m.packets,
                "forwarded": m.forwarded,
                "dropped": m.dropped,
                "rewritten": m.rewritten,
                "state_ops": m.state_ops,
                "events": m.events,
                "table_calls": m.table_calls,
                "table_ops": m.table_ops,
                "traps": m.traps,
                "errors": m.errors,
            },
            "events": events,
            "tables": tables,
        })
    }
}

/// How a chain ran packets, and what it decided itself (summed over
/// workers): the `chain` section of the `run` and `dpdk` reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChainReport {
    /// NF names in the order packets from the inside run them.
    pub order: Vec<String>,
    /// Ingress ports whose packets (replies) run the NFs in reverse order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outside_ports: Vec<u16>,
    /// What the NFs saw of fragmented IP: `follow` or `reassemble`.
    pub fragments: sluice_runtime::fragments::FragmentMode,
    /// Bytes of IP fragments held for reassembly when the run ended.
    #[serde(skip_serializing_if = "is_zero")]
    pub reassembly_bytes: u64,
    /// Frames refused and later fragments handled without an NF.
    #[serde(flatten)]
    pub counters: sluice_runtime::ChainCounters,
    /// Flow offload entries made, declined and ended, and the packets that
    /// passed under them (`sluice:nf@0.5.0`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub offload: sluice_runtime::OffloadCounters,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl ChainReport {
    /// The report of the chains of every worker (one per worker, alike).
    pub fn of<'a>(chains: impl IntoIterator<Item = &'a sluice_runtime::Chain>) -> ChainReport {
        let mut r = ChainReport::default();
        for (i, c) in chains.into_iter().enumerate() {
            if i == 0 {
                r.order = c.stages().iter().map(|s| s.name().to_string()).collect();
                r.outside_ports = c.outside().to_vec();
                r.fragments = c.fragment_mode();
            }
            r.counters.add(&c.counters());
            r.offload.add(&c.offload_counters());
            r.reassembly_bytes += c.reassembly_bytes() as u64;
        }
        r
    }

    /// Its summary lines: the reverse order when there is one, and the
    /// chain's own drops when there were any.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        if !self.outside_ports.is_empty() {
            let ports: Vec<String> = self.outside_ports.iter().map(u16::to_string).collect();
            let reverse: Vec<&str> = self.order.iter().rev().map(String::as_str).collect();
            s.push_str(&format!(
                "  order: {} | from port(s) {} (replies): {}\n",
                self.order.join(" -> "),
                ports.join(","),
                reverse.join(" -> ")
            ));
        }
        let c = &self.counters;
        if *c != sluice_runtime::ChainCounters::default() {
            s.push_str(&format!(
                "  chain: refused {} oversize, {} cut short | later fragments: {} followed their first, {} dropped without it\n",
                c.refused_oversize, c.refused_cut_short, c.fragments_followed, c.fragments_unmatched
            ));
        }
        let o = &self.offload;
        if *o != sluice_runtime::OffloadCounters::default() {
            s.push_str(&format!(
                "  offload: {} entries made, {} declined, {} ended | {} packets passed under them without a call\n",
                o.installed, o.declined, o.ended, o.packets
            ));
        }
        if self.fragments == sluice_runtime::fragments::FragmentMode::Reassemble {
            s.push_str(&format!(
                "  reassembly: {} datagrams from their fragments ({} held) | fragments refused {}, discarded {} | {} bytes still held\n",
                c.datagrams_reassembled, c.fragments_held, c.fragments_refused, c.fragments_discarded, self.reassembly_bytes
            ));
        }
        s
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
