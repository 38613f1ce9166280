//! Every metric Sluice records, declared once with its name, unit and
//! description. They are recorded through the global meter (see
//! [`crate::start`]): with no meter provider installed, recording costs a
//! call into a no-op.
//!
//! Attributes are bounded: `tenant`, `deployment`, `nf`, `version` and
//! `host` (and `cause`, `port`, `route`, `status` where named), never a
//! flow key. NF counters are added once per meter window, never per
//! packet; the guest-time histogram takes one value per batch.
//!
//! In Prometheus, dots become underscores, counters end in `_total` and a
//! unit other than a `{count}` is appended: `sluice.nf.packets` is
//! `sluice_nf_packets_total`, `sluice.nf.guest.time` is
//! `sluice_nf_guest_time_seconds`.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, ObservableCounter, ObservableGauge};
use sluice_meters::Meters;
use std::sync::{Arc, OnceLock};

fn meter() -> Meter {
    opentelemetry::global::meter("sluice")
}

static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a meter provider collects the metrics (set by
/// [`crate::start`]): callers skip per-batch work when it does not.
pub fn enabled() -> bool {
    ENABLED.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn set_enabled() {
    ENABLED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The attributes of one NF of one deployment on one host.
pub fn nf_attributes(tenant: &str, deployment: &str, nf: &str, version: &str, host: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("tenant", tenant.to_string()),
        KeyValue::new("deployment", deployment.to_string()),
        KeyValue::new("nf", nf.to_string()),
        KeyValue::new("version", version.to_string()),
        KeyValue::new("host", host.to_string()),
    ]
}

/// The metrics of NFs on a host.
#[derive(Debug)]
pub struct NfMetrics {
    /// `sluice.nf.packets`: packets handed to the NF.
    pub packets: Counter<u64>,
    /// `sluice.nf.packets.forwarded`: packets the NF forwarded or labelled.
    pub forwarded: Counter<u64>,
    /// `sluice.nf.packets.dropped`: packets the NF dropped.
    pub dropped: Counter<u64>,
    /// `sluice.nf.packets.rewritten`: packets the NF rewrote.
    pub rewritten: Counter<u64>,
    /// `sluice.nf.packets.policy`: packets whose verdict came from the
    /// failure policy (the NF trapped or failed on their batch).
    pub policy: Counter<u64>,
    /// `sluice.nf.received` (bytes): bytes handed to the NF.
    pub bytes: Counter<u64>,
    /// `sluice.nf.invocations`: calls into the NF (one per batch).
    pub invocations: Counter<u64>,
    /// `sluice.nf.traps`, by `cause`.
    pub traps: Counter<u64>,
    /// `sluice.nf.instantiations`: instances created (the first, and one
    /// after each trap).
    pub instantiations: Counter<u64>,
    /// `sluice.nf.state.rejections`: state items refused (size, capacity,
    /// budget, exhausted pool).
    pub state_rejected: Counter<u64>,
    /// `sluice.nf.state.expiries`: table entries removed for idleness.
    pub state_expired: Counter<u64>,
    /// `sluice.nf.events`: events the NF emitted.
    pub events: Counter<u64>,
    /// `sluice.nf.log.dropped`: log lines over the NF's rate.
    pub log_dropped: Counter<u64>,
    /// `sluice.nf.state.size` (bytes): state held (flow state and tables).
    pub state_bytes: Gauge<u64>,
    /// `sluice.nf.state.entries`: flows with state and table entries held.
    pub state_entries: Gauge<u64>,
    /// `sluice.nf.guest.time` (s): time inside the NF per batch.
    pub guest_time: Histogram<f64>,
}

/// The NF metrics.
pub fn nf() -> &'static NfMetrics {
    static M: OnceLock<NfMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = meter();
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            m.u64_counter(name).with_unit(unit).with_description(description).build()
        };
        NfMetrics {
            packets: counter("sluice.nf.packets", "{packet}", "Packets handed to the NF"),
            forwarded: counter("sluice.nf.packets.forwarded", "{packet}", "Packets the NF forwarded or labelled"),
            dropped: counter("sluice.nf.packets.dropped", "{packet}", "Packets the NF dropped"),
            rewritten: counter("sluice.nf.packets.rewritten", "{packet}", "Packets the NF rewrote"),
            policy: counter(
                "sluice.nf.packets.policy",
                "{packet}",
                "Packets whose verdict came from the NF's failure policy (it trapped or failed on their batch)",
            ),
            bytes: counter("sluice.nf.received", "By", "Bytes handed to the NF"),
            invocations: counter("sluice.nf.invocations", "{call}", "Calls into the NF, one per batch"),
            traps: counter("sluice.nf.traps", "{trap}", "Traps of the NF, by cause"),
            instantiations: counter(
                "sluice.nf.instantiations",
                "{instance}",
                "Instances of the NF created: the first, and one after each trap",
            ),
            state_rejected: counter(
                "sluice.nf.state.rejections",
                "{item}",
                "State items refused for size, capacity, memory budget or an exhausted pool",
            ),
            state_expired: counter("sluice.nf.state.expiries", "{entry}", "Table entries removed for idleness"),
            events: counter("sluice.nf.events", "{event}", "Events the NF emitted"),
            log_dropped: counter("sluice.nf.log.dropped", "{line}", "Log lines of the NF over its rate, dropped"),
            state_bytes: m
                .u64_gauge("sluice.nf.state.size")
                .with_unit("By")
                .with_description("State the NF holds: flow state and tables")
                .build(),
            state_entries: m
                .u64_gauge("sluice.nf.state.entries")
                .with_unit("{entry}")
                .with_description("Flows with state and table entries the NF holds")
                .build(),
            guest_time: m
                .f64_histogram("sluice.nf.guest.time")
                .with_unit("s")
                .with_description("Time inside the NF per batch")
                .with_boundaries(vec![
                    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
                ])
                .build(),
        }
    })
}

