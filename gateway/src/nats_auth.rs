//! The NATS servers' authorization block: who may sign in (the gateway and
//! every registered host, each by its nkey) and what each may publish and
//! subscribe to (`sluice_control::auth`).
//!
//! A gateway that shares a machine with its server writes the block to
//! `nats-auth-file` whenever the registry changes ([`write`]). Servers
//! elsewhere (NATS pods in Kubernetes) run [`Follower`]
//! (`sluice-gateway nats-auth-sync`) beside them: it asks the gateway
//! which identities to let in (`GET /v1/nats-authorization`), renders the
//! block itself, so that a forged answer cannot grant more than a host's
//! permissions, writes it when it changed and signals the server to
//! reload. Before the gateway can answer (it needs the servers to let it
//! in first) the block holds the gateway alone.

use crate::config::GatewayConfig;
use crate::store::Store;
use serde::{Deserialize, Serialize};
use sluice_control::auth::{HostIdentity, check_user_nkey, public_key_of, render_authorization};
use std::path::{Path, PathBuf};
use std::time::Duration;
use utoipa::ToSchema;

/// Largest answer [`Follower`] reads from the gateway.
const MAX_ANSWER: u64 = 4 << 20;

/// What went wrong writing or following the authorization block.
#[derive(Debug, thiserror::Error)]
pub enum NatsAuthError {
    /// The gateway's own identity is not configured.
    #[error("nats-auth-file is set but nats-nkey (the gateway's own seed) is not; set both or neither")]
    NoGatewayKey,
    /// A key, name or identity is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The registry could not be read.
    #[error("reading the host registry: {0}")]
    Store(String),
    /// The block could not be written.
    #[error("writing {path}: {source}; check that the directory exists and is writable")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The gateway did not answer, or not as expected.
    #[error("asking {url} for the NATS identities: {why}")]
    Gateway {
        /// What was asked.
        url: String,
        /// Why it failed.
        why: String,
    },
    /// The gateway answered for another cluster or with another key.
    #[error("the gateway at {url} answered {what}; refusing it (check --gateway and --gateway-public-key)")]
    Mismatch {
        /// What was asked.
        url: String,
        /// What did not match.
        what: String,
    },
    /// The server could not be signalled.
    #[error("signalling nats-server (pid file {path}) to reload: {why}")]
    Signal {
        /// The pid file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// Who the NATS servers let in: the gateway and every registered host
/// with an nkey.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NatsIdentities {
    /// The cluster (it names the subjects).
    pub cluster: String,
    /// The gateway's nkey public key.
    pub gateway: String,
    /// Registered hosts and dispatchers with an nkey.
    pub hosts: Vec<NatsHost>,
}

/// A host the NATS servers let in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NatsHost {
    /// Host id.
    pub id: String,
    /// Its group.
    pub group: String,
    /// Its nkey public key.
    pub nkey: String,
    /// A flowlet dispatcher (reads its group's table only), not a host.
    pub dispatcher: bool,
}

/// The identities of the gateway's registry; `None` when the gateway has
/// no nkey (it then runs without NATS authorization).
pub fn identities(config: &GatewayConfig, store: &Store) -> Result<Option<NatsIdentities>, NatsAuthError> {
    let Some(seed_file) = &config.nats_nkey else { return Ok(None) };
    let seed = sluice_control::nats::read_seed(seed_file).map_err(NatsAuthError::Invalid)?;
    let gateway = public_key_of(&seed).map_err(NatsAuthError::Invalid)?;
    let hosts = store
        .registered_hosts()
        .map_err(|e| NatsAuthError::Store(e.to_string()))?
        .into_iter()
        .filter_map(|h| Some(NatsHost { nkey: h.nkey?, id: h.id, group: h.group, dispatcher: h.dispatcher }))
        .collect();
    Ok(Some(NatsIdentities { cluster: config.cluster.clone(), gateway, hosts }))
}

