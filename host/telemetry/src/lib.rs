//! How Sluice's binaries (`sluice-gateway`, `sluice-host`, `sluice dev`)
//! report on themselves.
//!
//! **Logs** go to stderr, one event a line:
//! - `SLUICE_LOG` filters them (`tracing` `EnvFilter` syntax: `info`,
//!   `warn,sluice_agent=debug`, …); each binary names its default.
//! - `SLUICE_LOG_FORMAT` picks the line format: `text` (default, for
//!   people; coloured only on a terminal without `NO_COLOR`) or `json` (one JSON object a line, for log shippers: `timestamp`,
//!   `level`, `target`, `fields` with `message` and the event's fields, and
//!   the spans it happened in).
//!
//! **OpenTelemetry** export over OTLP is switched on by the standard
//! variables and costs nothing when they are unset: a signal (traces,
//! metrics, logs) is exported when `OTEL_EXPORTER_OTLP_ENDPOINT` or its
//! own `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT` is set and
//! `OTEL_<SIGNAL>_EXPORTER` is not `none`; `OTEL_SDK_DISABLED=true` turns
//! all of it off. `OTEL_EXPORTER_OTLP_PROTOCOL` picks `http/protobuf`
//! (default) or `grpc`; `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
//! `OTEL_METRIC_EXPORT_INTERVAL` and `OTEL_BSP_*` work as everywhere.
//! The resource is `OTEL_SERVICE_NAME` (else the binary's name), the
//! attributes of `OTEL_RESOURCE_ATTRIBUTES`, and the cluster, group and
//! host the process serves (`sluice.cluster`, `sluice.group`,
//! `host.name`).
//!
//! **Metrics** ([`metrics`]) are declared once and recorded through the
//! global meter; a process that asks for it also keeps a Prometheus
//! registry ([`Prometheus`]) that its `/metrics` endpoint renders.
//!
//! [`Telemetry::shutdown`] flushes what is buffered: the binaries call it
//! when they stop (SIGTERM included).

pub mod context;
pub mod metrics;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterExt, Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The log line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours when stderr is a terminal).
    Text,
    /// One JSON object a line.
    Json,
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `SLUICE_LOG_FORMAT` names no format.
    #[error("SLUICE_LOG_FORMAT='{0}' is not a log format: use `text` or `json`")]
    Format(String),
    /// `SLUICE_LOG` is not a filter.
    #[error("SLUICE_LOG='{value}' is not a log filter ({reason}): use e.g. `info` or `warn,sluice_agent=debug`")]
    Filter { value: String, reason: String },
    /// A logger was already installed in this process.
    #[error("logging was already started in this process")]
    AlreadyStarted,
    /// An OTLP exporter could not be built from the `OTEL_*` variables.
    #[error(
        "cannot export {signal} over OTLP ({reason}): check OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_PROTOCOL"
    )]
    Export { signal: &'static str, reason: String },
    /// The Prometheus registry could not be set up.
    #[error("cannot set up the Prometheus registry: {0}")]
    Prometheus(String),
    /// The exporters' background runtime could not start.
    #[error("cannot start the telemetry export thread: {0}")]
    Runtime(std::io::Error),
}

impl LogFormat {
    /// Reads a format name (`text` or `json`, any case).
    pub fn parse(s: &str) -> Result<Self, TelemetryError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(TelemetryError::Format(s.to_string())),
        }
    }
}

/// The filter for `value` (`SLUICE_LOG`), or `default` when unset.
pub fn filter(value: Option<&str>, default: &str) -> Result<EnvFilter, TelemetryError> {
    match value {
        None => Ok(EnvFilter::new(default)),
        Some(v) => {
            EnvFilter::try_new(v).map_err(|e| TelemetryError::Filter { value: v.to_string(), reason: e.to_string() })
        }
    }
}

/// Starts logging to stderr as `SLUICE_LOG` and `SLUICE_LOG_FORMAT` say,
/// with `default` as the filter when `SLUICE_LOG` is unset; nothing is
/// exported (for commands that run once, like `sluice-host run`).
pub fn init_logs(default: &str) -> Result<(), TelemetryError> {
    start(Settings { log_default: default, ..Settings::default() }).map(drop)
}

/// What a process reports and as whom.
#[derive(Debug, Clone, Default)]
pub struct Settings<'a> {
    /// `service.name` unless `OTEL_SERVICE_NAME` is set (empty: no
    /// export even when the variables ask for it).
    pub service: &'a str,
    /// The log filter when `SLUICE_LOG` is unset.
    pub log_default: &'a str,
    /// Resource attributes naming what the process serves (cluster,
    /// group, host).
    pub attributes: Vec<(&'static str, String)>,
    /// Whether to keep a Prometheus registry of the metrics.
    pub prometheus: bool,
}

/// Which signals the `OTEL_*` variables ask to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Signals {
    /// Traces.
    pub traces: bool,
    /// Metrics.
    pub metrics: bool,
    /// Logs.
    pub logs: bool,
}

