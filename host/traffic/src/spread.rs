//! How a host spreads packets over its workers.

use sluice_wire::FlowKey;

/// How a host spreads packets over its workers, which says what meets on
/// one worker: per-flow state always does (both directions of a
/// connection), and state an NF keys by something coarser (an address)
/// does when packets are spread by it. A single-writer table's reads see
/// another worker's writes only after a sync; writes and reads on one
/// worker see each other at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Spread {
    /// By connection (the symmetric hash of the 5-tuple): both directions
    /// of a connection meet on one worker; two connections between the
    /// same hosts usually do not. The most even spread.
    #[default]
    Flow,
    /// By host pair (the symmetric hash of the two IP addresses): every
    /// connection between the same two hosts, both ways, meets on one
    /// worker, so state keyed by either address of the pair (a knock
    /// sequence, a guard of one client towards one server) is read and
    /// written on one worker. DPDK ports with RSS hash IP addresses only
    /// (`RTE_ETH_RSS_IP`, testpmd's `--rss-ip`). Less even when a few host
    /// pairs carry most of the traffic.
    Addresses,
}

impl Spread {
    /// Its name in configuration and APIs.
    pub fn name(self) -> &'static str {
        match self {
            Spread::Flow => "flow",
            Spread::Addresses => "addresses",
        }
    }

    /// The hash a packet of flow `key` is spread by (the same both ways).
    pub fn hash(self, key: &FlowKey) -> u64 {
        match self {
            Spread::Flow => key.symmetric_hash(),
            Spread::Addresses => key.address_hash(),
        }
    }

    /// The worker of `workers` a packet of flow `key` goes to.
    pub fn worker(self, key: &FlowKey, workers: usize) -> usize {
        (self.hash(key) % workers.max(1) as u64) as usize
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Spread {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "flow" => Ok(Spread::Flow),
            "addresses" => Ok(Spread::Addresses),
            other => Err(format!("unknown spread '{other}': use 'flow' or 'addresses'")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::IpAddr128;

    fn key(a: u8, b: u8, sp: u16, dp: u16) -> FlowKey {
        FlowKey {
            src: IpAddr128::from_v4([10, 0, 0, a]),
            dst: IpAddr128::from_v4([10, 0, 1, b]),
            src_port: sp,
            dst_port: dp,
            protocol: 6,
        }
    }

    #[test]
    fn addresses_put_every_connection_of_a_host_pair_on_one_worker() {
        for w in [2, 3, 16] {
            let first = Spread::Addresses.worker(&key(5, 9, 40000, 7000), w);
            for (sp, dp) in [(40001, 8000), (40002, 9000), (40003, 22)] {
                assert_eq!(Spread::Addresses.worker(&key(5, 9, sp, dp), w), first);
                assert_eq!(Spread::Addresses.worker(&key(5, 9, sp, dp).reversed(), w), first);
            }
        }
        // By flow, the same four connections do not all meet.
        let workers: std::collections::BTreeSet<usize> =
            (0..64).map(|i| Spread::Flow.worker(&key(5, 9, 40000 + i, 7000), 4)).collect();
        assert!(workers.len() > 1);
    }

    #[test]
    fn names_parse_and_print() {
        for s in [Spread::Flow, Spread::Addresses] {
            assert_eq!(s.name().parse::<Spread>(), Ok(s));
            assert_eq!(s.to_string(), s.name());
        }
        assert!("5-tuple".parse::<Spread>().unwrap_err().contains("'flow' or 'addresses'"));
    }
}
