//! Who may do what on the bus.
//!
//! The NATS servers are trusted infrastructure; nothing else on the network
//! is. Every client authenticates with its own nkey (an Ed25519 key pair:
//! the seed stays with the client, the server config holds the public key)
//! over TLS, and the server enforces per-user subject permissions built
//! here from the same [`Names`] the two sides use, so the permissions
//! cannot drift from the subjects:
//!
//! - a **host** publishes only its own heartbeat, meter and event subjects
//!   (the subject's last token is its host id, which the gateway takes as
//!   the publisher's identity), reads only its own group's desired
//!   deployments and flow-ownership table and the module store, and
//!   receives only on its own inbox prefix, so it cannot read other
//!   clients' replies;
//! - a **dispatcher** reads its own group's flow-ownership table and
//!   nothing else;
//! - the **gateway** writes desired state, creates the streams and buckets,
//!   and reads every host's feeds.
//!
//! The gateway writes the server's `authorization` block
//! ([`render_authorization`]) from its registry of hosts; `nats-server
//! --signal reload` picks it up without dropping connections.

use crate::subjects::{NameError, Names, check_token};
use std::fmt::Write as _;
use std::path::PathBuf;

/// How a client proves who it is to NATS and checks who the server is.
/// Every field is optional: a server without authentication (a local
/// development server) needs none of them.
///
/// The host's and the dispatcher's command lines take it as it is
/// (`--nats-nkey`, `--nats-creds`, `--nats-ca`, `--nats-cert`,
/// `--nats-key`, or the `SLUICE_NATS_*` variables); the gateway reads the
/// same settings from its configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct NatsAuth {
    /// NATS nkey seed file (`sluice-host keygen` writes one; the operator
    /// registers its public key with the gateway).
    #[arg(long = "nats-nkey", env = "SLUICE_NATS_NKEY")]
    pub nkey_file: Option<PathBuf>,
    /// A NATS credentials (JWT) file, for servers in operator mode,
    /// instead of --nats-nkey.
    #[arg(long = "nats-creds", env = "SLUICE_NATS_CREDS", conflicts_with = "nkey_file")]
    pub creds_file: Option<PathBuf>,
    /// CA certificate(s), PEM, the NATS servers' certificates must chain
    /// to (requires TLS).
    #[arg(long = "nats-ca", env = "SLUICE_NATS_CA")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate, PEM, for mutual TLS with NATS.
    #[arg(long = "nats-cert", env = "SLUICE_NATS_CERT", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// Its private key, PEM.
    #[arg(long = "nats-key", env = "SLUICE_NATS_KEY", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
}

/// A subject-permission set of one NATS user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    /// Subjects the user may publish to.
    pub publish: Vec<String>,
    /// Subjects the user may subscribe to.
    pub subscribe: Vec<String>,
}

/// The inbox prefix of host `host`: its request replies and JetStream
/// deliveries arrive under it, and it may subscribe to nothing else.
pub fn host_inbox(names: &Names, host: &str) -> Result<String, NameError> {
    check_token("host", host)?;
    Ok(format!("_INBOX_{}_{host}", names.cluster()))
}

/// The gateway's inbox prefix.
pub fn gateway_inbox(names: &Names) -> String {
    format!("_INBOX_{}_gateway", names.cluster())
}

/// What host `host` of group `group` may do.
pub fn host_permissions(names: &Names, host: &str, group: &str) -> Result<Permissions, NameError> {
    let desired_stream = format!("KV_{}", names.desired_bucket());
    let desired_keys = format!("$KV.{}.{}", names.desired_bucket(), names.desired_keys(group)?);
    let modules_stream = format!("OBJ_{}", names.module_bucket());
    let groups_stream = format!("KV_{}", names.groups_bucket());
    let publish = vec![
        // Its own feeds; the subject's last token names it.
        names.heartbeat(host)?,
        names.meter(host)?,
        names.event(host)?,
        // Peer state to the other hosts of its group, as itself.
        names.peer_outbox(group, host)?,
        // JetStream: account info, and opening (not changing) the buckets.
        "$JS.API.INFO".into(),
        format!("$JS.API.STREAM.INFO.{desired_stream}"),
        format!("$JS.API.STREAM.INFO.{modules_stream}"),
        // Watching its own group's desired deployments through a named
        // consumer: the server checks that the filter in the subject is
        // the consumer's filter, so no other group's key can be read.
        format!("$JS.API.CONSUMER.CREATE.{desired_stream}.*.{desired_keys}"),
        format!("$JS.API.CONSUMER.DELETE.{desired_stream}.*"),
        format!("$JS.FC.{desired_stream}.>"),
        // Reading its own group's flow-ownership table (a direct get of
        // the one key).
        format!("$JS.API.STREAM.INFO.{groups_stream}"),
        format!("$JS.API.DIRECT.GET.{groups_stream}.$KV.{}.{}", names.groups_bucket(), names.group_key(group)?),
        // Reading modules (any: module bytes are not secret from the hosts
        // that run them): object metadata and chunks.
        format!("$JS.API.DIRECT.GET.{modules_stream}.>"),
        format!("$JS.API.CONSUMER.CREATE.{modules_stream}"),
        format!("$JS.API.CONSUMER.CREATE.{modules_stream}.>"),
        format!("$JS.API.CONSUMER.DELETE.{modules_stream}.*"),
        format!("$JS.FC.{modules_stream}.>"),
    ];
    let subscribe = vec![format!("{}.>", host_inbox(names, host)?), names.peer_inbox(group, host)?];
    Ok(Permissions { publish, subscribe })
}