impl Signals {
    /// Reads the standard variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Signals::default();
        }
        let any = set("OTEL_EXPORTER_OTLP_ENDPOINT");
        let on = |signal: &str| {
            let chosen = var(&format!("OTEL_{signal}_EXPORTER")).map(|v| v.trim().to_ascii_lowercase());
            (any || set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))) && !matches!(chosen.as_deref(), Some("none"))
        };
        Signals { traces: on("TRACES"), metrics: on("METRICS"), logs: on("LOGS") }
    }

    /// Whether any signal is exported.
    pub fn any(&self) -> bool {
        self.traces || self.metrics || self.logs
    }
}

/// The Prometheus registry of a process's metrics (cheap to clone).
#[derive(Debug, Clone)]
pub struct Prometheus {
    registry: prometheus::Registry,
}

impl Prometheus {
    /// The metrics in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let encoder = prometheus::TextEncoder::new();
        match encoder.encode_to_string(&self.registry.gather()) {
            Ok(text) => text,
            Err(e) => format!("# the metrics could not be encoded: {e}\n"),
        }
    }

    /// The content type of [`render`](Self::render)'s text.
    pub const CONTENT_TYPE: &'static str = "text/plain; version=0.0.4; charset=utf-8";
}

/// What runs for a process's telemetry; [`shutdown`](Self::shutdown)
/// flushes it.
#[derive(Debug, Default)]
pub struct Telemetry {
    prometheus: Option<Prometheus>,
    meters: Option<SdkMeterProvider>,
    tracer: Option<SdkTracerProvider>,
    logger: Option<SdkLoggerProvider>,
    /// Runs the OTLP exporters' network I/O (gRPC needs a runtime).
    runtime: Option<tokio::runtime::Runtime>,
    signals: Signals,
}

/// Starts logging as [`init_logs`] does, OTLP export as the `OTEL_*`
/// variables ask (see the crate docs), and the Prometheus registry if
/// `settings.prometheus`; installs the global meter and tracer providers
/// and the W3C trace-context propagator.
pub fn start(settings: Settings<'_>) -> Result<Telemetry, TelemetryError> {
    let var = |name: &str| std::env::var(name).ok();
    let format = LogFormat::parse(var("SLUICE_LOG_FORMAT").as_deref().unwrap_or("text"))?;
    let log_filter = || filter(var("SLUICE_LOG").as_deref(), settings.log_default);
    let signals =
        if settings.service.is_empty() { Signals::default() } else { Signals::from_vars(|n| std::env::var(n).ok()) };
    let mut t = Telemetry { signals, ..Telemetry::default() };
    let resource = resource(&settings);
    if signals.any() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .map_err(TelemetryError::Runtime)?;
        // The exporters' clients bind to the runtime they are built in;
        // the HTTP one must not be built on an async thread, so all are
        // built on a plain thread inside the export runtime's context.
        let handle = runtime.handle().clone();
        let built = std::thread::scope(|s| {
            s.spawn(|| {
                let _in = handle.enter();
                build_exporters(signals, &resource)
            })
            .join()
        });
        let (tracer, logger, metric_exporter) = match built {
            Ok(r) => r?,
            Err(_) => {
                return Err(TelemetryError::Export { signal: "telemetry", reason: "the exporter setup failed".into() });
            }
        };
        t.tracer = tracer;
        t.logger = logger;
        t.runtime = Some(runtime);
        if let Some(e) = metric_exporter {
            t.meters = Some(meter_provider(&resource, settings.prometheus, Some(e), &mut t.prometheus)?);
        }
    }
    if t.meters.is_none() && settings.prometheus {
        t.meters = Some(meter_provider(&resource, true, None, &mut t.prometheus)?);
    }
    if let Some(m) = &t.meters {
        opentelemetry::global::set_meter_provider(m.clone());
        metrics::set_enabled();
    }
    if let Some(tp) = &t.tracer {
        opentelemetry::global::set_tracer_provider(tp.clone());
        context::set_recording();
    }
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());

    // One subscriber: the stderr lines, and what OTLP exports.
    type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;
    let mut layers: Vec<Boxed> = Vec::new();
    // Colours only for a person at a terminal (and not with NO_COLOR).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(colour);
    layers.push(match format {
        LogFormat::Text => lines.with_filter(log_filter()?).boxed(),
        LogFormat::Json => lines.json().with_current_span(true).with_span_list(true).with_filter(log_filter()?).boxed(),
    });
    if let Some(tp) = &t.tracer {
        // Spans are the control plane's own (info and above, Sluice's
        // crates): none is opened on the per-packet path.
        let spans = Targets::new().with_target("sluice", tracing::Level::INFO);
        layers.push(tracing_opentelemetry::layer().with_tracer(tp.tracer("sluice")).with_filter(spans).boxed());
    }
    if let Some(lp) = &t.logger {
        // The exporters' own logs must not feed back into themselves.
        let not_export = filter_fn(|m| {
            !["opentelemetry", "hyper", "h2", "tonic", "tower", "reqwest"].iter().any(|p| m.target().starts_with(p))
        });
        let bridge = opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge::new(lp);
        layers.push(bridge.with_filter(log_filter()?.and(not_export)).boxed());
    }
    tracing_subscriber::registry().with(layers).try_init().map_err(|_| TelemetryError::AlreadyStarted)?;
    Ok(t)
}

