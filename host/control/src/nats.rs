//! The bus over NATS and JetStream.
//!
//! - heartbeats: core NATS publish/subscribe (losing one is harmless: the
//!   next one carries the same, newer, state);
//! - desired deployments: a KV bucket with one key per host group, so a
//!   host that starts (or restarts) reads what it should run even while the
//!   gateway is down, and watches changes;
//! - modules: a JetStream object store keyed by SHA-256, checked on fetch;
//! - meters: a file-backed stream with a duplicate window, published with
//!   `Nats-Msg-Id` = record id (JetStream drops re-publications), consumed
//!   by the gateway's durable pull consumer with explicit acks (a record not
//!   acked, e.g. because the gateway died, is delivered again; the gateway
//!   stores records idempotently).

use crate::auth::{NatsAuth, gateway_inbox, host_inbox};
use crate::bus::{Ack, Bus, BusError, FromHost, MeterDelivery, verify_digest};
use crate::messages::{DesiredSet, EventBatch, Heartbeat, MeterRecord};
use crate::subjects::Names;
use async_nats::jetstream::{self, consumer, kv, object_store, stream};
use futures::StreamExt;
use futures::stream::BoxStream;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// How long JetStream remembers record ids to drop re-publications.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(10 * 60);
/// How long meter records stay in the stream after being stored (the
/// gateway's database is the system of record; this is a replay margin).
const METER_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long the gateway may take to store a record before it is
/// redelivered: also how long records a killed gateway had in flight wait
/// for the next one. Storing a batch takes milliseconds.
const ACK_WAIT: Duration = Duration::from_secs(10);

/// Who is connecting: the gateway owns the cluster's streams and buckets;
/// a host only uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The gateway: creates (or updates) the stream and buckets with
    /// `replicas` copies each (none: as many servers as the cluster has,
    /// at most 3).
    Gateway {
        /// JetStream replicas.
        replicas: Option<usize>,
    },
    /// Host `host`: waits for the buckets the gateway creates, and gets
    /// replies on its own inbox prefix (the only subjects it may read).
    Host {
        /// Host id.
        host: String,
    },
}

/// How long a host's desired-state watch may stay silent before it is
/// re-established. The gateway rewrites every group's set every 10 s, so a
/// live watch is never silent this long; a watch whose consumer went down
/// with a NATS server can be silent without an error.
const WATCH_SILENCE: Duration = Duration::from_secs(25);

/// A connection to NATS for one cluster.
#[derive(Debug, Clone)]
pub struct NatsBus {
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    url: String,
    role: Role,
}

