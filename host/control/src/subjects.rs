//! Every NATS name Sluice uses, built here and nowhere else.
//!
//! Control subjects follow `sluice.ctl.v1.<cluster>.<noun>.<verb>[.<to>]`,
//! where the optional last token addresses a host (or a host group). Meter
//! records travel on their own subject tree, `sluice.meter.v1.<cluster>.<host>`,
//! captured by their own JetStream stream, so billing traffic never queues
//! behind control traffic and vice versa. JetStream buckets and streams
//! carry the cluster name so that several clusters can share one NATS.
//!
//! | what | name |
//! |---|---|
//! | heartbeat of a host | `sluice.ctl.v1.<cluster>.host.heartbeat.<host>` |
//! | all heartbeats (gateway) | `sluice.ctl.v1.<cluster>.host.heartbeat.*` |
//! | meter records of a host | `sluice.meter.v1.<cluster>.<host>` |
//! | NF events of a host | `sluice.event.v1.<cluster>.<host>` |
//! | meter stream | `SLUICE_METERS_<cluster>` (subjects `sluice.meter.v1.<cluster>.*`) |
//! | meter consumer of the gateway | `gateway` (durable) |
//! | desired deployments | KV bucket `sluice-desired-<cluster>`, key = `<group>.<deployment>` |
//! | module blobs | object store `sluice-modules-<cluster>`, object = SHA-256 digest |
//! | flow-ownership tables | KV bucket `sluice-groups-<cluster>`, key = `<group>` |
//! | peer state from host `<from>` to host `<to>` of a group | `sluice.peer.v1.<cluster>.<group>.<to>.<from>` |

pub use sluice_traffic::NameError;

/// Checks a token of a subject or bucket name (a cluster, host or group):
/// a name by the one rule ([`sluice_traffic::check_name`]), which NATS
/// subjects (split on `.`, `*` and `>` wildcards) and bucket names (only
/// `[A-Za-z0-9_-]`) can carry.
pub fn check_token(what: &'static str, value: &str) -> Result<(), NameError> {
    sluice_traffic::check_name(what, value)
}

/// The names of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    cluster: String,
}

impl Names {
    /// Names for `cluster` (checked).
    pub fn new(cluster: &str) -> Result<Self, NameError> {
        check_token("cluster", cluster)?;
        Ok(Names { cluster: cluster.to_string() })
    }