/// What dispatcher `id` of group `group` may do: read its group's
/// flow-ownership table, nothing else.
pub fn dispatcher_permissions(names: &Names, id: &str, group: &str) -> Result<Permissions, NameError> {
    let groups_stream = format!("KV_{}", names.groups_bucket());
    let publish = vec![
        "$JS.API.INFO".into(),
        format!("$JS.API.STREAM.INFO.{groups_stream}"),
        format!("$JS.API.DIRECT.GET.{groups_stream}.$KV.{}.{}", names.groups_bucket(), names.group_key(group)?),
    ];
    let subscribe = vec![format!("{}.>", host_inbox(names, id)?)];
    Ok(Permissions { publish, subscribe })
}

/// What the gateway may do: everything of its cluster (it creates the
/// streams and buckets, writes desired state, reads every feed).
pub fn gateway_permissions(names: &Names) -> Permissions {
    let c = names.cluster();
    let publish = vec![
        format!("sluice.*.v1.{c}.>"),
        "$JS.API.>".into(),
        format!("$KV.{}.>", names.desired_bucket()),
        format!("$KV.{}.>", names.groups_bucket()),
        format!("$O.{}.>", names.module_bucket()),
        "$JS.ACK.>".into(),
        "$JS.FC.>".into(),
    ];
    let subscribe = vec![format!("sluice.*.v1.{c}.>"), format!("{}.>", gateway_inbox(names))];
    Permissions { publish, subscribe }
}

/// A host as the server's authorization block lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Host id.
    pub host: String,
    /// Its group.
    pub group: String,
    /// Its nkey public key (`U...`).
    pub nkey: String,
    /// A dispatcher, not a host: it only reads its group's table.
    pub dispatcher: bool,
}

/// Whether `key` looks like an nkey user public key (`U` + 55 base32
/// characters). The server checks the signature; this keeps garbage out of
/// its configuration file.
pub fn check_user_nkey(key: &str) -> Result<(), String> {
    let ok = key.len() == 56
        && key.starts_with('U')
        && key.bytes().all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{}' is not an nkey user public key (56 characters starting with U); print the host's with `sluice-host keygen --show`",
            key.chars().take(60).collect::<String>()
        ))
    }
}

/// A new nkey user key pair: `(seed, public key)`. The seed is the
/// secret; only the public key goes into the server's configuration.
pub fn new_user_key() -> (String, String) {
    let kp = nkeys::KeyPair::new_user();
    (kp.seed().unwrap_or_default(), kp.public_key())
}

/// The public key of an nkey user seed.
pub fn public_key_of(seed: &str) -> Result<String, String> {
    nkeys::KeyPair::from_seed(seed.trim()).map(|kp| kp.public_key()).map_err(|e| format!("not an nkey seed: {e}"))
}

/// Writes a new seed to `path` (mode 0600, refusing to overwrite) and
/// returns its public key.
pub fn write_new_seed(path: &std::path::Path) -> Result<String, String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let (seed, public) = new_user_key();
    if seed.is_empty() {
        return Err("could not encode a new nkey seed".into());
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("creating {}: {e} (an existing seed is never overwritten)", path.display()))?;
    f.write_all(format!("{seed}\n").as_bytes()).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(public)
}

fn quoted_list(items: &[String]) -> String {
    let v: Vec<String> = items.iter().map(|s| format!("\"{s}\"")).collect();
    format!("[{}]", v.join(", "))
}

fn user_entry(out: &mut String, comment: &str, nkey: &str, p: &Permissions) {
    let _ = writeln!(out, "    # {comment}");
    let _ = writeln!(out, "    {{ nkey: \"{nkey}\", permissions: {{");
    let _ = writeln!(out, "      publish: {{ allow: {} }}", quoted_list(&p.publish));
    let _ = writeln!(out, "      subscribe: {{ allow: {} }}", quoted_list(&p.subscribe));
    let _ = writeln!(out, "    }} }}");
}

