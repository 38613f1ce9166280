//! Traffic attachments: which of a host's packets belong to which
//! deployment, decided once per packet before any NF runs.
//!
//! An [`Attachment`] names an ingress port and, optionally, an 802.1Q
//! VLAN id and a destination IPv4/IPv6 prefix; a deployment has one or
//! more. A [`Classifier`] holds the attachments of every deployment of a
//! host and gives each packet to at most one of them: the most specific
//! match (a VLAN counts one, a prefix its length), ties to the first
//! listed. Packets no attachment matches are the host's (see
//! [`Unmatched`]); no tenant sees or pays for them.
//!
//! Two attachments [`overlap`](Attachment::overlaps) when one packet could
//! match both: the gateway refuses such pairs in a group, so on a host
//! every packet has one owner whatever the precedence.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use sluice_runtime::RawPacket;
use sluice_wire::ethernet::{EthernetFrame, ethertype};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Highest 802.1Q VLAN id (4095 is reserved).
pub const MAX_VLAN: u16 = 4094;
/// The VLAN of a malformed tagged frame: no attachment names it.
const NO_VLAN: u16 = 0xffff;

/// Which packets of a host a deployment gets, and where its forwarded
/// packets leave.
///
/// Text form (CLI, docs): `port=0,vlan=100,dst=10.1.0.0/16,out=1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    /// Ingress port (the DPDK port id; a capture's packets come in on
    /// port 0 unless it says otherwise).
    pub port: u16,
    /// 802.1Q VLAN id of the outer tag: `1..=4094` for that VLAN, `0` for
    /// untagged (and priority-tagged) frames only; none: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Destination address prefix (IPv4 or IPv6); none: any packet,
    /// IP or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<IpNet>,
    /// Port forwarded packets leave by when the NF does not name one;
    /// none: the host's default (the paired port, or the ingress port).
    /// Tags are kept either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<u16>,
    /// Which side of the deployment's chain its packets come from: those
    /// of an `outside` attachment (replies, e.g. to a NAT's public
    /// address) run a linear chain last NF first (see
    /// [`sluice_runtime::Chain::set_outside`]). The side is per ingress
    /// port: one port cannot be both sides of one deployment.
    #[serde(default, skip_serializing_if = "Side::is_inside")]
    pub side: Side,
}

/// The side of a chain an attachment's packets come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// Connections are opened from here: the chain runs in order.
    #[default]
    Inside,
    /// Replies come from here: a linear chain runs in reverse.
    Outside,
}

impl Side {
    /// Whether it is the default side.
    pub fn is_inside(&self) -> bool {
        *self == Side::Inside
    }
}

impl FromStr for Side {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inside" => Ok(Side::Inside),
            "outside" => Ok(Side::Outside),
            other => Err(format!("side '{other}': give inside or outside")),
        }
    }
}

/// The ingress ports of `attachments` on the outside (see [`Side`]), or
/// why they cannot be: a port that is both sides.
pub fn outside_ports(attachments: &[Attachment]) -> Result<Vec<u16>, String> {
    let mut out: Vec<u16> = attachments.iter().filter(|a| a.side == Side::Outside).map(|a| a.port).collect();
    out.sort_unstable();
    out.dedup();
    if let Some(p) = attachments.iter().find(|a| a.side == Side::Inside && out.contains(&a.port)).map(|a| a.port) {
        return Err(format!(
            "port {p} is attached both inside and outside: the side of a packet is its ingress port's, so give each side its own port"
        ));
    }
    Ok(out)
}

/// A malformed or out-of-range attachment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachmentError {
    /// Text that is not `key=value,…` with known keys.
    #[error(
        "attachment '{text}': {reason} (expected e.g. port=0,vlan=100,dst=10.0.0.0/8,out=1 or port=1,dst=203.0.113.1/32,out=0,side=outside)"
    )]
    Syntax {
        /// The text given.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// A VLAN id over 4094.
    #[error("attachment: VLAN {0} is out of range (0 for untagged, 1..=4094)")]
    Vlan(u16),
    /// A prefix with host bits set (`10.0.0.1/8`).
    #[error("attachment: prefix {0} has bits set past its length; write {1}")]
    Prefix(IpNet, IpNet),
}

