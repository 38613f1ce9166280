//! Attachments: which of a host's packets a deployment gets, and where
//! its forwarded packets leave.
//!
//! An [`Attachment`] names an ingress port and, optionally, an 802.1Q
//! VLAN id and a destination IPv4/IPv6 prefix; a deployment has one or
//! more. Two attachments [`overlap`](Attachment::overlaps) when one packet
//! could match both: the gateway refuses such pairs in a group, so on a
//! host every packet has one owner. The engine's classifier matches
//! packets against them.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Highest 802.1Q VLAN id (4095 is reserved).
pub const MAX_VLAN: u16 = 4094;
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
    /// `Chain::set_outside` in `sluice-runtime`). The side is per ingress
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

    /// How specific a match is: more specific attachments win (a VLAN
    /// counts 256, a prefix its length).
    pub fn specificity(&self) -> u16 {
        u16::from(self.vlan.is_some()) * 256 + self.dst.map(|p| u16::from(p.prefix_len())).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
}