/// The `authorization` block of a cluster's NATS servers: the gateway and
/// every registered host, each with its permissions. Included by
/// `deploy/nats/nats-server.conf`.
pub fn render_authorization(names: &Names, gateway_nkey: &str, hosts: &[HostIdentity]) -> Result<String, String> {
    check_user_nkey(gateway_nkey)?;
    let mut out = String::new();
    let _ = writeln!(out, "# Written by the Sluice gateway of cluster '{}'; do not edit.", names.cluster());
    let _ = writeln!(out, "# Reload the server after a change: nats-server --signal reload");
    let _ = writeln!(out, "authorization {{");
    let _ = writeln!(out, "  users: [");
    user_entry(&mut out, "gateway", gateway_nkey, &gateway_permissions(names));
    for h in hosts {
        check_user_nkey(&h.nkey)?;
        let (kind, p) = if h.dispatcher {
            ("dispatcher", dispatcher_permissions(names, &h.host, &h.group))
        } else {
            ("host", host_permissions(names, &h.host, &h.group))
        };
        let p = p.map_err(|e| e.to_string())?;
        user_entry(&mut out, &format!("{kind} {} (group {})", h.host, h.group), &h.nkey, &p);
    }
    let _ = writeln!(out, "  ]");
    let _ = writeln!(out, "}}");
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KEY: &str = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4";

    #[test]
    fn a_host_may_publish_only_its_own_feeds() {
        let n = Names::new("c1").unwrap();
        let p = host_permissions(&n, "h1", "edge").unwrap();
        assert!(p.publish.contains(&"sluice.meter.v1.c1.h1".to_string()));
        assert!(p.publish.contains(&"sluice.ctl.v1.c1.host.heartbeat.h1".to_string()));
        assert!(p.publish.iter().all(|s| !s.contains("h2")));
        assert!(p.publish.iter().all(|s| !s.starts_with("$KV") && !s.contains("STREAM.CREATE")));
        assert!(p.publish.iter().any(|s| s.ends_with(".*.$KV.sluice-desired-c1.edge.>")));
        assert!(p.publish.contains(&"$JS.API.DIRECT.GET.KV_sluice-groups-c1.$KV.sluice-groups-c1.edge".to_string()));
        assert!(p.publish.iter().all(|s| !s.contains("DIRECT.GET.KV_sluice-groups-c1.>")));
        assert_eq!(p.subscribe, vec!["_INBOX_c1_h1.>".to_string(), "sluice.peer.v1.c1.edge.h1.*".to_string()]);
        assert!(p.publish.contains(&"sluice.peer.v1.c1.edge.*.h1".to_string()));
        assert!(host_permissions(&n, "h.1", "edge").is_err());
        assert!(host_permissions(&n, "h1", "a>").is_err());
    }

    #[test]
    fn a_dispatcher_may_only_read_its_group_s_table() {
        let n = Names::new("c1").unwrap();
        let p = dispatcher_permissions(&n, "d1", "edge").unwrap();
        assert_eq!(p.publish.len(), 3);
        assert!(p.publish.iter().all(|s| s.starts_with("$JS.API.")));
        assert!(p.publish.iter().any(|s| s.ends_with("$KV.sluice-groups-c1.edge")));
        assert_eq!(p.subscribe, vec!["_INBOX_c1_d1.>".to_string()]);
    }

    #[test]
    fn new_keys_are_user_keys_and_seeds_give_their_public_key() {
        let (seed, public) = new_user_key();
        assert!(seed.starts_with("SU"));
        check_user_nkey(&public).unwrap();
        assert_eq!(public_key_of(&seed).unwrap(), public);
        assert!(public_key_of("SUnope").is_err());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.nk");
        let pk = write_new_seed(&p).unwrap();
        assert_eq!(public_key_of(&crate::nats::read_seed(&p).unwrap()).unwrap(), pk);
        assert!(write_new_seed(&p).is_err(), "never overwrites");
    }

    #[test]
    fn the_authorization_block_lists_every_identity() {
        let n = Names::new("c1").unwrap();
        let hosts = vec![
            HostIdentity { host: "h1".into(), group: "edge".into(), nkey: KEY.into(), dispatcher: false },
            HostIdentity { host: "d1".into(), group: "edge".into(), nkey: KEY.into(), dispatcher: true },
        ];
        let conf = render_authorization(&n, KEY, &hosts).unwrap();
        assert!(conf.contains("host h1 (group edge)") && conf.contains("dispatcher d1 (group edge)"));
        assert_eq!(conf.matches("nkey:").count(), 3);
        assert!(render_authorization(&n, "nope", &hosts).is_err());
        assert!(check_user_nkey(&KEY.replace('U', "S")).is_err());
    }
}