/// Builds the connect options of `auth` (credentials, TLS).
async fn connect_options(
    url: &str,
    auth: &NatsAuth,
    inbox: String,
    who: &str,
) -> Result<async_nats::ConnectOptions, BusError> {
    let conn = |reason: String| BusError::Connect { url: url.to_string(), reason };
    let mut opts = match (&auth.creds_file, &auth.nkey_file) {
        (Some(_), Some(_)) => return Err(conn("give either an nkey seed file or a creds file, not both".into())),
        (Some(creds), None) => async_nats::ConnectOptions::with_credentials_file(creds.clone())
            .await
            .map_err(|e| conn(format!("reading credentials {}: {e}", creds.display())))?,
        (None, Some(path)) => {
            let seed = read_seed(path).map_err(conn)?;
            async_nats::ConnectOptions::with_nkey(seed)
        }
        (None, None) => async_nats::ConnectOptions::new(),
    };
    if let Some(ca) = &auth.ca_file {
        if !ca.is_file() {
            return Err(conn(format!("CA file {} does not exist", ca.display())));
        }
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    match (&auth.cert_file, &auth.key_file) {
        (Some(cert), Some(key)) => {
            for f in [cert, key] {
                if !f.is_file() {
                    return Err(conn(format!("TLS file {} does not exist", f.display())));
                }
            }
            opts = opts.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
        }
        (None, None) => {}
        _ => return Err(conn("a client certificate needs both the certificate and its key".into())),
    }
    Ok(opts.name(who).custom_inbox_prefix(inbox).connection_timeout(Duration::from_secs(5)).retry_on_initial_connect())
}

/// Reads an nkey seed file (the first line starting with `SU`, so a file
/// with comments works), refusing one others can read.
pub fn read_seed(path: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("nkey seed {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!("nkey seed {} is readable by other users; chmod 600 it", path.display()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("nkey seed {}: {e}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .map(str::to_string)
        .ok_or_else(|| format!("{} holds no nkey user seed (a line starting with SU)", path.display()))
}

impl NatsBus {
    /// Connects (retrying until the server is up). The gateway makes sure
    /// the cluster's stream and buckets exist; a host waits until they do.
    /// `who` names the connection in the server's monitoring.
    pub async fn connect(url: &str, cluster: &str, auth: &NatsAuth, role: Role, who: &str) -> Result<Self, BusError> {
        let names = Names::new(cluster)?;
        let conn = |reason: String| BusError::Connect { url: url.to_string(), reason };
        let inbox = match &role {
            Role::Gateway { .. } => gateway_inbox(&names),
            Role::Host { host } => host_inbox(&names, host)?,
        };
        let servers: Vec<&str> = url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let client = connect_options(url, auth, inbox, who)
            .await?
            .connect(servers.as_slice())
            .await
            .map_err(|e| conn(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let bus = NatsBus { client, js, names, url: url.to_string(), role: role.clone() };
        match role {
            Role::Gateway { replicas } => {
                // A cluster that is just starting has no JetStream leader
                // yet: keep trying for a while.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                loop {
                    // Counted on each try: a cluster still forming shows
                    // its servers as their routes come up.
                    match tokio::time::timeout(Duration::from_secs(10), bus.ensure(replicas)).await {
                        Ok(Ok(())) => break,
                        Ok(Err(e)) if tokio::time::Instant::now() > deadline => return Err(e),
                        Err(_) if tokio::time::Instant::now() > deadline => {
                            return Err(conn(
                                "JetStream did not answer within 30 s; is the server started with JetStream enabled?"
                                    .into(),
                            ));
                        }
                        Ok(Err(e)) => tracing::info!("JetStream not ready yet: {e}"),
                        Err(_) => tracing::info!("JetStream not ready yet"),
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Role::Host { .. } => bus.await_buckets().await?,
        }
        Ok(bus)
    }

    /// Servers in the NATS cluster, as the server we reached tells it.
    pub fn cluster_size(&self) -> usize {
        self.client.server_info().connect_urls.len().max(1)
    }

    /// Waits (up to a minute) for the buckets the gateway creates.
    async fn await_buckets(&self) -> Result<(), BusError> {
        let n = &self.names;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let kv = self.js.get_key_value(n.desired_bucket()).await;
            let obj = self.js.get_object_store(n.module_bucket()).await;
            match (kv, obj) {
                (Ok(_), Ok(_)) => return Ok(()),
                (kv, obj) => {
                    let why = kv.err().map(|e| e.to_string()).or(obj.err().map(|e| e.to_string())).unwrap_or_default();
                    if tokio::time::Instant::now() > deadline {
                        return Err(self.conn(format!(
                            "the cluster's buckets ({}, {}) are not there: {why}; start the gateway first, and check this host's NATS permissions",
                            n.desired_bucket(),
                            n.module_bucket()
                        )));
                    }
                    tracing::info!("waiting for the gateway to create the cluster's buckets: {why}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Creates the stream and buckets if missing, with `configured`
    /// replicas, or else as many as the cluster has servers (at most 3).
    /// Existing ones are set to `configured`, or else scaled up (never
    /// down: a server that is away for a moment must not cost a copy).
    async fn ensure(&self, configured: Option<usize>) -> Result<(), BusError> {
        let replicas = configured.unwrap_or_else(|| self.cluster_size().clamp(1, 3));
        let n = &self.names;
        self.js
            .get_or_create_stream(stream::Config {
                name: n.meter_stream(),
                description: Some("Sluice meter records".into()),
                subjects: vec![n.meters()],
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                max_age: METER_RETENTION,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| self.conn(format!("creating stream {}: {e}", n.meter_stream())))?;
        if self.js.get_key_value(n.desired_bucket()).await.is_err() {
            self.js
                .create_key_value(kv::Config {
                    bucket: n.desired_bucket(),
                    description: "Sluice desired deployments per host group".into(),
                    history: 1,
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.conn(format!("creating KV bucket {}: {e}", n.desired_bucket())))?;
        }
        if self.js.get_object_store(n.module_bucket()).await.is_err() {
            self.js
                .create_object_store(object_store::Config {
                    bucket: n.module_bucket(),
                    description: Some("Sluice NF modules by SHA-256".into()),
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| self.conn(format!("creating object store {}: {e}", n.module_bucket())))?;
        }
        // Streams made earlier with another replica count are scaled.
        for name in [n.meter_stream(), format!("KV_{}", n.desired_bucket()), format!("OBJ_{}", n.module_bucket())] {
            let mut s =
                self.js.get_stream(&name).await.map_err(|e| self.conn(format!("opening stream {name}: {e}")))?;
            let info = s.info().await.map_err(|e| self.conn(format!("stream {name}: {e}")))?;
            let wanted = match configured {
                Some(_) => info.config.num_replicas != replicas,
                None => info.config.num_replicas < replicas,
            };
            if wanted {
                let mut config = info.config.clone();
                config.num_replicas = replicas;
                self.js
                    .update_stream(config)
                    .await
                    .map_err(|e| self.conn(format!("setting stream {name} to {replicas} replica(s): {e}")))?;
                tracing::info!(stream = %name, replicas, "stream replicas changed");
            }
        }
        Ok(())
    }

    /// A named ordered consumer of `group`'s key in the desired bucket,
    /// from its current value on. The create request then carries its
    /// filter, which the server checks against the host's permissions (an
    /// unnamed one could read every group).
    async fn open_watch(
        &self,
        group: &str,
    ) -> Result<BoxStream<'static, Result<jetstream::Message, String>>, BusError> {
        let key = self.names.desired_key(group)?;
        let stream_name = format!("KV_{}", self.names.desired_bucket());
        let op = || format!("watching the desired set of group {group}");
        let stream = self.js.get_stream(&stream_name).await.map_err(|e| BusError::op(op(), e))?;
        let who = match &self.role {
            Role::Host { host } => host.clone(),
            Role::Gateway { .. } => "gateway".into(),
        };
        let deliver_subject = self.client.new_inbox();
        let id = deliver_subject.rsplit('.').next().unwrap_or_default().to_string();
        let consumer = stream
            .create_consumer(consumer::push::OrderedConfig {
                name: Some(format!("watch_{who}_{id}")),
                deliver_subject,
                filter_subject: format!("$KV.{}.{key}", self.names.desired_bucket()),
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                replay_policy: consumer::ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|e| BusError::op(op(), e))?;
        let messages = consumer.messages().await.map_err(|e| BusError::op(op(), e))?;
        Ok(messages.map(|m| m.map_err(|e| e.to_string())).boxed())
    }

    fn conn(&self, reason: String) -> BusError {
        BusError::Connect { url: self.url.clone(), reason }
    }

    /// The cluster's names.
    pub fn names(&self) -> &Names {
        &self.names
    }

    async fn desired_store(&self) -> Result<kv::Store, BusError> {
        self.js
            .get_key_value(self.names.desired_bucket())
            .await
            .map_err(|e| BusError::op(format!("opening KV bucket {}", self.names.desired_bucket()), e))
    }

    async fn module_store(&self) -> Result<object_store::ObjectStore, BusError> {
        self.js
            .get_object_store(self.names.module_bucket())
            .await
            .map_err(|e| BusError::op(format!("opening object store {}", self.names.module_bucket()), e))
    }
}

#[async_trait::async_trait]
impl Bus for NatsBus {
    async fn heartbeat(&self, hb: &Heartbeat) -> Result<(), BusError> {
        let subject = self.names.heartbeat(&hb.host)?;
        let body = serde_json::to_vec(hb).map_err(|e| BusError::op("encoding a heartbeat", e))?;
        self.client.publish(subject, body.into()).await.map_err(|e| BusError::op("publishing a heartbeat", e))
    }

    async fn heartbeats(&self) -> Result<BoxStream<'static, FromHost<Heartbeat>>, BusError> {
        let sub = self
            .client
            .subscribe(self.names.heartbeats())
            .await
            .map_err(|e| BusError::op("subscribing to heartbeats", e))?;
        Ok(sub
            .filter_map(|m| async move {
                match serde_json::from_slice::<Heartbeat>(&m.payload) {
                    Ok(hb) => Some(FromHost { host: publisher(&m.subject), message: hb }),
                    Err(e) => {
                        tracing::warn!(subject = %m.subject, "ignoring a malformed heartbeat: {e}");
                        None
                    }
                }
            })
            .boxed())
    }

    async fn set_desired(&self, set: &DesiredSet) -> Result<(), BusError> {
        let key = self.names.desired_key(&set.group)?;
        let body = serde_json::to_vec(set).map_err(|e| BusError::op("encoding a desired set", e))?;
        self.desired_store()
            .await?
            .put(&key, body.into())
            .await
            .map_err(|e| BusError::op(format!("storing the desired set of group {}", set.group), e))?;
        Ok(())
    }

    async fn watch_desired(&self, group: &str) -> Result<BoxStream<'static, DesiredSet>, BusError> {
        // The first watch must work (a refused one is a configuration
        // error); later ones are retried until they do.
        let first = self.open_watch(group).await?;
        let state = (self.clone(), group.to_string(), Some(first));
        Ok(futures::stream::unfold(state, |(bus, group, mut current)| async move {
            loop {
                let Some(messages) = current.as_mut() else {
                    match bus.open_watch(&group).await {
                        Ok(m) => current = Some(m),
                        Err(e) => {
                            tracing::warn!(%group, "cannot watch the desired set yet: {e}");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    continue;
                };
                let next = match tokio::time::timeout(WATCH_SILENCE, messages.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        // The gateway rewrites the set every 10 s: this
                        // silence means the watch died without saying so.
                        tracing::info!(%group, "no desired set for {WATCH_SILENCE:?}; watching again");
                        current = None;
                        continue;
                    }
                };
                match next {
                    Some(Ok(m)) => {
                        if let Some(set) = decode_desired(&group, &m) {
                            return Some((set, (bus, group, current)));
                        }
                    }
                    Some(Err(e)) => {
                        // A server lost, a leader moved: watch again from
                        // the current value (converging twice is harmless).
                        tracing::warn!(%group, "desired-set watch: {e}; watching again");
                        current = None;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    None => {
                        current = None;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
            }
        })
        .boxed())
    }

    async fn put_module(&self, digest: &str, bytes: &[u8]) -> Result<(), BusError> {
        verify_digest(digest, bytes)?;
        let store = self.module_store().await?;
        if store.info(digest).await.is_ok() {
            return Ok(());
        }
        let mut reader = bytes;
        store.put(digest, &mut reader).await.map_err(|e| BusError::op(format!("storing module {digest}"), e))?;
        Ok(())
    }

    async fn get_module(&self, digest: &str) -> Result<Vec<u8>, BusError> {
        let store = self.module_store().await?;
        let mut object = match store.get(digest).await {
            Ok(o) => o,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => {
                return Err(BusError::NoModule { digest: digest.to_string() });
            }
            Err(e) => return Err(BusError::op(format!("fetching module {digest}"), e)),
        };
        let mut bytes = Vec::new();
        object.read_to_end(&mut bytes).await.map_err(|e| BusError::op(format!("reading module {digest}"), e))?;
        verify_digest(digest, &bytes)?;
        Ok(bytes)
    }

    async fn publish_meter(&self, rec: &MeterRecord) -> Result<(), BusError> {
        let subject = self.names.meter(&rec.host)?;
        let body = serde_json::to_vec(rec).map_err(|e| BusError::op("encoding a meter record", e))?;
        let op = || format!("publishing meter record {}", rec.id);
        let ack = self
            .js
            .send_publish(subject, jetstream::message::PublishMessage::build().payload(body.into()).message_id(&rec.id))
            .await
            .map_err(|e| BusError::op(op(), e))?;
        ack.await.map_err(|e| BusError::op(op(), e))?;
        Ok(())
    }

    async fn meters(&self) -> Result<BoxStream<'static, Result<MeterDelivery, BusError>>, BusError> {
        let n = &self.names;
        let stream = self
            .js
            .get_stream(n.meter_stream())
            .await
            .map_err(|e| BusError::op(format!("opening stream {}", n.meter_stream()), e))?;
        let consumer = stream
            .get_or_create_consumer(
                n.meter_consumer(),
                consumer::pull::Config {
                    durable_name: Some(n.meter_consumer().to_string()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    max_ack_pending: 10_000,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| BusError::op("creating the gateway's meter consumer", e))?;
        let messages = consumer.messages().await.map_err(|e| BusError::op("consuming meter records", e))?;
        Ok(messages
            .then(|m| async move {
                let m = m.map_err(|e| BusError::op("receiving meter records", e))?;
                match serde_json::from_slice::<MeterRecord>(&m.payload) {
                    Ok(record) => {
                        Ok(MeterDelivery { publisher: publisher(&m.subject), record, ack: Ack::Nats(Box::new(m)) })
                    }
                    Err(e) => {
                        // A record nobody can read would be redelivered forever.
                        let _ = m.ack_with(jetstream::AckKind::Term).await;
                        Err(BusError::Decode { what: "meter record", reason: e.to_string() })
                    }
                }
            })
            .boxed())
    }

    async fn publish_events(&self, batch: &EventBatch) -> Result<(), BusError> {
        let subject = self.names.event(&batch.host)?;
        let body = serde_json::to_vec(batch).map_err(|e| BusError::op("encoding events", e))?;
        self.client.publish(subject, body.into()).await.map_err(|e| BusError::op("publishing events", e))
    }

    async fn maintain(&self) -> Result<(), BusError> {
        match &self.role {
            Role::Gateway { replicas } => self.ensure(*replicas).await,
            Role::Host { .. } => Ok(()),
        }
    }

    async fn events(&self) -> Result<BoxStream<'static, FromHost<EventBatch>>, BusError> {
        let sub =
            self.client.subscribe(self.names.events()).await.map_err(|e| BusError::op("subscribing to events", e))?;
        Ok(sub
            .filter_map(|m| async move {
                match serde_json::from_slice::<EventBatch>(&m.payload) {
                    Ok(b) => Some(FromHost { host: publisher(&m.subject), message: b }),
                    Err(e) => {
                        tracing::warn!(subject = %m.subject, "ignoring malformed events: {e}");
                        None
                    }
                }
            })
            .boxed())
    }
}

/// The host a subject belongs to: its last token (see [`crate::subjects`]).
fn publisher(subject: &async_nats::Subject) -> String {
    subject.as_str().rsplit('.').next().unwrap_or_default().to_string()
}

/// A desired set from a KV message of `group`'s key (a deleted key is an
/// empty set); malformed ones are logged and skipped.
fn decode_desired(group: &str, m: &jetstream::Message) -> Option<DesiredSet> {
    let deleted = m
        .headers
        .as_ref()
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|v| v.as_str() == "DEL" || v.as_str() == "PURGE");
    if deleted {
        return Some(DesiredSet { group: group.to_string(), deployments: Vec::new() });
    }
    match serde_json::from_slice::<DesiredSet>(&m.payload) {
        Ok(set) if set.group == group => Some(set),
        Ok(set) => {
            tracing::warn!(%group, "ignoring a desired set that names group {}", set.group);
            None
        }
        Err(e) => {
            tracing::warn!(%group, "ignoring a malformed desired set: {e}");
            None
        }
    }
}