impl Attachment {
    /// Checks the ranges: VLAN id, canonical prefix.
    pub fn validate(&self) -> Result<(), AttachmentError> {
        if let Some(v) = self.vlan
            && v > MAX_VLAN
        {
            return Err(AttachmentError::Vlan(v));
        }
        if let Some(p) = self.dst
            && p.trunc() != p
        {
            return Err(AttachmentError::Prefix(p, p.trunc()));
        }
        Ok(())
    }

    /// Whether one packet could match both (so two tenants would share it).
    pub fn overlaps(&self, other: &Attachment) -> bool {
        let vlan = match (self.vlan, other.vlan) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        let dst = match (self.dst, other.dst) {
            (Some(a), Some(b)) => a.contains(&b) || b.contains(&a),
            _ => true,
        };
        self.port == other.port && vlan && dst
    }

    /// How specific a match is: more specific attachments win.
    fn specificity(&self) -> u16 {
        u16::from(self.vlan.is_some()) * 256 + self.dst.map(|p| u16::from(p.prefix_len())).unwrap_or(0)
    }

    /// Whether a packet with these headers matches.
    fn matches(&self, h: &Headers) -> bool {
        if self.port != h.port {
            return false;
        }
        if !self.takes_vlan(h.vlan) {
            return false;
        }
        match (self.dst, h.dst) {
            (None, _) => true,
            (Some(p), Some(a)) => p.contains(&a),
            (Some(_), None) => false,
        }
    }
}

impl fmt::Display for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port={}", self.port)?;
        if let Some(v) = self.vlan {
            write!(f, ",vlan={v}")?;
        }
        if let Some(p) = self.dst {
            write!(f, ",dst={p}")?;
        }
        if let Some(o) = self.out {
            write!(f, ",out={o}")?;
        }
        if self.side == Side::Outside {
            write!(f, ",side=outside")?;
        }
        Ok(())
    }
}

impl FromStr for Attachment {
    type Err = AttachmentError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| AttachmentError::Syntax { text: text.chars().take(200).collect(), reason };
        let mut port = None;
        let mut a = Attachment { port: 0, vlan: None, dst: None, out: None, side: Side::Inside };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            let num = |what: &str| v.parse::<u16>().map_err(|e| bad(format!("{what} '{v}': {e}")));
            match k.trim() {
                "port" => port = Some(num("port")?),
                "vlan" => a.vlan = Some(num("vlan")?),
                "dst" => a.dst = Some(v.parse().map_err(|e| bad(format!("dst '{v}': {e}")))?),
                "out" => a.out = Some(num("out")?),
                "side" => a.side = v.trim().parse().map_err(bad)?,
                other => return Err(bad(format!("unknown key '{other}' (port, vlan, dst, out, side)"))),
            }
        }
        a.port = port.ok_or_else(|| bad("no port=".into()))?;
        a.validate()?;
        Ok(a)
    }
}

/// The VLAN id of a frame's outer 802.1Q/802.1ad tag (`0` for a
/// priority tag), or none for an untagged frame.
pub fn outer_vlan(frame: &[u8]) -> Option<u16> {
    let ethertype = frame.get(12..14).and_then(|t| <[u8; 2]>::try_from(t).ok()).map(u16::from_be_bytes)?;
    if ethertype != ethertype::VLAN && ethertype != ethertype::QINQ {
        return None;
    }
    // A tag cut short is nobody's VLAN.
    Some(
        frame.get(14..16).and_then(|t| <[u8; 2]>::try_from(t).ok()).map_or(NO_VLAN, |t| u16::from_be_bytes(t) & 0x0fff),
    )
}

impl Attachment {
    /// Whether packets carrying outer VLAN `vlan` (none: untagged) are of
    /// this attachment's traffic, as far as the tag goes.
    pub fn takes_vlan(&self, vlan: Option<u16>) -> bool {
        match self.vlan {
            None => true,
            Some(0) => vlan.is_none_or(|v| v == 0),
            Some(v) => vlan == Some(v),
        }
    }
}

/// What a host does with packets no attachment matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unmatched {
    /// Drop them (the default: nobody asked for them).
    #[default]
    Drop,
    /// Send them on unchanged (out of the paired or ingress port).
    Forward,
}