impl NfMetrics {
    /// Adds one meter window of one NF (`w`: what it counted in the
    /// window, `attrs` from [`nf_attributes`]) and the state it holds now
    /// (bytes, and flows with state plus table entries); the gauges also
    /// name the host's `worker`, if the NF runs on one (each worker holds
    /// its own state: sum them).
    pub fn record_window(
        &self,
        attrs: &[KeyValue],
        worker: Option<&KeyValue>,
        w: &Meters,
        state_bytes: u64,
        state_entries: u64,
    ) {
        let add = |c: &Counter<u64>, n: u64| {
            if n > 0 {
                c.add(n, attrs);
            }
        };
        add(&self.packets, w.packets);
        add(&self.forwarded, w.forwarded);
        add(&self.dropped, w.dropped);
        add(&self.rewritten, w.rewritten);
        add(&self.policy, w.policy);
        add(&self.bytes, w.bytes);
        add(&self.invocations, w.invocations);
        add(&self.instantiations, w.instantiations);
        add(&self.state_rejected, w.all_state_rejected());
        add(&self.state_expired, w.table_expired);
        add(&self.events, w.events);
        add(&self.log_dropped, w.log_dropped);
        for (cause, n) in &w.trap_causes {
            let mut a = attrs.to_vec();
            a.push(KeyValue::new("cause", cause.clone()));
            self.traps.add(*n, &a);
        }
        let mut gauge = attrs.to_vec();
        gauge.extend(worker.cloned());
        self.state_bytes.record(state_bytes, &gauge);
        self.state_entries.record(state_entries, &gauge);
    }
}

/// Counters of a host's own decisions about a deployment's traffic.
#[derive(Debug)]
pub struct DeploymentMetrics {
    /// `sluice.deployment.packets.over_share`: packets not run because the
    /// tenant was over its share of a contended core.
    pub over_share: Counter<u64>,
    /// `sluice.deployment.packets.refused`: packets its chain dropped before
    /// any NF saw them, by `reason` (`oversize`, `cut_short`,
    /// `fragment_unmatched`, `fragment_refused`, `fragment_discarded`).
    pub refused: Counter<u64>,
    /// `sluice.deployment.packets.fragments_followed`: later IP fragments
    /// that got their first fragment's fate without an NF.
    pub fragments_followed: Counter<u64>,
    /// `sluice.deployment.datagrams.reassembled`: IP datagrams put back
    /// together from their fragments before the NFs saw them.
    pub reassembled: Counter<u64>,
}

