//! Source NAT (NAPT44): connections from inside addresses leave with the
//! public address and a port from a pool; replies to that port are
//! translated back. See README.md.
//!
//! State (all host-owned, `sluice:nf@0.4.0`):
//! - `ports`: the public port pool, a *release* table: every worker owns a
//!   share of the ports and hands them out without asking the others; a
//!   port is bound to the connection's inside and remote endpoints, which
//!   any worker can look up (replies may arrive on another worker, because
//!   after translation they are another flow).
//! - `mappings`: per-flow, the public port of each outbound connection;
//!   idles out after the configured timeout (refreshed by outbound packets,
//!   RFC 4787 REQ-6), and its expiry gives the port back to the pool.
//!
//! A batch costs at most four state calls, however many packets it holds.

use serde::Deserialize;
use sluice_sdk::matchers::Cidr;
use sluice_sdk::state::{Bytes, Pool, TableSpec, frames, push_frame};
use sluice_sdk::wire::rewrite::{Endpoint, set_endpoint};
use sluice_sdk::{Batch, Event, FlowKey, IpAddr128, Level, NetworkFunction, NfInfo, Verdict, emit};

const TCP: u8 = 6;
const UDP: u8 = 17;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    public_ip: String,
    inside: Vec<String>,
    #[serde(default = "default_first")]
    port_first: u16,
    #[serde(default = "default_count")]
    port_count: u32,
    #[serde(default = "default_timeout")]
    idle_timeout_s: u64,
}

fn default_first() -> u16 {
    1024
}
fn default_count() -> u32 {
    64512
}
fn default_timeout() -> u64 {
    120
}

/// The endpoints a public port is bound to: 13 bytes (inside address and
/// port, remote address and port, protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binding {
    inside: [u8; 4],
    inside_port: u16,
    remote: [u8; 4],
    remote_port: u16,
    protocol: u8,
}

