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

use serde::{Deserialize, Serialize};
use sluice_runtime::RawPacket;
pub use sluice_traffic::{Attachment, AttachmentError, MAX_VLAN, Side, outside_ports};
use sluice_wire::ethernet::{EthernetFrame, ethertype};
use std::net::IpAddr;
use std::str::FromStr;

/// The VLAN of a malformed tagged frame: no attachment names it.
const NO_VLAN: u16 = 0xffff;

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

/// What a host does with packets no attachment matches.
/// The outer VLAN of an untagged or singly tagged frame as
/// [`Headers::of`] reads it (`Some(None)`: untagged), or `None` for any
/// other frame (too short, two tags or more), which takes the full read.
fn simple_vlan(frame: &[u8]) -> Option<Option<u16>> {
    let u16_at = |at: usize| frame.get(at..at + 2).and_then(|b| <[u8; 2]>::try_from(b).ok()).map(u16::from_be_bytes);
    let tagged = |t: u16| t == ethertype::VLAN || t == ethertype::QINQ;
    let outer = u16_at(12)?;
    if !tagged(outer) {
        return Some(None);
    }
    if tagged(u16_at(16)?) {
        return None;
    }
    Some(Some(u16_at(14)? & 0x0fff))
}

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

/// Whether a packet with headers `h` matches `a`.
fn matches(a: &Attachment, h: &Headers) -> bool {
    if a.port != h.port || !a.takes_vlan(h.vlan) {
        return false;
    }
    match (a.dst, h.dst) {
        (None, _) => true,
        (Some(p), Some(addr)) => p.contains(&addr),
        (Some(_), None) => false,
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

    /// When no attachment names a prefix, a packet's owner depends on its
    /// ingress port and outer VLAN alone: that pair (read without a full
    /// parse for an untagged or singly tagged frame), for a caller to
    /// remember owners by. `None` when a prefix is named.
    pub fn l2_key(&self, p: &RawPacket<'_>) -> Option<(u16, Option<u16>)> {
        if self.l3 {
            return None;
        }
        if !self.l2 {
            return Some((p.ingress_port, None));
        }
        Some((p.ingress_port, simple_vlan(p.data).unwrap_or_else(|| Headers::of(p, false).vlan)))
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
            .find_map(|rules| rules.iter().find(|(_, a)| matches(a, &h)))
            .map(|(o, a)| (*o, a))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use ipnet::IpNet;
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

    proptest! {
        #[test]
        fn the_cheap_vlan_read_is_the_full_one(
            body in proptest::collection::vec(any::<u8>(), 0..40),
            tags in proptest::collection::vec((prop_oneof![Just(0x8100u16), Just(0x88a8u16)], any::<u16>()), 0..4),
            cut in 0usize..30,
        ) {
            let mut f = vec![0u8; 12];
            for (t, tci) in &tags {
                f.extend_from_slice(&t.to_be_bytes());
                f.extend_from_slice(&tci.to_be_bytes());
            }
            f.extend_from_slice(&body);
            f.truncate(f.len().saturating_sub(cut));
            let p = pkt(&f, 3);
            if let Some(v) = simple_vlan(&f) {
                prop_assert_eq!(v, Headers::of(&p, false).vlan);
            }
            let c = Classifier::new([(0, "port=3,vlan=100".parse().unwrap())]);
            prop_assert_eq!(c.l2_key(&p), Some((3, Headers::of(&p, false).vlan)));
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
                if matches(a, &h) && best.is_none_or(|(_, s)| a.specificity() > s) {
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
            if matches(&a, &h) && matches(&b, &h) {
                prop_assert!(a.overlaps(&b) && b.overlaps(&a));
            }
        }
    }
}