impl FromStr for Unmatched {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "drop" => Ok(Unmatched::Drop),
            "forward" => Ok(Unmatched::Forward),
            other => Err(format!("unmatched traffic policy '{other}' is not drop or forward")),
        }
    }
}

/// The headers a classifier looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Headers {
    port: u16,
    vlan: Option<u16>,
    dst: Option<IpAddr>,
}

impl Headers {
    /// The headers of `p`; the destination address only if `l3`.
    fn of(p: &RawPacket<'_>, l3: bool) -> Headers {
        let mut h = Headers { port: p.ingress_port, vlan: None, dst: None };
        let Ok(frame) = EthernetFrame::new_checked(p.data) else { return h };
        let Ok((ethertype, offset, vlan)) = frame.network() else {
            // A tag cut short or too many tags: never untagged traffic.
            // The outer tag's VLAN if it is there, else one no attachment
            // names (only any-VLAN attachments take it).
            let outer =
                p.data.get(14..16).and_then(|t| <[u8; 2]>::try_from(t).ok()).map(|t| u16::from_be_bytes(t) & 0x0fff);
            h.vlan = Some(outer.filter(|&v| v != 0).unwrap_or(NO_VLAN));
            return h;
        };
        h.vlan = vlan;
        if !l3 {
            return h;
        }
        let l3 = p.data.get(offset..).unwrap_or(&[]);
        h.dst = match ethertype {
            ethertype::IPV4 => sluice_wire::ipv4::Ipv4Packet::new_checked(l3).ok().map(|ip| IpAddr::from(ip.dst())),
            ethertype::IPV6 => sluice_wire::ipv6::Ipv6Packet::new_checked(l3).ok().map(|ip| IpAddr::from(ip.dst())),
            _ => None,
        };
        h
    }
}

/// Rules of one ingress port and VLAN (`None`: any VLAN), each with its
/// owner's index, longest prefix first.
type Buckets = foldhash::HashMap<(u16, Option<u16>), Vec<(usize, Attachment)>>;

/// The attachments of a host's deployments, each with its owner's index.
///
/// Rules are kept in buckets by ingress port and VLAN (a VLAN id, `0` for
/// untagged, or any), so a packet is checked against the rules of at most
/// two buckets — its own VLAN's and the port's any-VLAN rules — however
/// many deployments the host runs; within a bucket the longest prefix
/// wins.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    /// (port, VLAN) → (owner, attachment), longest prefix first; ties
    /// keep their order.
    buckets: Buckets,
    /// Whether any attachment names a prefix (else no packet's network
    /// header is read).
    l3: bool,
    /// Whether any attachment names a VLAN (else no frame is parsed).
    l2: bool,
}

impl Classifier {
    /// A classifier over `(owner, attachment)` pairs, in precedence order
    /// for ties.
    pub fn new(rules: impl IntoIterator<Item = (usize, Attachment)>) -> Self {
        let mut buckets = Buckets::default();
        let (mut l2, mut l3) = (false, false);
        for (owner, a) in rules {
            l2 |= a.vlan.is_some();
            l3 |= a.dst.is_some();
            buckets.entry((a.port, a.vlan)).or_default().push((owner, a));
        }
        for rules in buckets.values_mut() {
            rules.sort_by_key(|(_, a)| std::cmp::Reverse(a.specificity()));
        }
        Classifier { buckets, l3, l2: l2 || l3 }
    }

    /// Whether no attachment is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The owner of a packet and the attachment it matched, if any.
    pub fn classify(&self, p: &RawPacket<'_>) -> Option<(usize, &Attachment)> {
        if self.buckets.is_empty() {
            return None;
        }
        let h = if self.l2 { Headers::of(p, self.l3) } else { Headers { port: p.ingress_port, vlan: None, dst: None } };
        // Its VLAN's rules (a VLAN is more specific than any prefix), then
        // the port's rules for any VLAN.
        let tag = Some(h.vlan.filter(|&v| v != 0).unwrap_or(0));
        [(h.port, tag), (h.port, None)]
            .iter()
            .filter_map(|k| self.buckets.get(k))
            .find_map(|rules| rules.iter().find(|(_, a)| a.matches(&h)))
            .map(|(o, a)| (*o, a))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    fn frame(vlan: Option<u16>, dst: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        if let Some(v) = vlan {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1];
        ip.extend_from_slice(&dst);
        f.extend_from_slice(&ip);
        f
    }

    fn pkt(data: &[u8], port: u16) -> RawPacket<'_> {
        RawPacket { data, wire_len: data.len() as u32, timestamp_ns: 0, ingress_port: port }
    }