    /// The cluster name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    fn ctl(&self, noun: &str, verb: &str) -> String {
        format!("sluice.ctl.v1.{}.{noun}.{verb}", self.cluster)
    }

    /// Where host `host` publishes its heartbeats.
    pub fn heartbeat(&self, host: &str) -> Result<String, NameError> {
        check_token("host", host)?;
        Ok(format!("{}.{host}", self.ctl("host", "heartbeat")))
    }

    /// The heartbeats of every host (a wildcard subscription).
    pub fn heartbeats(&self) -> String {
        format!("{}.*", self.ctl("host", "heartbeat"))
    }

    /// Where host `host` publishes meter records.
    pub fn meter(&self, host: &str) -> Result<String, NameError> {
        check_token("host", host)?;
        Ok(format!("sluice.meter.v1.{}.{host}", self.cluster))
    }

    /// Every meter subject of the cluster (the stream's filter).
    pub fn meters(&self) -> String {
        format!("sluice.meter.v1.{}.*", self.cluster)
    }

    /// Where host `host` publishes NF events.
    pub fn event(&self, host: &str) -> Result<String, NameError> {
        check_token("host", host)?;
        Ok(format!("sluice.event.v1.{}.{host}", self.cluster))
    }

    /// Every event subject of the cluster.
    pub fn events(&self) -> String {
        format!("sluice.event.v1.{}.*", self.cluster)
    }

    /// The JetStream stream that keeps meter records.
    pub fn meter_stream(&self) -> String {
        format!("SLUICE_METERS_{}", self.cluster)
    }

    /// The gateway's durable consumer of the meter stream.
    pub fn meter_consumer(&self) -> &'static str {
        "gateway"
    }

    /// The KV bucket holding each group's desired deployments.
    pub fn desired_bucket(&self) -> String {
        format!("sluice-desired-{}", self.cluster)
    }

    /// The key of one deployment of a group in the desired bucket: one
    /// key each, so no tenant's deployment can make another's unpublishable.
    pub fn desired_key(&self, group: &str, deployment: &str) -> Result<String, NameError> {
        check_token("group", group)?;
        check_token("deployment", deployment)?;
        Ok(format!("{group}.{deployment}"))
    }

    /// The keys of every deployment of a group (a KV filter).
    pub fn desired_keys(&self, group: &str) -> Result<String, NameError> {
        check_token("group", group)?;
        Ok(format!("{group}.>"))
    }

    /// The object store of module blobs.
    pub fn module_bucket(&self) -> String {
        format!("sluice-modules-{}", self.cluster)
    }

    /// The KV bucket holding each group's flow-ownership table.
    pub fn groups_bucket(&self) -> String {
        format!("sluice-groups-{}", self.cluster)
    }

    /// Where host `from` sends peer state (flows it replicates) to host
    /// `to` of `group`. The last token names the sender: a host may
    /// publish only subjects ending in its own name.
    pub fn peer(&self, group: &str, to: &str, from: &str) -> Result<String, NameError> {
        check_token("group", group)?;
        check_token("host", to)?;
        check_token("host", from)?;
        Ok(format!("sluice.peer.v1.{}.{group}.{to}.{from}", self.cluster))
    }

    /// The peer state host `me` of `group` receives, from any peer.
    pub fn peer_inbox(&self, group: &str, me: &str) -> Result<String, NameError> {
        check_token("group", group)?;
        check_token("host", me)?;
        Ok(format!("sluice.peer.v1.{}.{group}.{me}.*", self.cluster))
    }

    /// The peer state host `me` of `group` may send, to any peer.
    pub fn peer_outbox(&self, group: &str, me: &str) -> Result<String, NameError> {
        check_token("group", group)?;
        check_token("host", me)?;
        Ok(format!("sluice.peer.v1.{}.{group}.*.{me}", self.cluster))
    }

    /// The key of `group`'s flow-ownership table in the groups bucket.
    pub fn group_key(&self, group: &str) -> Result<String, NameError> {
        check_token("group", group)?;
        Ok(group.to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn subjects_follow_the_scheme() {
        let n = Names::new("prod-1").unwrap();
        assert_eq!(n.heartbeat("h1").unwrap(), "sluice.ctl.v1.prod-1.host.heartbeat.h1");
        assert_eq!(n.heartbeats(), "sluice.ctl.v1.prod-1.host.heartbeat.*");
        assert_eq!(n.meter("h1").unwrap(), "sluice.meter.v1.prod-1.h1");
        assert_eq!(n.meters(), "sluice.meter.v1.prod-1.*");
        assert_eq!(n.event("h1").unwrap(), "sluice.event.v1.prod-1.h1");
        assert_eq!(n.events(), "sluice.event.v1.prod-1.*");
        assert_eq!(n.meter_stream(), "SLUICE_METERS_prod-1");
        assert_eq!(n.desired_bucket(), "sluice-desired-prod-1");
        assert_eq!(n.module_bucket(), "sluice-modules-prod-1");
        assert_eq!(n.groups_bucket(), "sluice-groups-prod-1");
        assert_eq!(n.group_key("edge").unwrap(), "edge");
        assert!(n.group_key("a.>").is_err());
        assert_eq!(n.peer("edge", "h2", "h1").unwrap(), "sluice.peer.v1.prod-1.edge.h2.h1");
        assert_eq!(n.peer_inbox("edge", "h2").unwrap(), "sluice.peer.v1.prod-1.edge.h2.*");
        assert_eq!(n.peer_outbox("edge", "h1").unwrap(), "sluice.peer.v1.prod-1.edge.*.h1");
        assert!(n.peer("edge", "h.*", "h1").is_err());
    }

    #[test]
    fn tokens_that_would_break_subjects_are_refused() {
        for bad in ["", "a.b", "a*", ">", "a b", &"x".repeat(65)] {
            assert!(Names::new(bad).is_err(), "{bad:?}");
            assert!(Names::new("c").unwrap().heartbeat(bad).is_err(), "{bad:?}");
        }
        let e = Names::new("c").unwrap().desired_key("a.b", "d1").unwrap_err();
        assert!(e.to_string().contains("group 'a.b'"), "{e}");
        let e = Names::new("c").unwrap().desired_key("g", "d.>").unwrap_err();
        assert!(e.to_string().contains("deployment 'd.>'"), "{e}");
        assert_eq!(Names::new("c").unwrap().desired_key("g", "d_1").unwrap(), "g.d_1");
        assert_eq!(Names::new("c").unwrap().desired_keys("g").unwrap(), "g.>");
    }
}
