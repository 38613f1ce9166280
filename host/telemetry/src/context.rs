//! W3C trace context across processes: the control plane carries it in
//! NATS message headers (`traceparent`, `tracestate`) so that an API
//! request, the write it makes and the hosts' work on it form one trace.
//! With no trace exporter running, nothing is injected and extracted
//! contexts are empty.

use opentelemetry::propagation::{Extractor, Injector};
use std::collections::BTreeMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Trace-context fields by header name (lower case).
pub type Carrier = BTreeMap<String, String>;

static RECORDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether traces are exported (set by [`crate::start`]): callers skip
/// opening spans when they are not.
pub fn recording() -> bool {
    RECORDING.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn set_recording() {
    RECORDING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The W3C fields of `headers` (name, value) worth keeping: `traceparent`
/// and `tracestate`, each at most 512 bytes.
pub fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Carrier {
    headers
        .into_iter()
        .filter(|(k, v)| {
            (k.eq_ignore_ascii_case("traceparent") || k.eq_ignore_ascii_case("tracestate"))
                && !v.is_empty()
                && v.len() <= 512
        })
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect()
}

struct Writer<'a>(&'a mut Carrier);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_ascii_lowercase(), value);
    }
}

struct Reader<'a>(&'a Carrier);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(&key.to_ascii_lowercase()).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// The fields that continue the current span's trace elsewhere (empty
/// when no trace is being recorded).
pub fn current() -> Carrier {
    let cx = tracing::Span::current().context();
    let mut out = Carrier::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut Writer(&mut out)));
    out
}

/// Makes `span` a child of the trace `carrier` continues (if it names one).
/// Call it before the span is entered.
pub fn set_parent(span: &tracing::Span, carrier: &Carrier) {
    if carrier.is_empty() {
        return;
    }
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Reader(carrier)));
    let _ = span.set_parent(cx);
}

/// The OpenTelemetry context of `span`, to start a later span under it
/// (see [`start_under`]) without keeping `span` open.
pub fn of(span: &tracing::Span) -> opentelemetry::Context {
    span.context()
}

/// Makes `span` a child of `parent` (a context from [`of`]).
pub fn start_under(span: &tracing::Span, parent: &opentelemetry::Context) {
    let _ = span.set_parent(parent.clone());
}
