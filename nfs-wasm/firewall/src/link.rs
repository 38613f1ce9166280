//! Link protocols: what the hosts on one link exchange so that they can
//! talk at all — ARP for IPv4; ICMPv6 router and neighbour discovery and
//! multicast listener discovery for IPv6. A firewall in the middle of a
//! link that drops them cuts the link whatever its rules allow, so they
//! pass by default (`allow-link-protocols`), as a bridge's filter or a
//! transparent firewall lets them through (RFC 4890 lists the ICMPv6 ones
//! among the messages a bridging firewall must not drop): a rule for them
//! would have to allow link-local and multicast ranges to every port.
//!
//! Each is recognised by what its RFC requires of it on the link, so a
//! packet routed from elsewhere does not pass as one: neighbour and router
//! discovery arrive with hop limit 255 (RFC 4861, a router on the way
//! would have lowered it), multicast listener discovery with hop limit 1
//! from a link-local or unspecified source (RFC 2710, RFC 3810).

use sluice_sdk::Packet;
use sluice_sdk::wire::ethernet::{EthernetFrame, ethertype};

/// Length of an ARP packet for IPv4 over Ethernet.
const ARP_LEN: usize = 28;

/// Router solicitation and advertisement, neighbour solicitation and
/// advertisement (RFC 4861). Redirects (137) are left to the rules: they
/// change a host's route, not only whom it can reach.
const NDP_TYPES: std::ops::RangeInclusive<u8> = 133..=136;

/// Multicast listener query, report and done (MLDv1, RFC 2710) and the
/// MLDv2 report (RFC 3810).
const MLD_TYPES: [u8; 4] = [130, 131, 132, 143];

/// Whether `p` (an ICMPv6 packet) is router or neighbour discovery or
/// multicast listener discovery sent on its link.
pub fn is_icmpv6_link(p: &Packet<'_>) -> bool {
    let (Some(ip), Some(icmp)) = (p.ipv6(), p.icmp()) else { return false };
    let (kind, hops) = (icmp.msg_type(), ip.hop_limit());
    if NDP_TYPES.contains(&kind) {
        return hops == 255 && icmp.msg_code() == 0;
    }
    let src = ip.src();
    let link_local = src[0] == 0xfe && src[1] & 0xc0 == 0x80;
    MLD_TYPES.contains(&kind) && hops == 1 && (link_local || src == [0; 16])
}

/// Whether `p` is an ARP request or reply for IPv4 over Ethernet (behind
/// VLAN tags or not). Another hardware or protocol type, or a cut-off
/// packet, is not.
pub fn is_arp(p: &Packet<'_>) -> bool {
    let Ok((kind, at, _)) = EthernetFrame::new_checked(p.bytes()).and_then(|f| f.network()) else {
        return false;
    };
    let Some(arp) = p.bytes().get(at..at + ARP_LEN) else { return false };
    // Hardware type Ethernet (1), protocol IPv4, address lengths 6 and 4,
    // operation request (1) or reply (2).
    kind == ethertype::ARP
        && arp.get(..7) == Some(&[0, 1, 0x08, 0x00, 6, 4, 0][..])
        && matches!(arp.get(7), Some(1 | 2))
}
