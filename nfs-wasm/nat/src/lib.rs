//! Source NAT (NAPT44): connections from inside addresses leave with the
//! public address and a port from a pool; replies to that port are
//! translated back. ICMP echo takes a public identifier from the same pool,
//! and ICMP errors about translated packets are translated both ways
//! (RFC 5508, see `icmp`). See README.md.
//!
//! State (all host-owned, `sluice:nf@0.5.0` `state`; the NAT also offloads
//! outbound connections with `offload = true`, see README.md):
//! - `ports`: the public port pool, a *release* table: every worker owns a
//!   share of the ports and hands them out without asking the others; a
//!   port is bound to the connection's inside and remote endpoints, which
//!   any worker can look up (replies may arrive on another worker, because
//!   after translation they are another flow).
//! - `mappings`: per-flow, the public port of each outbound connection;
//!   idles out after the configured timeout (refreshed by outbound packets,
//!   RFC 4787 REQ-6), and its expiry gives the port back to the pool.
//! - `reverse`: single-writer, the public port of each binding keyed by
//!   the binding: how an ICMP error sent from inside about an inbound
//!   packet (another flow than its connection) finds the public port. A
//!   hint only: the port it names is checked against the pool.
//!
//! A batch costs at most six state calls, however many packets it holds:
//! read mappings, acquire ports, record mappings, record reverse entries
//! (these three only for new connections), read reverse entries (only for
//! ICMP errors from inside), look up ports (only for inbound packets and
//! ICMP errors).

mod icmp;

use serde::Deserialize;
use sluice_sdk::matchers::Cidr;
use sluice_sdk::offload::Offload;
use sluice_sdk::state::{Bytes, Pool, TableSpec, frames, push_frame};
use sluice_sdk::wire::rewrite::{Endpoint, set_endpoint};
use sluice_sdk::{Batch, Event, FlowKey, IpAddr128, Level, NetworkFunction, NfInfo, Packet, Verdict, emit};

use icmp::{ICMP, TCP, UDP};

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
    #[serde(default)]
    offload: bool,
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
/// port, remote address and port, protocol). For an ICMP echo both ports
/// hold the inside host's identifier, as in the host's flow key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binding {
    inside: [u8; 4],
    inside_port: u16,
    remote: [u8; 4],
    remote_port: u16,
    protocol: u8,
}

impl Binding {
    /// Encoded length.
    const LEN: usize = 13;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
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
        let b: &[u8; Self::LEN] = b.try_into().ok()?;
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
    /// From inside to outside (TCP, UDP, ICMP echo request): source gets
    /// translated.
    Out { flow: u32, binding: Binding },
    /// To the public address: a reply (TCP, UDP, ICMP echo reply), or with
    /// `error` an ICMP error about a translated outbound packet; `port` is
    /// looked up in the pool and the binding must match the rest. A reply
    /// to an echo carries the public identifier in both ports, so its
    /// `remote_port` is not checked (`None`).
    In { port: u16, remote: [u8; 4], remote_port: Option<u16>, protocol: u8, error: bool },
    /// An ICMP error from inside about a packet that came in through the
    /// NAT: the binding of its connection, whose public port `reverse`
    /// holds.
    ErrorOut { binding: Binding },
    /// An ICMP error about no packet the NAT could have translated (or
    /// with a bad checksum): dropped and counted.
    Unmatched,
    /// Inside traffic the NAT cannot translate: dropped.
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
    reverse: Bytes,
    dirs: Vec<Dir>,
    refused: u64,
    unmatched: u64,
    /// Offload outbound connections (`offload = true`): entries idle out
    /// after this (half the mapping's timeout), 0 when off.
    offload_idle_ns: u64,
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
    fn is_inside(&self, a: [u8; 4]) -> bool {
        let a = IpAddr128::from_v4(a);
        self.inside.iter().any(|c| c.contains(a))
    }

    fn classify(&self, batch: &Batch, i: usize) -> Dir {
        let Some(p) = batch.packet(i) else { return Dir::Pass };
        let Some(key) = p.key() else { return Dir::Pass };
        let (Some(src), Some(dst)) = (key.src.to_v4(), key.dst.to_v4()) else { return Dir::Pass };
        let from_inside = self.is_inside(src);
        let inbound = dst == self.public && !from_inside;
        if !inbound && (!from_inside || self.is_inside(dst)) {
            return Dir::Pass;
        }
        // From here on the packet is translated, or dropped so that no
        // private address leaks. A first fragment carries the transport
        // header and is translated like a whole datagram (the host applies
        // its verdict and rewrites to the later fragments); a later
        // fragment has no ports and should never get here.
        if p.ipv4().is_none_or(|ip| ip.frag_offset() != 0) {
            return Dir::Untranslatable;
        }
        match key.protocol {
            TCP | UDP if p.tcp().is_some() || p.udp().is_some() => {}
            ICMP => return self.classify_icmp(&p, key, inbound),
            _ => return Dir::Untranslatable,
        }
        if inbound {
            return Dir::In {
                port: key.dst_port,
                remote: src,
                remote_port: Some(key.src_port),
                protocol: key.protocol,
                error: false,
            };
        }
        Self::outbound(&p, key)
    }