/// The authorization block that lets `ids` in, each with the permissions
/// of its role; every key and name is checked.
pub fn render(ids: &NatsIdentities) -> Result<String, NatsAuthError> {
    let names = sluice_control::Names::new(&ids.cluster).map_err(|e| NatsAuthError::Invalid(e.to_string()))?;
    let hosts: Vec<HostIdentity> = ids
        .hosts
        .iter()
        .map(|h| HostIdentity {
            host: h.id.clone(),
            group: h.group.clone(),
            nkey: h.nkey.clone(),
            dispatcher: h.dispatcher,
        })
        .collect();
    render_authorization(&names, &ids.gateway, &hosts).map_err(NatsAuthError::Invalid)
}

/// Writes the block for the gateway's registry to `nats-auth-file`, if
/// configured. The operator's reload of nats-server (a systemd path unit
/// in `deploy/systemd`, or [`Follower`]) applies it.
pub fn write(config: &GatewayConfig, store: &Store) -> Result<(), NatsAuthError> {
    let Some(path) = &config.nats_auth_file else { return Ok(()) };
    let ids = identities(config, store)?.ok_or(NatsAuthError::NoGatewayKey)?;
    if write_if_changed(path, &render(&ids)?)? {
        tracing::info!(file = %path.display(), hosts = ids.hosts.len(), "NATS authorization written; reload nats-server to apply it");
    }
    Ok(())
}

/// Replaces `path` with `text` (atomically) unless it holds it already;
/// whether it did.
fn write_if_changed(path: &Path, text: &str) -> Result<bool, NatsAuthError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    let io = |source| NatsAuthError::Write { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(true)
}

/// Keeps one NATS server's authorization block in step with a gateway's
/// registry (`sluice-gateway nats-auth-sync`).
#[derive(Debug, Clone)]
pub struct Follower {
    /// The gateway's API base URL (`http://sluice-gateway:8080`).
    pub gateway: String,
    /// The admin token the gateway asks for.
    pub token: String,
    /// The cluster's name (its subjects).
    pub cluster: String,
    /// The gateway's nkey public key: alone in the block until the gateway
    /// answers, and the key every answer must carry.
    pub gateway_key: String,
    /// The block the server includes.
    pub out: PathBuf,
    /// nats-server's `pid_file`: signalled (SIGHUP) to reload after a change.
    pub pid_file: Option<PathBuf>,
}

/// What one round of [`Follower::round`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// The block already held what the gateway said.
    Unchanged,
    /// The block was rewritten (and the server signalled) with this many hosts.
    Written(usize),
}

impl Follower {
    /// Writes the block with the gateway alone when there is none yet, so
    /// that the server can start and let the gateway in; whether it did.
    pub fn bootstrap(&self) -> Result<bool, NatsAuthError> {
        if self.out.exists() {
            return Ok(false);
        }
        check_user_nkey(&self.gateway_key).map_err(NatsAuthError::Invalid)?;
        let ids =
            NatsIdentities { cluster: self.cluster.clone(), gateway: self.gateway_key.clone(), hosts: Vec::new() };
        write_if_changed(&self.out, &render(&ids)?)
    }

    /// Asks the gateway once and applies its answer.
    pub fn round(&self) -> Result<Round, NatsAuthError> {
        let url = format!("{}/v1/nats-authorization", self.gateway.trim_end_matches('/'));
        let ids = self.fetch(&url)?;
        if ids.cluster != self.cluster {
            return Err(NatsAuthError::Mismatch { url, what: format!("for cluster '{}'", ids.cluster) });
        }
        if ids.gateway != self.gateway_key {
            return Err(NatsAuthError::Mismatch { url, what: format!("gateway key {}", ids.gateway) });
        }
        if !write_if_changed(&self.out, &render(&ids)?)? {
            return Ok(Round::Unchanged);
        }
        self.reload()?;
        Ok(Round::Written(ids.hosts.len()))
    }

