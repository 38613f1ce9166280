//! A stateful 5-tuple firewall.
//!
//! Ordered allow/deny rules over protocol, source/destination CIDR and port
//! ranges decide the first packet of a connection; the decision to allow is
//! remembered in host-owned per-flow state so that replies pass without a
//! rule of their own. TCP connections open on SYN and close on RST, or after
//! FINs from both sides and the final ACK. See README.md for the config.

mod rules;

pub use rules::{Action, Config, Rule};

use sluice_sdk::state::{Counters, Merge, StateError, TableSpec};
use sluice_sdk::wire::tcp::flags;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, Verdict, emit};

/// Per-flow state, one byte: the connection's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Allowed and open.
    Open = 1,
    /// FIN seen from the normalized source side.
    FinSrc = 2,
    /// FIN seen from the normalized destination side.
    FinDst = 3,
    /// FIN seen from both sides: the next packet (the final ACK) passes and
    /// the state is removed.
    Closing = 4,
}

/// A connection's state: its phase, and the label its allowing rule gave
/// (stored after the phase byte as a little-endian u16 when present).
fn decode_state(s: &[u8]) -> Option<(Phase, Option<u16>)> {
    let phase = Phase::from_state(s)?;
    let label = match s.get(1..3) {
        Some(&[a, b]) => Some(u16::from_le_bytes([a, b])),
        _ => None,
    };
    Some((phase, label))
}

fn encode_state(phase: Phase, label: Option<u16>) -> Vec<u8> {
    let mut v = vec![phase as u8];
    if let Some(l) = label {
        v.extend_from_slice(&l.to_le_bytes());
    }
    v
}

impl Phase {
    fn from_state(s: &[u8]) -> Option<Phase> {
        match s.first()? {
            1 => Some(Phase::Open),
            2 => Some(Phase::FinSrc),
            3 => Some(Phase::FinDst),
            4 => Some(Phase::Closing),
            _ => None,
        }
    }
}

/// The firewall NF.
#[derive(Debug)]
pub struct Firewall {
    config: Config,
    /// Connections decided per rule, summed over workers (`rule-hits`).
    hits: Counters,
    /// This batch's hits per rule key, folded into one `counter-add`.
    batch_hits: Vec<(u64, i64)>,
}

/// Key of `rule-hits` for connections decided by the default action.
pub const DEFAULT_RULE_KEY: u64 = u32::MAX as u64;

impl NetworkFunction for Firewall {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let config = Config::parse(config)?;
        let timeout = config.idle_timeout_ns();
        let hits = Counters::declare(TableSpec::eventual_counter("rule-hits", Merge::Sum, 1_000_000_000))
            .map_err(|e| format!("firewall: cannot declare table 'rule-hits': {e}"))?;
        Ok((Firewall { config, hits, batch_hits: Vec::new() }, NfInfo::with_flow_state(timeout)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut denied: Vec<Event> = Vec::new();
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let Some(key) = p.key() else {
                // Non-IP traffic (ARP, LLDP, ...) is decided by config.
                if !self.config.allow_non_ip {
                    batch.set_verdict(i, Verdict::Drop);
                }
                continue;
            };
            let tcp_flags = p.tcp().map(|t| t.flags());
            let flow = p.flow();
            let state = flow.and_then(|f| batch.flow_state(f)).and_then(decode_state);
            let from_src = key.is_normalized();

            if let (Some((phase, label)), Some(f)) = (state, flow) {
                // A known, allowed connection: pass (with its label), and
                // follow TCP teardown.
                if let Some(l) = label {
                    batch.set_verdict(i, Verdict::Label(l));
                }
                match tcp_flags {
                    Some(fl) if fl & flags::RST != 0 => batch.remove_flow_state(f),
                    Some(fl) if fl & flags::FIN != 0 => {
                        let next = match (phase, from_src) {
                            (Phase::Open, true) => Phase::FinSrc,
                            (Phase::Open, false) => Phase::FinDst,
                            (Phase::FinSrc, false) | (Phase::FinDst, true) => Phase::Closing,
                            (p, _) => p,
                        };
                        if next != phase {
                            batch.set_flow_state(f, encode_state(next, label));
                        }
                    }
                    Some(_) if phase == Phase::Closing => batch.remove_flow_state(f),
                    _ => {}
                }
                continue;
            }

            let rule = self.config.matching_rule(&key);
            let hit = rule.map(|(n, _)| n as u64).unwrap_or(DEFAULT_RULE_KEY);
            match self.batch_hits.iter_mut().find(|(k, _)| *k == hit) {
                Some((_, n)) => *n += 1,
                None => self.batch_hits.push((hit, 1)),
            }
            let action = rule.map(|(_, r)| r.action).unwrap_or(self.config.default);
            match action {
                Action::Allow => {
                    let label = rule.and_then(|(_, r)| r.label);
                    if let Some(l) = label {
                        batch.set_verdict(i, Verdict::Label(l));
                    }
                    // Only a connection opening creates state: a stray TCP
                    // segment of an unknown connection passes on the rule
                    // alone but does not open the reverse direction.
                    let opens = match tcp_flags {
                        Some(fl) => fl & flags::SYN != 0 && fl & (flags::ACK | flags::RST) == 0,
                        None => true,
                    };
                    if opens && let Some(f) = flow {
                        batch.set_flow_state(f, encode_state(Phase::Open, label));
                    }
                }
                Action::Deny => {
                    batch.set_verdict(i, Verdict::Drop);
                    if self.config.log_denied {
                        denied.push(Event {
                            kind: "firewall.deny".into(),
                            level: Level::Info,
                            packet: Some(i as u32),
                            fields: vec![
                                ("flow".into(), key.to_string()),
                                ("rule".into(), rule.map(|(n, _)| n.to_string()).unwrap_or_else(|| "default".into())),
                            ],
                        });
                    }
                }
            }
        }
        if !denied.is_empty() {
            emit(&denied);
        }
        self.flush_hits()
    }
}

impl Firewall {
    /// One `counter-add` for the batch's rule hits.
    fn flush_hits(&mut self) -> Result<(), String> {
        if self.batch_hits.is_empty() {
            return Ok(());
        }
        let (keys, deltas): (Vec<u64>, Vec<i64>) = self.batch_hits.drain(..).unzip();
        match self.hits.add(&keys, &deltas) {
            // Statistics only: a full table must not stop the traffic (the
            // host counts the refusal).
            Ok(()) | Err(StateError::Full(_) | StateError::OverBudget(_)) => Ok(()),
            Err(e) => Err(format!("firewall: counting rule hits: {e}")),
        }
    }
}

sluice_sdk::export_nf!(Firewall);