    /// An outbound connection's packet (TCP, UDP, ICMP echo request).
    fn outbound(p: &Packet<'_>, key: FlowKey) -> Dir {
        let (Some(src), Some(dst), Some(flow)) = (key.src.to_v4(), key.dst.to_v4(), p.flow()) else {
            return Dir::Untranslatable;
        };
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

    /// ICMP: echo requests out and their replies in are queries with the
    /// identifier for a port; errors are about another packet; the rest
    /// (echo requests to the public address, timestamps, redirects, ...)
    /// is dropped.
    fn classify_icmp(&self, p: &Packet<'_>, key: FlowKey, inbound: bool) -> Dir {
        let Some(msg_type) = p.icmp().map(|m| m.msg_type()) else { return Dir::Untranslatable };
        if icmp::is_error(msg_type) {
            return self.classify_error(p, inbound);
        }
        match (inbound, msg_type, key.src.to_v4()) {
            (false, icmp::ECHO_REQUEST, _) => Self::outbound(p, key),
            (true, icmp::ECHO_REPLY, Some(src)) => {
                Dir::In { port: key.dst_port, remote: src, remote_port: None, protocol: ICMP, error: false }
            }
            _ => Dir::Untranslatable,
        }
    }

    /// An ICMP error. It answers a packet as the NAT sent it on, so its
    /// embedded packet is a translated one: from the public address when
    /// the error comes in, to an inside host when an inside host (or
    /// router) sends it out.
    fn classify_error(&self, p: &Packet<'_>, inbound: bool) -> Dir {
        let d = p.descriptor();
        let (l3, l4) = (usize::from(d.l3_offset), usize::from(d.l4_offset));
        let msg = icmp::datagram(p.bytes(), l3);
        // RFC 5508: an error whose checksum fails is dropped.
        if !icmp::checksum_ok(msg.get(l3..).unwrap_or(&[])) {
            return Dir::Unmatched;
        }
        let Some(e) = icmp::embedded(msg, l4) else { return Dir::Unmatched };
        if inbound {
            // The NAT sends echo requests out, never replies.
            if e.src != self.public || e.echo_type.is_some_and(|t| t != icmp::ECHO_REQUEST) {
                return Dir::Unmatched;
            }
            return Dir::In {
                port: e.src_port,
                remote: e.dst,
                remote_port: (e.protocol != ICMP).then_some(e.dst_port),
                protocol: e.protocol,
                error: true,
            };
        }
        if !self.is_inside(e.dst) || e.echo_type.is_some_and(|t| t != icmp::ECHO_REPLY) {
            return Dir::Unmatched;
        }
        Dir::ErrorOut {
            binding: Binding {
                inside: e.dst,
                inside_port: e.dst_port,
                remote: e.src,
                remote_port: e.src_port,
                protocol: e.protocol,
            },
        }
    }

    /// The binding of an outbound connection's flow key (as `expired`
    /// hands it over, normalized): the side in `inside` is the inside host.
    fn binding_of(&self, k: &FlowKey) -> Option<Binding> {
        let (a, b) = (k.src.to_v4()?, k.dst.to_v4()?);
        let (inside, inside_port, remote, remote_port) = match (self.is_inside(a), self.is_inside(b)) {
            (true, false) => (a, k.src_port, b, k.dst_port),
            (false, true) => (b, k.dst_port, a, k.src_port),
            _ => return None,
        };
        Some(Binding { inside, inside_port, remote, remote_port, protocol: k.protocol })
    }

    /// Rewrites one endpoint (checksums updated incrementally; for an ICMP
    /// echo the port is its identifier); `false` if the packet could not
    /// be rewritten (cut short).
    fn translate(batch: &mut Batch, i: usize, which: Endpoint, addr: [u8; 4], port: u16) -> bool {
        let Some(p) = batch.packet(i) else { return false };
        let mut bytes = p.bytes().to_vec();
        let layers = sluice_sdk::wire::parse(&bytes);
        if set_endpoint(&mut bytes, &layers, which, IpAddr128::from_v4(addr), Some(port)).is_err() {
            return false;
        }
        if layers.key.is_some_and(|k| k.protocol == ICMP) {
            let Some(l4) = layers.l4_offset else { return false };
            if icmp::set_echo_ident(&mut bytes, usize::from(l4), port).is_none() {
                return false;
            }
        }
        batch.rewrite(i, bytes);
        true
    }

    /// Translates an ICMP error (see [`icmp::rewrite_error`]); `false` if
    /// it could not be.
    fn translate_error(
        batch: &mut Batch,
        i: usize,
        outer: (Endpoint, [u8; 4]),
        inner: (Endpoint, [u8; 4], u16),
    ) -> bool {
        let Some(p) = batch.packet(i) else { return false };
        let d = p.descriptor();
        let (l3, l4) = (usize::from(d.l3_offset), usize::from(d.l4_offset));
        let mut bytes = p.bytes().to_vec();
        if icmp::rewrite_error(&mut bytes, l3, l4, outer.0, outer.1, inner).is_none() {
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
        // Synced every batch: an error from inside comes at least a round
        // trip after the connection's first packet recorded its entry.
        let reverse = Bytes::declare(
            TableSpec::single_writer_bytes("reverse", Binding::LEN as u32, 2, 0).capacity(raw.port_count),
        )
        .map_err(state_err)?;
        Ok((
            Nat {
                public: public.octets(),
                inside,
                mappings,
                ports,
                reverse,
                dirs: Vec::new(),
                refused: 0,
                unmatched: 0,
                offload_idle_ns: if raw.offload { (timeout / 2).max(1) } else { 0 },
            },
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
                let mut reverse = Vec::new();
                for ((flow, binding), port) in new.iter().zip(&got) {
                    let port = u16::try_from(*port).map_err(|_| format!("nat: pool returned port {port}"))?;
                    Bytes::flow_key(&mut entries, *flow);
                    push_frame(&mut entries, &port.to_be_bytes());
                    push_frame(&mut reverse, &binding.encode());
                    push_frame(&mut reverse, &port.to_be_bytes());
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
                } else {
                    // The way back from a binding to its port, for ICMP
                    // errors from inside. Without it those errors are
                    // dropped; the connection still works.
                    if let Err(e) = self.reverse.put_many(&reverse) {
                        sluice_sdk::log(Level::Warn, &format!("nat: cannot record reverse bindings: {e}"));
                    }
                }
            }
        }

        // ICMP errors from inside: one read of their bindings' ports.
        let errors_out: Vec<(usize, Binding)> = self
            .dirs
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match d {
                Dir::ErrorOut { binding } => Some((i, *binding)),
                _ => None,
            })
            .collect();
        let mut claimed: Vec<(usize, u16)> = Vec::new();
        if !errors_out.is_empty() {
            let mut keys = Vec::with_capacity(errors_out.len() * 17);
            for (_, b) in &errors_out {
                push_frame(&mut keys, &b.encode());
            }
            let values = self.reverse.get_many(&keys).map_err(|e| state_err("reading reverse bindings", e))?;
            for ((i, _), v) in errors_out.iter().zip(frames(&values)) {
                if let Some(port) = v.ok().and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes) {
                    claimed.push((*i, port));
                }
            }
        }

        // Inbound, and the ports errors from inside claim: one lookup of
        // every port in the pool.
        let mut asked: Vec<(usize, u16)> = self
            .dirs
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match d {
                Dir::In { port, .. } => Some((i, *port)),
                _ => None,
            })
            .collect();
        asked.extend_from_slice(&claimed);
        let mut bound: Vec<Option<(u16, Binding)>> = vec![None; batch.len()];
        if !asked.is_empty() {
            let resources: Vec<u64> = asked.iter().map(|(_, p)| u64::from(*p)).collect();
            let values = self.ports.lookup(&resources).map_err(|e| state_err("looking up ports", e))?;
            for ((i, port), v) in asked.iter().zip(frames(&values)) {
                if let (Some(slot), Some(b)) = (bound.get_mut(*i), v.ok().and_then(Binding::decode)) {
                    *slot = Some((*port, b));
                }
            }
        }