/// The deployment metrics.
pub fn deployment() -> &'static DeploymentMetrics {
    static M: OnceLock<DeploymentMetrics> = OnceLock::new();
    M.get_or_init(|| DeploymentMetrics {
        over_share: meter()
            .u64_counter("sluice.deployment.packets.over_share")
            .with_unit("{packet}")
            .with_description("Packets not run because the deployment's tenant was over its share of a contended core")
            .build(),
        refused: meter()
            .u64_counter("sluice.deployment.packets.refused")
            .with_unit("{packet}")
            .with_description(
                "Packets the deployment's chain dropped before any NF saw them: longer than 65,535 bytes (oversize), \
                 shorter than their IP datagram (cut_short), later fragments without their first (fragment_unmatched), \
                 fragments not taken for reassembly (fragment_refused) or held and thrown away (fragment_discarded)",
            )
            .build(),
        fragments_followed: meter()
            .u64_counter("sluice.deployment.packets.fragments_followed")
            .with_unit("{packet}")
            .with_description("Later IP fragments that got their first fragment's fate and rewrites without an NF")
            .build(),
        reassembled: meter()
            .u64_counter("sluice.deployment.datagrams.reassembled")
            .with_unit("{datagram}")
            .with_description("IP datagrams reassembled from their fragments before the deployment's NFs saw them")
            .build(),
    })
}

/// One port's device counters (cumulative).
#[derive(Debug, Clone, Default)]
pub struct PortReading {
    pub port: u16,
    pub name: String,
    pub received: u64,
    pub sent: u64,
    /// Dropped with the receive ring full (`net_af_packet`: the kernel's
    /// drops at its sockets' rings).
    pub missed: u64,
    pub no_mbuf: u64,
    pub receive_errors: u64,
    /// Taken to send but not sent (`net_af_packet`: with the frames the
    /// kernel refused as too long for the interface's MTU).
    pub send_errors: u64,
}

/// What a host reads off itself when its metrics are collected.
#[derive(Debug, Clone, Default)]
pub struct HostReading {
    pub ports: Vec<PortReading>,
    /// Packets no deployment's attachment took (cumulative).
    pub unmatched: u64,
    /// Meter records waiting in the outbox.
    pub outbox: u64,
    /// Seconds since the last heartbeat was published.
    pub heartbeat_age: f64,
    /// Deployments running.
    pub deployments: u64,
}

/// A host's observed metrics; they are collected while this is alive.
#[derive(Debug)]
pub struct HostMetrics {
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: Vec<ObservableGauge<u64>>,
    _age: ObservableGauge<f64>,
}

/// Registers the host's observed metrics: `read` is called when they are
/// collected (a Prometheus scrape, an OTLP export), never on the packet
/// path. Names: `sluice.host.port.received`, `.sent`, `.missed`,
/// `.no_mbuf`, `.receive_errors`, `.send_errors` (by `port` and
/// `device`), `sluice.host.unmatched`, `sluice.host.outbox.depth`,
/// `sluice.host.heartbeat.age`, `sluice.host.deployments`.
pub fn host(host: &str, read: impl Fn() -> HostReading + Send + Sync + 'static) -> HostMetrics {
    let m = meter();
    let read = Arc::new(read);
    let host_attr = KeyValue::new("host", host.to_string());
    type PortField = fn(&PortReading) -> u64;
    let ports: [(&'static str, &'static str, PortField); 6] = [
        ("sluice.host.port.received", "Packets the port received", |p| p.received),
        ("sluice.host.port.sent", "Packets the port sent", |p| p.sent),
        (
            "sluice.host.port.missed",
            "Packets the port dropped with its receive ring full (net_af_packet: the kernel socket ring's drops)",
            |p| p.missed,
        ),
        ("sluice.host.port.no_mbuf", "Receive buffer allocation failures of the port", |p| p.no_mbuf),
        ("sluice.host.port.receive_errors", "Receive errors of the port", |p| p.receive_errors),
        (
            "sluice.host.port.send_errors",
            "Packets the port took to send but did not send (net_af_packet: with those the kernel refused)",
            |p| p.send_errors,
        ),
    ];
    let mut counters = Vec::new();
    for (name, description, field) in ports {
        let (r, h) = (read.clone(), host_attr.clone());
        counters.push(
            m.u64_observable_counter(name)
                .with_unit("{packet}")
                .with_description(description)
                .with_callback(move |o| {
                    for p in r().ports {
                        let attrs = [
                            h.clone(),
                            KeyValue::new("port", i64::from(p.port)),
                            KeyValue::new("device", p.name.clone()),
                        ];
                        o.observe(field(&p), &attrs);
                    }
                })
                .build(),
        );
    }
    let (r, h) = (read.clone(), host_attr.clone());
    counters.push(
        m.u64_observable_counter("sluice.host.unmatched")
            .with_unit("{packet}")
            .with_description("Packets no deployment's attachment took")
            .with_callback(move |o| o.observe(r().unmatched, std::slice::from_ref(&h)))
            .build(),
    );
    let mut gauges = Vec::new();
    let (r, h) = (read.clone(), host_attr.clone());
    gauges.push(
        m.u64_observable_gauge("sluice.host.outbox.depth")
            .with_unit("{record}")
            .with_description("Meter records waiting in the host's outbox to be published")
            .with_callback(move |o| o.observe(r().outbox, std::slice::from_ref(&h)))
            .build(),
    );
    let (r, h) = (read.clone(), host_attr.clone());
    gauges.push(
        m.u64_observable_gauge("sluice.host.deployments")
            .with_unit("{deployment}")
            .with_description("Deployments running on the host")
            .with_callback(move |o| o.observe(r().deployments, std::slice::from_ref(&h)))
            .build(),
    );
    let (r, h) = (read, host_attr);
    let age = m
        .f64_observable_gauge("sluice.host.heartbeat.age")
        .with_unit("s")
        .with_description("Time since the host last published its heartbeat")
        .with_callback(move |o| o.observe(r().heartbeat_age, std::slice::from_ref(&h)))
        .build();
    HostMetrics { _counters: counters, _gauges: gauges, _age: age }
}

