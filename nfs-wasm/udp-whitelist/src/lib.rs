//! A UDP whitelister (SNF §6): UDP from outside reaches a client only as a
//! reply to a request that client sent. A client's request records its
//! time in the flow's host-owned state; an inbound datagram passes only if
//! its flow has a request no older than the timeout. The NF checks the age
//! itself (the host's idle expiry runs at batch boundaries, so within one
//! batch only the NF can tell exactly). See README.md.

use serde::Deserialize;
use sluice_sdk::matchers::Cidr;
use sluice_sdk::{Batch, Event, Level, NetworkFunction, NfInfo, Verdict, emit};

/// UDP protocol number.
const UDP: u8 = 17;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    clients: Vec<String>,
    #[serde(default = "default_timeout")]
    idle_timeout_s: u64,
    #[serde(default)]
    log_dropped: bool,
}

fn default_timeout() -> u64 {
    30
}

/// The whitelister.
#[derive(Debug)]
pub struct UdpWhitelist {
    clients: Vec<Cidr>,
    log_dropped: bool,
    timeout_ns: u64,
}

impl UdpWhitelist {
    fn is_client(&self, a: sluice_sdk::IpAddr128) -> bool {
        self.clients.iter().any(|c| c.contains(a))
    }
}

impl NetworkFunction for UdpWhitelist {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw: RawConfig = serde_json::from_slice(config).map_err(|e| format!("udp-whitelist config: {e}"))?;
        let clients = raw
            .clients
            .iter()
            .map(|c| Cidr::parse(c).map_err(|e| format!("udp-whitelist config: clients: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if clients.is_empty() {
            return Err("udp-whitelist config: clients must name at least one network".into());
        }
        let timeout_ns = raw.idle_timeout_s.saturating_mul(1_000_000_000);
        let nf = UdpWhitelist { clients, log_dropped: raw.log_dropped, timeout_ns };
        Ok((nf, NfInfo::with_flow_state(timeout_ns)))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        let mut events = Vec::new();
        for i in 0..batch.len() {
            let Some(p) = batch.packet(i) else { continue };
            let Some(key) = p.key().filter(|k| k.protocol == UDP) else { continue };
            let flow = p.flow();
            let now = p.timestamp_ns();
            if self.is_client(key.src) {
                // A request: remember when this client last asked.
                if let Some(f) = flow {
                    batch.set_flow_state(f, now.to_le_bytes().to_vec());
                }
            } else if self.is_client(key.dst) {
                let asked_at = flow
                    .and_then(|f| batch.flow_state(f))
                    .and_then(|s| <[u8; 8]>::try_from(s).ok())
                    .map(u64::from_le_bytes);
                let fresh = asked_at.is_some_and(|t| now.saturating_sub(t) <= self.timeout_ns);
                if !fresh {
                    batch.set_verdict(i, Verdict::Drop);
                    if self.log_dropped {
                        events.push(Event {
                            kind: "udp-whitelist.drop".into(),
                            level: Level::Info,
                            packet: Some(i as u32),
                            fields: vec![("flow".into(), key.to_string())],
                        });
                    }
                }
            }
        }
        if !events.is_empty() {
            emit(&events);
        }
        Ok(())
    }
}

sluice_sdk::export_nf!(UdpWhitelist);
