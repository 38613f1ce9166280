//! The events an instance hands the host ([`EmittedEvent`]): the NF's own,
//! stamped with their flow and time, its log lines kept for its tenant
//! ([`LOG_EVENT`]) and its traps ([`TRAP_EVENT`]).

use super::NfInstance;
use crate::bindings::{Event, Level};
use std::sync::Arc;

/// Kind of the events that carry an NF's log lines to its tenant (fields
/// `message`, `source`: `stdout`, `stderr` or `host-log`).
pub const LOG_EVENT: &str = "sluice.log";
/// Kind of the events that tell a tenant its NF trapped (fields `cause`,
/// `message`, `policy`, `traps`: the NF's traps so far on this worker).
pub const TRAP_EVENT: &str = "sluice.trap";

/// Wall-clock time, ns since the Unix epoch.
pub(super) fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The event level of a log line's level name.
fn level_of(name: &str) -> Level {
    match name {
        "debug" => Level::Debug,
        "warn" => Level::Warn,
        "error" => Level::Error,
        _ => Level::Info,
    }
}

/// An event with the host's stamp.
#[derive(Debug, Clone)]
pub struct EmittedEvent {
    /// NF that emitted it.
    pub nf: Arc<str>,
    /// The event.
    pub event: Event,
    /// Flow of the packet it names, if any.
    pub flow: Option<sluice_wire::FlowKey>,
    /// Timestamp of that packet (or of the batch's last packet).
    pub timestamp_ns: u64,
}

impl NfInstance {
    /// Takes the events emitted since the last call, with the NF's log
    /// lines kept for its tenant as events of kind [`LOG_EVENT`].
    pub fn drain_events(&mut self) -> Vec<EmittedEvent> {
        let lines = self.log_limiter.lock().take_kept();
        if !lines.is_empty() {
            let now = wall_ns();
            for line in lines {
                self.events.push(EmittedEvent {
                    nf: self.name.clone(),
                    event: Event {
                        kind: LOG_EVENT.into(),
                        level: level_of(line.level),
                        packet: None,
                        fields: vec![("message".into(), line.text), ("source".into(), line.source.into())],
                    },
                    flow: None,
                    timestamp_ns: now,
                });
            }
        }
        std::mem::take(&mut self.events)
    }
}
