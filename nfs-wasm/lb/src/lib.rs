//! A layer-4 load balancer: connections to a virtual IP (VIP) are spread
//! over backends by Maglev consistent hashing, and every connection sticks
//! to the backend it started on — recorded in host-owned per-flow state —
//! even when the backend list changes under it.
//!
//! Client → VIP packets get the backend's address (and port, if the
//! backend names one) as destination; backend → client replies get the VIP
//! back as source. Checksums are updated incrementally. See README.md.

pub mod maglev;

use serde::Deserialize;
use sluice_sdk::offload::Offload;
use sluice_sdk::wire::rewrite::{Endpoint, set_endpoint};
use sluice_sdk::{Batch, FlowKey, IpAddr128, NetworkFunction, NfInfo};

/// A backend: address and optional port (`None` keeps the client's
/// destination port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// Address.
    pub addr: IpAddr128,
    /// Port, if the backend listens on another port than the VIP's.
    pub port: Option<u16>,
}

impl Backend {
    fn parse(s: &str) -> Result<Backend, String> {
        if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
            return Ok(Backend { addr: sa.ip().into(), port: Some(sa.port()) });
        }
        let ip: std::net::IpAddr =
            s.parse().map_err(|_| format!("lb config: backend '{s}' is not an address or address:port"))?;
        Ok(Backend { addr: ip.into(), port: None })
    }

    /// Flow-state encoding: 16 address bytes, 2 port bytes, 1 has-port.
    fn encode(&self) -> Vec<u8> {
        let mut v = self.addr.0.to_be_bytes().to_vec();
        v.extend_from_slice(&self.port.unwrap_or(0).to_be_bytes());
        v.push(u8::from(self.port.is_some()));
        v
    }

    fn decode(b: &[u8]) -> Option<Backend> {
        let b: &[u8; 19] = b.try_into().ok()?;
        let [a @ .., p0, p1, has] = *b;
        Some(Backend {
            addr: IpAddr128(u128::from_be_bytes(a)),
            port: (has == 1).then_some(u16::from_be_bytes([p0, p1])),
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    vip: String,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    protocol: Option<String>,
    backends: Vec<String>,
    #[serde(default = "default_table")]
    table_size: usize,
    #[serde(default)]
    idle_timeout_s: Option<u64>,
    #[serde(default)]
    offload: bool,
}

fn default_table() -> usize {
    65537
}

/// The load balancer.
#[derive(Debug)]
pub struct LoadBalancer {
    vip: IpAddr128,
    port: Option<u16>,
    protocol: Option<u8>,
    backends: Vec<Backend>,
    table: maglev::Table,
    /// Offload each direction of a connection once its backend is known
    /// (`offload = true`).
    offload: bool,
}

impl LoadBalancer {
    /// The backend Maglev picks for a new connection with this key.
    pub fn pick(&self, key: &FlowKey) -> Option<Backend> {
        self.backends.get(self.table.lookup(key.symmetric_hash())).copied()
    }

    fn is_to_vip(&self, k: &FlowKey) -> bool {
        k.dst == self.vip && self.port.is_none_or(|p| p == k.dst_port) && self.protocol.is_none_or(|p| p == k.protocol)
    }

    /// The backend a reply comes from, if it comes from one.
    fn replying_backend(&self, k: &FlowKey) -> Option<Backend> {
        if self.protocol.is_some_and(|p| p != k.protocol) {
            return None;
        }
        self.backends.iter().copied().find(|b| {
            b.addr == k.src
                && match (b.port, self.port) {
                    (Some(bp), _) => bp == k.src_port,
                    (None, Some(vp)) => vp == k.src_port,
                    (None, None) => true,
                }
        })
    }
}

impl NetworkFunction for LoadBalancer {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw: RawConfig = serde_json::from_slice(config).map_err(|e| format!("lb config: {e}"))?;
        let vip: std::net::IpAddr =
            raw.vip.parse().map_err(|_| format!("lb config: vip '{}' is not an address", raw.vip))?;
        let vip = IpAddr128::from(vip);
        let backends = raw.backends.iter().map(|b| Backend::parse(b)).collect::<Result<Vec<_>, _>>()?;
        if let Some(b) = backends.iter().find(|b| b.addr.to_v4().is_some() != vip.to_v4().is_some()) {
            return Err(format!("lb config: backend {} is not of the VIP's IP version", b.addr));
        }
        let protocol = match raw.protocol.as_deref() {
            None | Some("any") => None,
            Some("tcp") => Some(6),
            Some("udp") => Some(17),
            Some(p) => return Err(format!("lb config: protocol '{p}' (use tcp, udp or any)")),
        };
        let table = maglev::Table::build(&raw.backends, raw.table_size).map_err(|e| format!("lb config: {e}"))?;
        let timeout = raw.idle_timeout_s.map(|s| s.saturating_mul(1_000_000_000)).unwrap_or(0);
        Ok((
            LoadBalancer { vip, port: raw.port, protocol, backends, table, offload: raw.offload },
            NfInfo::with_flow_state(timeout),
        ))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        // (flow, reply) offloaded in this batch: one request each.
        let mut offloaded: Vec<(u32, bool)> = Vec::new();
        for i in 0..batch.len() {
            let Some((which, to, mut bytes, remember)) = self.decide(batch, i) else { continue };
            let layers = sluice_sdk::wire::parse(&bytes);
            let rewritten = set_endpoint(&mut bytes, &layers, which, to.addr, to.port).is_ok();
            if rewritten {
                batch.rewrite(i, bytes);
            }
            if let Some((flow, backend)) = remember {
                batch.set_flow_state(flow, backend.encode());
            }
            // The connection's backend is decided (and kept in its flow
            // state, which its packets under an entry keep fresh): its
            // later packets this way get the same rewrite without a call.
            // A new backend list is a new configuration, which ends every
            // entry.
            let flow = batch.packet(i).and_then(|p| p.flow());
            let tcp_or_udp = matches!(layers.key.map(|k| k.protocol), Some(6 | 17));
            let reply = matches!(which, Endpoint::Source);
            if let (true, true, true, Some(f)) = (self.offload, rewritten, tcp_or_udp, flow)
                && !offloaded.contains(&(f, reply))
            {
                offloaded.push((f, reply));
                let request = Offload::packet(i).without_counts();
                batch.offload(match which {
                    Endpoint::Destination => request.destination(to.addr, to.port),
                    Endpoint::Source => request.source(to.addr, to.port),
                });
            }
        }
        Ok(())
    }
}

/// A packet to rewrite: which endpoint, to what, its bytes, and the
/// backend to remember for its flow (for a connection's first packet).
type Decision = (Endpoint, Backend, Vec<u8>, Option<(u32, Backend)>);

impl LoadBalancer {
    fn decide(&self, batch: &Batch, i: usize) -> Option<Decision> {
        let p = batch.packet(i)?;
        let key = p.key()?;
        if self.is_to_vip(&key) {
            let flow = p.flow();
            // Affinity: the backend this connection started on, while it is
            // still a backend; otherwise Maglev's choice.
            let stored = flow.and_then(|f| batch.flow_state(f)).and_then(Backend::decode);
            let backend = match stored.filter(|b| self.backends.contains(b)) {
                Some(b) => b,
                None => self.pick(&key)?,
            };
            let remember = flow.filter(|_| stored != Some(backend)).map(|f| (f, backend));
            Some((Endpoint::Destination, backend, p.bytes().to_vec(), remember))
        } else {
            let b = self.replying_backend(&key)?;
            let vip = Backend { addr: self.vip, port: b.port.and(self.port) };
            Some((Endpoint::Source, vip, p.bytes().to_vec(), None))
        }
    }
}

sluice_sdk::export_nf!(LoadBalancer);