impl Binding {
    fn encode(&self) -> [u8; 13] {
        let mut b = [0u8; 13];
        let (a, rest) = b.split_at_mut(4);
        a.copy_from_slice(&self.inside);
        let (p, rest) = rest.split_at_mut(2);
        p.copy_from_slice(&self.inside_port.to_be_bytes());
        let (r, rest) = rest.split_at_mut(4);
        r.copy_from_slice(&self.remote);
        let (rp, proto) = rest.split_at_mut(2);
        rp.copy_from_slice(&self.remote_port.to_be_bytes());
        if let Some(x) = proto.first_mut() {
            *x = self.protocol;
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Binding> {
        let b: &[u8; 13] = b.try_into().ok()?;
        let (inside, rest) = b.split_first_chunk::<4>()?;
        let (ip, rest) = rest.split_first_chunk::<2>()?;
        let (remote, rest) = rest.split_first_chunk::<4>()?;
        let (rp, rest) = rest.split_first_chunk::<2>()?;
        Some(Binding {
            inside: *inside,
            inside_port: u16::from_be_bytes(*ip),
            remote: *remote,
            remote_port: u16::from_be_bytes(*rp),
            protocol: *rest.first()?,
        })
    }
}

/// What a packet is to the NAT.
#[derive(Debug, Clone, Copy)]
enum Dir {
    /// From inside to outside: source gets translated.
    Out { flow: u32, binding: Binding },
    /// To the public address: destination gets translated back.
    In { port: u16, remote: [u8; 4], remote_port: u16, protocol: u8 },
    /// Inside traffic of a protocol the NAT cannot translate: dropped.
    Untranslatable,
    /// Not the NAT's business (e.g. inside to inside, non-IP): passes.
    Pass,
}

/// The NAT.
#[derive(Debug)]
pub struct Nat {
    public: [u8; 4],
    inside: Vec<Cidr>,
    mappings: Bytes,
    ports: Pool,
    dirs: Vec<Dir>,
    refused: u64,
}

fn parse_config(config: &[u8]) -> Result<RawConfig, String> {
    let raw: RawConfig = serde_json::from_slice(config).map_err(|e| format!("nat config: {e}"))?;
    if raw.port_count == 0 || u32::from(raw.port_first) + raw.port_count > 65536 {
        return Err(format!(
            "nat config: ports {}..{} do not fit in 1..65535",
            raw.port_first,
            u32::from(raw.port_first) + raw.port_count
        ));
    }
    if raw.port_first == 0 {
        return Err("nat config: port-first must be at least 1".into());
    }
    if raw.inside.is_empty() {
        return Err("nat config: `inside` needs at least one CIDR (the addresses to translate)".into());
    }
    Ok(raw)
}

impl Nat {
    fn classify(&self, batch: &Batch, i: usize) -> Dir {
        let Some(p) = batch.packet(i) else { return Dir::Pass };
        let Some(key) = p.key() else { return Dir::Pass };
        let (Some(src), Some(dst)) = (key.src.to_v4(), key.dst.to_v4()) else { return Dir::Pass };
        let from_inside = self.inside.iter().any(|c| c.contains(key.src));
        let to_inside = self.inside.iter().any(|c| c.contains(key.dst));
        if dst == self.public && !from_inside {
            if !matches!(key.protocol, TCP | UDP) || p.is_fragment() {
                return Dir::Untranslatable;
            }
            return Dir::In { port: key.dst_port, remote: src, remote_port: key.src_port, protocol: key.protocol };
        }
        if !from_inside || to_inside {
            return Dir::Pass;
        }
        if !matches!(key.protocol, TCP | UDP) || p.is_fragment() {
            return Dir::Untranslatable;
        }
        let Some(flow) = p.flow() else { return Dir::Pass };
        Dir::Out {
            flow,
            binding: Binding {
                inside: src,
                inside_port: key.src_port,
                remote: dst,
                remote_port: key.dst_port,
                protocol: key.protocol,
            },
        }
    }

    /// Rewrites one endpoint (checksums updated incrementally); `false`
    /// if the packet could not be rewritten (cut short).
    fn translate(batch: &mut Batch, i: usize, which: Endpoint, addr: [u8; 4], port: u16) -> bool {
        let Some(p) = batch.packet(i) else { return false };
        let mut bytes = p.bytes().to_vec();
        let layers = sluice_sdk::wire::parse(&bytes);
        if set_endpoint(&mut bytes, &layers, which, IpAddr128::from_v4(addr), Some(port)).is_err() {
            return false;
        }
        batch.rewrite(i, bytes);
        true
    }
}

impl NetworkFunction for Nat {
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String> {
        let raw = parse_config(config)?;
        let public: std::net::Ipv4Addr = raw
            .public_ip
            .parse()
            .map_err(|_| format!("nat config: public-ip '{}' is not an IPv4 address", raw.public_ip))?;
        let inside = raw
            .inside
            .iter()
            .enumerate()
            .map(|(i, c)| Cidr::parse(c).map_err(|e| format!("nat config: inside[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let state_err = |e: sluice_sdk::state::StateError| format!("nat: cannot declare state: {e}");
        let timeout = raw.idle_timeout_s.max(1).saturating_mul(1_000_000_000);
        let mappings = Bytes::declare(
            TableSpec::per_flow_bytes("mappings", 2).idle_timeout_ns(timeout).notify_expired().capacity(raw.port_count),
        )
        .map_err(state_err)?;
        let ports = Pool::declare(TableSpec::pool("ports", u64::from(raw.port_first), u64::from(raw.port_count), 13))
            .map_err(state_err)?;
        Ok((
            Nat { public: public.octets(), inside, mappings, ports, dirs: Vec::new(), refused: 0 },
            NfInfo::stateless(),
        ))
    }

    fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
        self.dirs.clear();
        for i in 0..batch.len() {
            let d = self.classify(batch, i);
            self.dirs.push(d);
        }
        let state_err = |what: &str, e: sluice_sdk::state::StateError| format!("nat: {what}: {e}");

        // Outbound: one read of the mappings of every outbound flow.
        let mut flows: Vec<u32> = Vec::new();
        for d in &self.dirs {
            if let Dir::Out { flow, .. } = d
                && !flows.contains(flow)
            {
                flows.push(*flow);
            }
        }
        let mut port_of: Vec<(u32, Option<u16>)> = Vec::with_capacity(flows.len());
        if !flows.is_empty() {
            let mut keys = Vec::with_capacity(flows.len() * 8);
            for f in &flows {
                Bytes::flow_key(&mut keys, *f);
            }
            let values = self.mappings.get_many(&keys).map_err(|e| state_err("reading mappings", e))?;
            for (f, v) in flows.iter().zip(frames(&values)) {
                let port = v.ok().and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes);
                port_of.push((*f, port));
            }
            // New connections: one acquire and one write for all of them.
            let new: Vec<(u32, Binding)> = port_of
                .iter()
                .filter(|(_, p)| p.is_none())
                .filter_map(|(f, _)| {
                    self.dirs.iter().find_map(|d| match d {
                        Dir::Out { flow, binding } if flow == f => Some((*f, *binding)),
                        _ => None,
                    })
                })
                .collect();
            if !new.is_empty() {
                let mut values = Vec::with_capacity(new.len() * 17);
                for (_, b) in &new {
                    push_frame(&mut values, &b.encode());
                }
                let got = self.ports.acquire(&values).map_err(|e| state_err("acquiring ports", e))?;
                let mut entries = Vec::new();
                for ((flow, _), port) in new.iter().zip(&got) {
                    let port = u16::try_from(*port).map_err(|_| format!("nat: pool returned port {port}"))?;
                    Bytes::flow_key(&mut entries, *flow);
                    push_frame(&mut entries, &port.to_be_bytes());
                    if let Some(slot) = port_of.iter_mut().find(|(f, _)| f == flow) {
                        slot.1 = Some(port);
                    }
                }
                if let Err(e) = self.mappings.put_many(&entries) {
                    // The mapping table is full: give the ports back and
                    // drop those connections' packets below.
                    let taken: Vec<u64> = got.clone();
                    let _ = self.ports.release(&taken);
                    for (f, _) in &new {
                        if let Some(slot) = port_of.iter_mut().find(|(x, _)| x == f) {
                            slot.1 = None;
                        }
                    }
                    sluice_sdk::log(Level::Warn, &format!("nat: cannot record new mappings: {e}"));
                }
            }
        }

        // Inbound: one lookup of every destination port.
        let inbound: Vec<u64> = self
            .dirs
            .iter()
            .filter_map(|d| match d {
                Dir::In { port, .. } => Some(u64::from(*port)),
                _ => None,
            })
            .collect();
        let bindings: Vec<Option<Binding>> = if inbound.is_empty() {
            Vec::new()
        } else {
            let values = self.ports.lookup(&inbound).map_err(|e| state_err("looking up ports", e))?;
            frames(&values).map(|v| v.ok().and_then(Binding::decode)).collect()
        };

        let mut next_in = bindings.iter();
        let mut refused = 0u64;
        for i in 0..batch.len() {
            let Some(d) = self.dirs.get(i).copied() else { continue };
            match d {
                Dir::Pass => {}
                Dir::Untranslatable => batch.set_verdict(i, Verdict::Drop),
                Dir::Out { flow, .. } => match port_of.iter().find(|(f, _)| *f == flow).and_then(|(_, p)| *p) {
                    Some(port) => {
                        if !Self::translate(batch, i, Endpoint::Source, self.public, port) {
                            batch.set_verdict(i, Verdict::Drop);
                        }
                    }
                    None => {
                        refused += 1;
                        batch.set_verdict(i, Verdict::Drop);
                    }
                },
                Dir::In { remote, remote_port, protocol, .. } => {
                    let b = next_in.next().copied().flatten();
                    // Address- and port-dependent filtering (RFC 4787):
                    // only the remote the connection went to may answer.
                    match b.filter(|b| b.remote == remote && b.remote_port == remote_port && b.protocol == protocol) {
                        Some(b) => {
                            if !Self::translate(batch, i, Endpoint::Destination, b.inside, b.inside_port) {
                                batch.set_verdict(i, Verdict::Drop);
                            }
                        }
                        None => batch.set_verdict(i, Verdict::Drop),
                    }
                }
            }
        }
        if refused > 0 {
            self.refused += refused;
            emit(&[Event {
                kind: "nat.ports-exhausted".into(),
                level: Level::Warn,
                packet: None,
                fields: vec![("packets".into(), refused.to_string()), ("total".into(), self.refused.to_string())],
            }]);
        }
        Ok(())
    }

    fn expired(&mut self, _table: u32, entries: &[u8]) -> Result<(), String> {
        // Idle mappings: give their ports back.
        let mut ports = Vec::new();
        let mut items = frames(entries);
        while let (Some(Ok(key)), Some(Ok(value))) = (items.next(), items.next()) {
            if FlowKey::from_bytes(key).is_some()
                && let Ok(p) = <[u8; 2]>::try_from(value)
            {
                ports.push(u64::from(u16::from_be_bytes(p)));
            }
        }
        self.ports.release(&ports).map_err(|e| format!("nat: releasing ports: {e}"))
    }
}

sluice_sdk::export_nf!(Nat);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_round_trip() {
        let b =
            Binding { inside: [10, 0, 0, 1], inside_port: 5555, remote: [1, 2, 3, 4], remote_port: 443, protocol: 6 };
        assert_eq!(Binding::decode(&b.encode()), Some(b));
        assert_eq!(Binding::decode(&b.encode()[..12]), None);
    }

    #[test]
    fn bad_configs_are_refused_with_the_field() {
        let err = |c: &str| parse_config(c.as_bytes()).unwrap_err();
        assert!(err(r#"{"public-ip":"1.2.3.4","inside":[],"port-first":1024}"#).contains("inside"));
        assert!(
            err(r#"{"public-ip":"1.2.3.4","inside":["10.0.0.0/8"],"port-first":60000,"port-count":10000}"#)
                .contains("ports")
        );
        assert!(err(r#"{"inside":["10.0.0.0/8"]}"#).contains("public-ip"));
    }
}