        let mut refused = 0u64;
        let mut unmatched = 0u64;
        let mut offloaded: Vec<u32> = Vec::new();
        for i in 0..batch.len() {
            let Some(d) = self.dirs.get(i).copied() else { continue };
            let found = bound.get(i).copied().flatten();
            let ok = match d {
                Dir::Pass => true,
                Dir::Untranslatable => false,
                Dir::Unmatched => {
                    unmatched += 1;
                    false
                }
                Dir::Out { flow, binding } => match port_of.iter().find(|(f, _)| *f == flow).and_then(|(_, p)| *p) {
                    Some(port) => {
                        let ok = Self::translate(batch, i, Endpoint::Source, self.public, port);
                        // The flow's later packets leave translated without a
                        // call. Its mapping stays fresh while they pass (the
                        // host refreshes a flow's per-flow entries under an
                        // entry), and the entry idles out well before it, so
                        // it never outlives its port.
                        if ok
                            && self.offload_idle_ns != 0
                            && (binding.protocol == TCP || binding.protocol == UDP)
                            && !offloaded.contains(&flow)
                        {
                            offloaded.push(flow);
                            batch.offload(
                                Offload::packet(i)
                                    .source(IpAddr128::from_v4(self.public), Some(port))
                                    .idle_timeout_ns(self.offload_idle_ns)
                                    .without_counts(),
                            );
                        }
                        ok
                    }
                    None => {
                        refused += 1;
                        false
                    }
                },
                Dir::In { remote, remote_port, protocol, error, .. } => {
                    // Address- and port-dependent filtering (RFC 4787):
                    // only the remote the connection went to may answer;
                    // an error must quote a packet that went to it.
                    let b = found.map(|(_, b)| b).filter(|b| {
                        b.remote == remote && b.protocol == protocol && remote_port.is_none_or(|p| p == b.remote_port)
                    });
                    match (b, error) {
                        (Some(b), false) => Self::translate(batch, i, Endpoint::Destination, b.inside, b.inside_port),
                        (Some(b), true) => Self::translate_error(
                            batch,
                            i,
                            (Endpoint::Destination, b.inside),
                            (Endpoint::Source, b.inside, b.inside_port),
                        ),
                        (None, true) => {
                            unmatched += 1;
                            false
                        }
                        (None, false) => false,
                    }
                }
                // The port `reverse` named must still be bound to this
                // connection in the pool.
                Dir::ErrorOut { binding } => match found.filter(|(_, b)| *b == binding) {
                    Some((port, _)) => Self::translate_error(
                        batch,
                        i,
                        (Endpoint::Source, self.public),
                        (Endpoint::Destination, self.public, port),
                    ),
                    None => {
                        unmatched += 1;
                        false
                    }
                },
            };
            if !ok {
                batch.set_verdict(i, Verdict::Drop);
            }
        }
        let mut events = Vec::new();
        if refused > 0 {
            self.refused += refused;
            events.push(Event {
                kind: "nat.ports-exhausted".into(),
                level: Level::Warn,
                packet: None,
                fields: vec![("packets".into(), refused.to_string()), ("total".into(), self.refused.to_string())],
            });
        }
        if unmatched > 0 {
            self.unmatched += unmatched;
            events.push(Event {
                kind: "nat.icmp-unmatched".into(),
                level: Level::Info,
                packet: None,
                fields: vec![("packets".into(), unmatched.to_string()), ("total".into(), self.unmatched.to_string())],
            });
        }
        if !events.is_empty() {
            emit(&events);
        }
        Ok(())
    }

    fn expired(&mut self, _table: u32, entries: &[u8]) -> Result<(), String> {
        // Idle mappings: forget their reverse entries, give their ports back.
        let mut ports = Vec::new();
        let mut reverse: Vec<([u8; Binding::LEN], u16)> = Vec::new();
        let mut items = frames(entries);
        while let (Some(Ok(key)), Some(Ok(value))) = (items.next(), items.next()) {
            if let Some(k) = FlowKey::from_bytes(key)
                && let Ok(p) = <[u8; 2]>::try_from(value)
            {
                let port = u16::from_be_bytes(p);
                ports.push(u64::from(port));
                if let Some(b) = self.binding_of(&k) {
                    reverse.push((b.encode(), port));
                }
            }
        }
        if !reverse.is_empty() {
            self.forget_reverse(&reverse);
        }
        self.ports.release(&ports).map_err(|e| format!("nat: releasing ports: {e}"))
    }
}

impl Nat {
    /// Removes the reverse entries that still name the expired ports: the
    /// same connection may have taken a new port since (its mapping
    /// idled out, then it sent again), and that entry stays. Failures
    /// leave stale entries, which the pool check in `process` ignores.
    fn forget_reverse(&self, expired: &[([u8; Binding::LEN], u16)]) {
        let mut keys = Vec::with_capacity(expired.len() * 17);
        for (k, _) in expired {
            push_frame(&mut keys, k);
        }
        let current = match self.reverse.get_many(&keys) {
            Ok(v) => v,
            Err(e) => return sluice_sdk::log(Level::Warn, &format!("nat: reading reverse bindings: {e}")),
        };
        let mut removals = Vec::new();
        for ((k, port), v) in expired.iter().zip(frames(&current)) {
            if v.is_ok_and(|v| v == port.to_be_bytes()) {
                push_frame(&mut removals, k);
                push_frame(&mut removals, &[]);
            }
        }
        if !removals.is_empty()
            && let Err(e) = self.reverse.put_many(&removals)
        {
            sluice_sdk::log(Level::Warn, &format!("nat: forgetting reverse bindings: {e}"));
        }
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