    /// Rounds every `every`, forever; failures are logged and retried.
    pub fn run(&self, every: Duration) -> ! {
        let mut failing = false;
        loop {
            match self.round() {
                Ok(Round::Written(hosts)) => {
                    failing = false;
                    tracing::info!(file = %self.out.display(), hosts, "NATS authorization updated");
                }
                Ok(Round::Unchanged) => {
                    if failing {
                        tracing::info!("the gateway answers again");
                    }
                    failing = false;
                }
                Err(e) => {
                    // Said once per outage, not every round.
                    if !failing {
                        tracing::warn!("{e}; keeping {} and trying again", self.out.display());
                    }
                    failing = true;
                }
            }
            std::thread::sleep(every);
        }
    }

    fn fetch(&self, url: &str) -> Result<NatsIdentities, NatsAuthError> {
        let fail = |why: String| NatsAuthError::Gateway { url: url.to_string(), why };
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let mut r = agent
            .get(url)
            .header("authorization", &format!("Bearer {}", self.token))
            .call()
            .map_err(|e| fail(e.to_string()))?;
        let status = r.status().as_u16();
        let body = r.body_mut().with_config().limit(MAX_ANSWER).read_to_string().map_err(|e| fail(e.to_string()))?;
        if status != 200 {
            let excerpt: String = body.chars().take(200).collect();
            return Err(fail(format!("HTTP {status}: {excerpt}")));
        }
        serde_json::from_str(&body).map_err(|e| fail(format!("an answer that is not the identities: {e}")))
    }

    /// Signals the server to read its configuration again.
    fn reload(&self) -> Result<(), NatsAuthError> {
        let Some(path) = &self.pid_file else { return Ok(()) };
        let fail = |why: String| NatsAuthError::Signal { path: path.clone(), why };
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let pid: i32 = text.trim().parse().map_err(|_| fail(format!("'{}' is not a process id", text.trim())))?;
        if pid <= 1 {
            return Err(fail(format!("refusing to signal process {pid}")));
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP)
            .map_err(|e| fail(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const GW: &str = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4";

    fn follower(dir: &Path) -> Follower {
        Follower {
            gateway: "http://127.0.0.1:1".into(),
            token: "t".into(),
            cluster: "c1".into(),
            gateway_key: GW.into(),
            out: dir.join("auth.conf"),
            pid_file: None,
        }
    }

    #[test]
    fn bootstrap_lets_the_gateway_alone_in_and_keeps_an_existing_block() {
        let dir = tempfile::tempdir().unwrap();
        let f = follower(dir.path());
        assert!(f.bootstrap().unwrap());
        let text = std::fs::read_to_string(&f.out).unwrap();
        assert!(text.contains(GW) && text.matches("nkey:").count() == 1, "{text}");
        std::fs::write(&f.out, "kept").unwrap();
        assert!(!f.bootstrap().unwrap());
        assert_eq!(std::fs::read_to_string(&f.out).unwrap(), "kept");
    }

    #[test]
    fn an_unreachable_gateway_leaves_the_block_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let f = follower(dir.path());
        f.bootstrap().unwrap();
        let before = std::fs::read_to_string(&f.out).unwrap();
        assert!(matches!(f.round(), Err(NatsAuthError::Gateway { .. })));
        assert_eq!(std::fs::read_to_string(&f.out).unwrap(), before);
    }

    #[test]
    fn malformed_identities_are_refused() {
        let mut ids = NatsIdentities { cluster: "c1".into(), gateway: GW.into(), hosts: Vec::new() };
        ids.hosts.push(NatsHost { id: "h1".into(), group: "g".into(), nkey: "not-a-key".into(), dispatcher: false });
        assert!(render(&ids).is_err());
        ids.hosts[0].nkey = GW.into();
        ids.hosts[0].id = "h1 }\nauthorization {".into();
        assert!(render(&ids).is_err());
        ids.hosts[0].id = "h1".into();
        assert!(render(&ids).unwrap().contains("host h1 (group g)"));
    }
}
