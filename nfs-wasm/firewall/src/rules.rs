//! The firewall's configuration: rules and how they match.

use serde::Deserialize;
use sluice_sdk::FlowKey;
use sluice_sdk::matchers::{Cidr, Ports};

/// What a rule (or the default) does with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let it through and remember it, so replies pass.
    Allow,
    /// Drop it.
    Deny,
}

/// One rule, as compiled from config.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Allow or deny.
    pub action: Action,
    /// Label given to the packets of connections this rule allows, so a
    /// chain can send them to another NF (e.g. an IDS).
    pub label: Option<u16>,
    protocol: Option<u8>,
    src: Cidr,
    dst: Cidr,
    src_ports: Ports,
    dst_ports: Ports,
}

impl Rule {
    fn matches(&self, k: &FlowKey) -> bool {
        self.protocol.is_none_or(|p| p == k.protocol)
            && self.src.contains(k.src)
            && self.dst.contains(k.dst)
            && self.src_ports.contains(k.src_port)
            && self.dst_ports.contains(k.dst_port)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRule {
    action: Action,
    #[serde(default)]
    label: Option<u16>,
    #[serde(default = "any")]
    proto: String,
    #[serde(default = "any")]
    src: String,
    #[serde(default = "any")]
    dst: String,
    #[serde(default = "any")]
    src_ports: String,
    #[serde(default = "any")]
    dst_ports: String,
}

fn any() -> String {
    "any".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    #[serde(default = "deny")]
    default: Action,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    allow_non_ip: bool,
    #[serde(default = "yes")]
    allow_link_protocols: bool,
    #[serde(default)]
    log_denied: bool,
    #[serde(default)]
    idle_timeout_s: Option<u64>,
    #[serde(default = "yes")]
    related_icmp: bool,
    #[serde(default = "default_related_capacity")]
    related_capacity: u32,
    #[serde(default)]
    offload: bool,
    #[serde(default = "default_offload_after")]
    offload_after: u32,
}

fn default_offload_after() -> u32 {
    DEFAULT_OFFLOAD_AFTER
}

fn deny() -> Action {
    Action::Deny
}

fn yes() -> bool {
    true
}

fn default_related_capacity() -> u32 {
    DEFAULT_RELATED_CAPACITY
}

/// The established packets a connection's direction carries before it is
/// offloaded, by default: a short exchange (a request and its answer) ends
/// before its entries would have paid for themselves (docs/benchmarks.md,
/// "Flow offload").
pub const DEFAULT_OFFLOAD_AFTER: u32 = 4;

/// Open connections the `connections` table indexes for ICMP errors by
/// default: 262,144 entries of about 88 bytes (a 37-byte key, up to 3
/// bytes of value, the host's 48 bytes per entry) are 23 MiB of the NF's
/// 64 MiB state budget.
pub const DEFAULT_RELATED_CAPACITY: u32 = 1 << 18;

/// The host's default idle timeout of flow state, which `connections`
/// follows when the config sets none.
const HOST_DEFAULT_IDLE_S: u64 = 120;

/// The parsed configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Action for connections no rule matches.
    pub default: Action,
    /// Rules, first match wins.
    pub rules: Vec<Rule>,
    /// Whether non-IP frames pass (ARP too, when it does not pass as a
    /// link protocol).
    pub allow_non_ip: bool,
    /// Whether link protocols (ARP, ICMPv6 router, neighbour and multicast
    /// listener discovery on the link) pass without a rule.
    pub allow_link_protocols: bool,
    /// Whether a denied new connection emits a `firewall.deny` event.
    pub log_denied: bool,
    /// Whether ICMP errors about a known connection pass whatever the
    /// rules say.
    pub related_icmp: bool,
    /// Most connections indexed for ICMP errors (the `connections` table).
    pub related_capacity: u32,
    /// Whether established connections are offloaded to the host: their
    /// packets then pass without a call until FIN or RST.
    pub offload: bool,
    /// Each direction is offloaded at its `offload_after`th established
    /// packet (0 and 1: its first).
    pub offload_after: u32,
    idle_timeout_s: Option<u64>,
}

impl Config {
    /// Parses the JSON configuration the host passes (the `[nf.<name>.config]`
    /// table of the host config). Empty input means "deny everything".
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let raw: RawConfig = if bytes.iter().all(u8::is_ascii_whitespace) {
            serde_json::from_str("{}").map_err(|e| e.to_string())?
        } else {
            serde_json::from_slice(bytes).map_err(|e| format!("firewall config: {e}"))?
        };
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (n, r) in raw.rules.into_iter().enumerate() {
            let at = |e: String| format!("firewall config: rule {}: {e}", n + 1);
            let protocol = match r.proto.to_ascii_lowercase().as_str() {
                "any" | "*" => None,
                "tcp" => Some(6),
                "udp" => Some(17),
                "icmp" => Some(1),
                "icmpv6" => Some(58),
                other => Some(other.parse::<u8>().map_err(|_| {
                    at(format!("unknown protocol '{other}' (use tcp, udp, icmp, icmpv6, any or a number)"))
                })?),
            };
            if r.label.is_some() && r.action == Action::Deny {
                return Err(at("a label only makes sense on an allow rule".into()));
            }
            rules.push(Rule {
                action: r.action,
                label: r.label,
                protocol,
                src: Cidr::parse(&r.src).map_err(at)?,
                dst: Cidr::parse(&r.dst).map_err(at)?,
                src_ports: Ports::parse(&r.src_ports).map_err(at)?,
                dst_ports: Ports::parse(&r.dst_ports).map_err(at)?,
            });
        }
        Ok(Config {
            default: raw.default,
            rules,
            allow_non_ip: raw.allow_non_ip,
            allow_link_protocols: raw.allow_link_protocols,
            log_denied: raw.log_denied,
            related_icmp: raw.related_icmp,
            related_capacity: raw.related_capacity,
            offload: raw.offload,
            offload_after: raw.offload_after,
            idle_timeout_s: raw.idle_timeout_s,
        })
    }

