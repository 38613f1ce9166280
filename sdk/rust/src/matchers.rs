//! Matching helpers NFs share: address prefixes and port ranges as rules
//! write them (`10.0.0.0/8`, `2001:db8::/32`, `any`; `80`, `1024-65535`).

use sluice_wire::IpAddr128;

/// An address prefix; IPv4 prefixes are stored IPv4-mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: u128,
    mask: u128,
}

impl Cidr {
    /// Matches every address.
    pub fn any() -> Self {
        Cidr { net: 0, mask: 0 }
    }

    /// Parses `any`, an address, or `address/len` (IPv4 or IPv6). Errors
    /// name the bad part and, for host bits set, suggest the prefix.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "any" || s == "*" {
            return Ok(Cidr::any());
        }
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let ip: std::net::IpAddr = addr.parse().map_err(|_| format!("bad address '{addr}' in '{s}'"))?;
        let v4 = ip.is_ipv4();
        let max = if v4 { 32 } else { 128 };
        let len: u32 = match len {
            Some(l) => l.parse().map_err(|_| format!("bad prefix length '{l}' in '{s}'"))?,
            None => max,
        };
        if len > max {
            return Err(format!("prefix length {len} is longer than {max} in '{s}'"));
        }
        let bits = if v4 { len + 96 } else { len };
        let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
        let net = IpAddr128::from(ip).0;
        if net & !mask != 0 {
            return Err(format!("'{s}' has host bits set; did you mean '{}/{len}'?", IpAddr128(net & mask)));
        }
        Ok(Cidr { net, mask })
    }

    /// Whether the address is in the prefix.
    pub fn contains(&self, a: IpAddr128) -> bool {
        a.0 & self.mask == self.net
    }
}

/// An inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    lo: u16,
    hi: u16,
}

impl Ports {
    /// Every port.
    pub fn any() -> Self {
        Ports { lo: 0, hi: u16::MAX }
    }

    /// Parses `any`, a port, or an inclusive range `lo-hi`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "any" || s == "*" {
            return Ok(Ports { lo: 0, hi: u16::MAX });
        }
        let num = |p: &str| p.trim().parse::<u16>().map_err(|_| format!("bad port '{p}' in '{s}'"));
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(s)?, num(s)?),
        };
        if lo > hi {
            return Err(format!("port range '{s}' is empty (start after end)"));
        }
        Ok(Ports { lo, hi })
    }

    /// Whether the port is in the range.
    pub fn contains(&self, p: u16) -> bool {
        (self.lo..=self.hi).contains(&p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(IpAddr128::from_v4([10, 9, 8, 7])));
        assert!(!c.contains(IpAddr128::from_v4([11, 0, 0, 0])));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(IpAddr128::from_v4([1, 2, 3, 4])));
        assert!(
            !Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains(IpAddr128::from_v6([0x20, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]))
        );
        assert!(Cidr::parse("10.0.0.1/8").unwrap_err().contains("10.0.0.0/8"));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
    }

    #[test]
    fn ports() {
        let p = Ports::parse("1024-2048").unwrap();
        assert!(p.contains(1024) && p.contains(2048) && !p.contains(80));
        assert!(Ports::parse("9-1").is_err());
        assert!(Ports::any().contains(0));
    }
}