/// The gateway's metrics.
#[derive(Debug)]
pub struct GatewayMetrics {
    /// `sluice.gateway.requests`: HTTP requests by `route` (the route's
    /// pattern), `method` and `status`.
    pub requests: Counter<u64>,
    /// `sluice.gateway.request.duration` (s): time to answer, by `route`.
    pub request_duration: Histogram<f64>,
    /// `sluice.gateway.meter.records`: meter records stored, by `tenant`.
    pub meter_records: Counter<u64>,
    /// `sluice.gateway.meter.lag`: meter records published but not yet
    /// stored (the meter consumer's pending count).
    pub meter_lag: Gauge<u64>,
    /// `sluice.gateway.deployments`: deployments by `status`.
    pub deployments: Gauge<u64>,
    /// `sluice.gateway.hosts`: hosts heard from, by `group`.
    pub hosts: Gauge<u64>,
    /// `sluice.gateway.rejects`: messages from hosts the gateway refused
    /// (`GET /v1/rejects`), by `kind` (`meter`, `event`, `heartbeat`) and
    /// `host`.
    pub rejects: Counter<u64>,
}

/// The gateway's metrics.
pub fn gateway() -> &'static GatewayMetrics {
    static M: OnceLock<GatewayMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = meter();
        GatewayMetrics {
            requests: m
                .u64_counter("sluice.gateway.requests")
                .with_unit("{request}")
                .with_description("HTTP requests answered, by route, method and status")
                .build(),
            request_duration: m
                .f64_histogram("sluice.gateway.request.duration")
                .with_unit("s")
                .with_description("Time to answer an HTTP request, by route")
                .with_boundaries(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
                .build(),
            meter_records: m
                .u64_counter("sluice.gateway.meter.records")
                .with_unit("{record}")
                .with_description("Meter records stored, by tenant")
                .build(),
            meter_lag: m
                .u64_gauge("sluice.gateway.meter.lag")
                .with_unit("{record}")
                .with_description("Meter records published by hosts and not yet stored")
                .build(),
            deployments: m
                .u64_gauge("sluice.gateway.deployments")
                .with_unit("{deployment}")
                .with_description("Deployments, by status")
                .build(),
            hosts: m
                .u64_gauge("sluice.gateway.hosts")
                .with_unit("{host}")
                .with_description("Hosts alive, by group")
                .build(),
            rejects: m
                .u64_counter("sluice.gateway.rejects")
                .with_unit("{message}")
                .with_description(
                    "Messages from hosts the gateway refused (meter records, events, heartbeats), by kind and host",
                )
                .build(),
        }
    })
}