fn resource(settings: &Settings<'_>) -> Resource {
    let mut b = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() && !settings.service.is_empty() {
        b = b.with_service_name(settings.service.to_string());
    }
    b.with_attributes(settings.attributes.iter().map(|(k, v)| KeyValue::new(*k, v.clone()))).build()
}

type Built = (Option<SdkTracerProvider>, Option<SdkLoggerProvider>, Option<opentelemetry_otlp::MetricExporter>);

fn build_exporters(signals: Signals, resource: &Resource) -> Result<Built, TelemetryError> {
    let failed = |signal: &'static str| {
        move |e: opentelemetry_otlp::ExporterBuildError| TelemetryError::Export { signal, reason: e.to_string() }
    };
    let tracer = if signals.traces {
        let e = opentelemetry_otlp::SpanExporter::builder().build().map_err(failed("traces"))?;
        Some(SdkTracerProvider::builder().with_resource(resource.clone()).with_batch_exporter(e).build())
    } else {
        None
    };
    let logger = if signals.logs {
        let e = opentelemetry_otlp::LogExporter::builder().build().map_err(failed("logs"))?;
        Some(SdkLoggerProvider::builder().with_resource(resource.clone()).with_batch_exporter(e).build())
    } else {
        None
    };
    let metrics = if signals.metrics {
        Some(opentelemetry_otlp::MetricExporter::builder().build().map_err(failed("metrics"))?)
    } else {
        None
    };
    Ok((tracer, logger, metrics))
}

fn meter_provider(
    resource: &Resource,
    prometheus: bool,
    otlp: Option<opentelemetry_otlp::MetricExporter>,
    registry: &mut Option<Prometheus>,
) -> Result<SdkMeterProvider, TelemetryError> {
    let mut b = SdkMeterProvider::builder().with_resource(resource.clone());
    if prometheus {
        let r = prometheus::Registry::new();
        let reader = opentelemetry_prometheus::exporter()
            .with_registry(r.clone())
            .scope_info_enabled(false)
            .build()
            .map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
        b = b.with_reader(reader);
        *registry = Some(Prometheus { registry: r });
    }
    if let Some(e) = otlp {
        b = b.with_periodic_exporter(e);
    }
    Ok(b.build())
}

impl Telemetry {
    /// The Prometheus registry, if one was asked for.
    pub fn prometheus(&self) -> Option<Prometheus> {
        self.prometheus.clone()
    }

    /// What is exported over OTLP.
    pub fn signals(&self) -> Signals {
        self.signals
    }

    /// Exports what is buffered and stops the exporters (waits at most the
    /// exporters' timeouts). Errors are reported on stderr: the process is
    /// stopping anyway.
    pub fn shutdown(mut self) {
        if let Some(tp) = self.tracer.take()
            && let Err(e) = tp.shutdown()
        {
            eprintln!("warning: flushing the traces: {e}");
        }
        if let Some(m) = self.meters.take()
            && self.signals.metrics
            && let Err(e) = m.shutdown()
        {
            eprintln!("warning: flushing the metrics: {e}");
        }
        if let Some(lp) = self.logger.take()
            && let Err(e) = lp.shutdown()
        {
            eprintln!("warning: flushing the logs: {e}");
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn formats_and_filters_are_read_or_refused_with_the_reason() {
        assert_eq!(LogFormat::parse("JSON").unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::parse("text").unwrap(), LogFormat::Text);
        let e = LogFormat::parse("xml").unwrap_err().to_string();
        assert!(e.contains("'xml'") && e.contains("json"), "{e}");
        assert!(filter(Some("warn,sluice_agent=debug"), "info").is_ok());
        let e = filter(Some("info,[[["), "info").unwrap_err().to_string();
        assert!(e.contains("SLUICE_LOG='info,[[['"), "{e}");
        assert_eq!(filter(None, "warn").unwrap().to_string(), "warn");
    }

    #[test]
    fn signals_follow_the_standard_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
        };
        assert!(!Signals::from_vars(vars(&[])).any());
        let all = Signals::from_vars(vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]));
        assert_eq!(all, Signals { traces: true, metrics: true, logs: true });
        let traces = Signals::from_vars(vars(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")]));
        assert_eq!(traces, Signals { traces: true, metrics: false, logs: false });
        let no_logs = Signals::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_LOGS_EXPORTER", "none"),
        ]));
        assert_eq!(no_logs, Signals { traces: true, metrics: true, logs: false });
        let off = Signals::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]));
        assert!(!off.any());
    }
}