    #[test]
    fn an_outside_attachment_round_trips_and_a_port_has_one_side() {
        let a: Attachment = "port=1,dst=203.0.113.1/32,out=0,side=outside".parse().unwrap();
        assert_eq!(a.side, Side::Outside);
        assert_eq!(a.to_string(), "port=1,dst=203.0.113.1/32,out=0,side=outside");
        let inside: Attachment = "port=0,out=1".parse().unwrap();
        assert_eq!(outside_ports(&[inside, a]), Ok(vec![1]));
        let both: Attachment = "port=1,vlan=7".parse().unwrap();
        assert!(outside_ports(&[inside, a, both]).unwrap_err().contains("port 1 is attached both inside and outside"));
        assert!("port=1,side=up".parse::<Attachment>().unwrap_err().to_string().contains("inside or outside"));
    }

    #[test]
    fn text_round_trips_and_refuses_nonsense() {
        let a: Attachment = "port=0,vlan=100,dst=10.1.0.0/16,out=1".parse().unwrap();
        assert_eq!(a.to_string(), "port=0,vlan=100,dst=10.1.0.0/16,out=1");
        assert_eq!(a.to_string().parse::<Attachment>().unwrap(), a);
        for bad in ["", "vlan=1", "port=x", "port=0,vlan=4095", "port=0,dst=10.0.0.1/8", "port=0,colour=red", "port"] {
            assert!(bad.parse::<Attachment>().is_err(), "{bad}");
        }
    }

    #[test]
    fn each_packet_goes_to_its_vlan_and_prefix() {
        let c = Classifier::new([
            (0, "port=0,vlan=100".parse().unwrap()),
            (1, "port=0,vlan=200".parse().unwrap()),
            (2, "port=0,vlan=0,dst=192.168.0.0/16".parse().unwrap()),
            (3, "port=1".parse().unwrap()),
        ]);
        let owner = |vlan, dst, port| {
            let f = frame(vlan, dst);
            c.classify(&pkt(&f, port)).map(|(o, _)| o)
        };
        assert_eq!(owner(Some(100), [1, 2, 3, 4], 0), Some(0));
        assert_eq!(owner(Some(200), [1, 2, 3, 4], 0), Some(1));
        assert_eq!(owner(None, [192, 168, 3, 4], 0), Some(2));
        assert_eq!(owner(None, [10, 0, 0, 1], 0), None);
        assert_eq!(owner(Some(300), [192, 168, 3, 4], 0), None);
        assert_eq!(owner(Some(300), [1, 1, 1, 1], 1), Some(3));
        // Runts and non-IP frames match only attachments without a prefix.
        assert_eq!(c.classify(&pkt(&[0u8; 5], 1)).map(|(o, _)| o), Some(3));
        assert_eq!(c.classify(&pkt(&[0u8; 5], 0)).map(|(o, _)| o), None);
    }