    /// The first rule matching `k` (1-based number and rule).
    pub fn matching_rule(&self, k: &FlowKey) -> Option<(usize, &Rule)> {
        self.rules.iter().enumerate().find(|(_, r)| r.matches(k)).map(|(i, r)| (i + 1, r))
    }

    /// Idle timeout of connection state in ns (0: the host's default).
    pub fn idle_timeout_ns(&self) -> u64 {
        self.idle_timeout_s.map(|s| s.saturating_mul(1_000_000_000)).unwrap_or(0)
    }

    /// Idle timeout of connection state in seconds, the host's default
    /// (120 s) when the config sets none.
    pub fn idle_timeout_s(&self) -> u64 {
        self.idle_timeout_s.filter(|s| *s > 0).unwrap_or(HOST_DEFAULT_IDLE_S)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::IpAddr128;

    fn key(src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16, proto: u8) -> FlowKey {
        FlowKey {
            src: IpAddr128::from_v4(src),
            dst: IpAddr128::from_v4(dst),
            src_port: sp,
            dst_port: dp,
            protocol: proto,
        }
    }

    #[test]
    fn first_match_wins() {
        let c = Config::parse(
            br#"{"default":"deny","rules":[
                {"action":"deny","proto":"tcp","dst-ports":"23"},
                {"action":"allow","src":"10.0.0.0/8","dst-ports":"1-1024"}]}"#,
        )
        .unwrap();
        assert_eq!(c.matching_rule(&key([10, 1, 2, 3], 5000, [1, 1, 1, 1], 23, 6)).unwrap().0, 1);
        assert_eq!(c.matching_rule(&key([10, 1, 2, 3], 5000, [1, 1, 1, 1], 80, 6)).unwrap().0, 2);
        assert!(c.matching_rule(&key([11, 1, 2, 3], 5000, [1, 1, 1, 1], 80, 6)).is_none());
    }

    #[test]
    fn v6_prefixes_do_not_match_v4() {
        let c = Config::parse(br#"{"rules":[{"action":"allow","src":"::/0"}]}"#).unwrap();
        // ::/0 matches everything including mapped v4, by design of "any".
        assert!(c.matching_rule(&key([1, 2, 3, 4], 1, [5, 6, 7, 8], 2, 17)).is_some());
        let c = Config::parse(br#"{"rules":[{"action":"allow","src":"2001:db8::/32"}]}"#).unwrap();
        assert!(c.matching_rule(&key([1, 2, 3, 4], 1, [5, 6, 7, 8], 2, 17)).is_none());
    }

    #[test]
    fn errors_name_the_rule_and_the_value() {
        let e = Config::parse(br#"{"rules":[{"action":"allow"},{"action":"allow","src":"10.0.0/8"}]}"#).unwrap_err();
        assert!(e.contains("rule 2") && e.contains("10.0.0"), "{e}");
        let e = Config::parse(br#"{"rules":[{"action":"allow","dst-ports":"90-80"}]}"#).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = Config::parse(br#"{"rules":[{"action":"allow","src":"10.0.0.1/8"}]}"#).unwrap_err();
        assert!(e.contains("10.0.0.0/8"), "{e}");
        let e = Config::parse(br#"{"rulez":[]}"#).unwrap_err();
        assert!(e.contains("rulez"), "{e}");
    }
}