    #[test]
    fn malformed_tags_are_never_taken_for_untagged_traffic() {
        let c = Classifier::new([(0, "port=0,vlan=0".parse().unwrap()), (1, "port=0,vlan=100".parse().unwrap())]);
        // Three tags (the parser refuses more than two): the outer one counts.
        let mut f = vec![0u8; 12];
        for _ in 0..3 {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 100]);
        }
        f.extend_from_slice(&[0x08, 0x00, 0x45]);
        assert_eq!(c.classify(&pkt(&f, 0)).map(|(o, _)| o), Some(1));
        // A tag cut short: nobody's VLAN, and not untagged.
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00, 0x00]);
        assert_eq!(c.classify(&pkt(&f, 0)).map(|(o, _)| o), None);
        let any = Classifier::new([(7, "port=0".parse().unwrap())]);
        assert_eq!(any.classify(&pkt(&f, 0)).map(|(o, _)| o), Some(7));
    }

    #[test]
    fn outer_tags_and_the_attachments_that_take_them() {
        assert_eq!(outer_vlan(&frame(None, [1, 2, 3, 4])), None);
        assert_eq!(outer_vlan(&frame(Some(100), [1, 2, 3, 4])), Some(100));
        assert_eq!(outer_vlan(&[0u8; 5]), None);
        let mut cut = vec![0u8; 12];
        cut.extend_from_slice(&[0x81, 0x00, 0x00]);
        assert_eq!(outer_vlan(&cut), Some(NO_VLAN));
        let a: Attachment = "port=0,vlan=100".parse().unwrap();
        assert!(a.takes_vlan(Some(100)) && !a.takes_vlan(Some(200)) && !a.takes_vlan(None));
        let u: Attachment = "port=0,vlan=0".parse().unwrap();
        assert!(u.takes_vlan(None) && u.takes_vlan(Some(0)) && !u.takes_vlan(Some(100)));
        let any: Attachment = "port=0".parse().unwrap();
        assert!(any.takes_vlan(Some(NO_VLAN)) && any.takes_vlan(None));
    }

    #[test]
    fn the_most_specific_attachment_wins() {
        let c = Classifier::new([
            (0, "port=0".parse().unwrap()),
            (1, "port=0,dst=10.0.0.0/8".parse().unwrap()),
            (2, "port=0,vlan=7".parse().unwrap()),
            (3, "port=0,vlan=7,dst=10.9.0.0/16".parse().unwrap()),
        ]);
        let owner = |vlan, dst| {
            let f = frame(vlan, dst);
            c.classify(&pkt(&f, 0)).map(|(o, _)| o)
        };
        assert_eq!(owner(None, [10, 9, 9, 9]), Some(1));
        assert_eq!(owner(None, [11, 9, 9, 9]), Some(0));
        assert_eq!(owner(Some(7), [11, 9, 9, 9]), Some(2));
        assert_eq!(owner(Some(7), [10, 9, 9, 9]), Some(3));
        assert_eq!(owner(Some(8), [10, 9, 9, 9]), Some(1));
    }

    fn attachment() -> impl Strategy<Value = Attachment> {
        (0u16..2, prop::option::of(0u16..4), prop::option::of((0u8..4, 0u8..=16))).prop_map(|(port, vlan, dst)| {
            let dst = dst.map(|(b, len)| IpNet::new(IpAddr::from([10, b, 0, 0]), len).unwrap().trunc());
            Attachment { port, vlan, dst, out: None, side: Side::Inside }
        })
    }

    proptest! {
        /// The bucketed classifier gives every packet to the rule a plain
        /// scan would: the most specific match, ties to the first listed.
        #[test]
        fn buckets_agree_with_a_plain_scan(rules in prop::collection::vec(attachment(), 0..10), port in 0u16..2,
                                           vlan in prop::option::of(0u16..4), dst in any::<[u8; 2]>()) {
            let f = frame(vlan, [10, dst[0] % 4, dst[1], 1]);
            let p = pkt(&f, port);
            let h = Headers::of(&p, true);
            let mut best: Option<(usize, u16)> = None;
            for (i, a) in rules.iter().enumerate() {
                if a.matches(&h) && best.is_none_or(|(_, s)| a.specificity() > s) {
                    best = Some((i, a.specificity()));
                }
            }
            let c = Classifier::new(rules.iter().copied().enumerate());
            prop_assert_eq!(c.classify(&p).map(|(o, _)| o), best.map(|(i, _)| i));
        }

        /// Attachments that do not overlap never both match one packet,
        /// and overlapping ones are caught: a packet two attachments match
        /// proves they overlap.
        #[test]
        fn matching_both_implies_overlap(a in attachment(), b in attachment(), port in 0u16..2,
                                         vlan in prop::option::of(0u16..4), dst in any::<[u8; 2]>()) {
            let f = frame(vlan, [10, dst[0] % 4, dst[1], 1]);
            let h = Headers::of(&pkt(&f, port), true);
            if a.matches(&h) && b.matches(&h) {
                prop_assert!(a.overlaps(&b) && b.overlaps(&a));
            }
        }
    }
}
