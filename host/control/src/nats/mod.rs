//! The bus over NATS and JetStream.
//!
//! - heartbeats: core NATS publish/subscribe (losing one is harmless: the
//!   next one carries the same, newer, state);
//! - desired deployments: a KV bucket with one key per deployment
//!   (`<group>.<deployment>`), so a host that starts (or restarts) reads
//!   what it should run even while the gateway is down, watches changes,
//!   and no deployment's size or failure can hold up another's;
//! - modules: a JetStream object store keyed by SHA-256, checked on fetch;
//! - flow-ownership tables: a KV bucket with one key per group, read by a
//!   host with a direct get of its own group's key;
//! - meters: a file-backed stream with a duplicate window, published with
//!   `Nats-Msg-Id` = record id (JetStream drops re-publications), consumed
//!   by the gateway's durable pull consumer with explicit acks (a record not
//!   acked, e.g. because the gateway died, is delivered again; the gateway
//!   stores records idempotently).

use crate::auth::{NatsAuth, gateway_inbox, host_inbox};
use crate::bus::{Ack, Bus, BusError, FromHost, MeterDelivery, verify_digest};
use crate::messages::{DeploymentSpec, DesiredSet, EventBatch, Heartbeat, MeterRecord};
use crate::subjects::Names;
use async_nats::jetstream::{self, consumer, kv, object_store, stream};
use futures::StreamExt;
use futures::stream::BoxStream;
use std::time::Duration;
use tokio::io::AsyncReadExt;

mod connect;
mod desired;
mod setup;

use connect::connect_options;
pub use connect::read_seed;
use desired::DesiredWatch;

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
    /// Dispatcher `id`: reads its group's flow-ownership table only, with
    /// replies on its own inbox prefix.
    Dispatcher {
        /// Dispatcher id (registered as a host of role dispatcher).
        id: String,
    },
}

/// How long a host's desired-state watch may stay silent before it is
/// re-established from the current values (converging on the same set
/// again is harmless). The watch is also re-established whenever the
/// connection comes back; this catches a consumer lost without a sign.
const WATCH_SILENCE: Duration = Duration::from_secs(30);
/// Pull requests of the meter consumer expire (and are renewed) this often;
/// the server sends idle heartbeats at half of it. A consumer leader lost
/// with a NATS server is noticed within two heartbeats.
const METER_PULL_EXPIRES: Duration = Duration::from_secs(4);

/// A connection to NATS for one cluster.
#[derive(Debug, Clone)]
pub struct NatsBus {
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    url: String,
    role: Role,
    /// Counts connections made (the first and every reconnection).
    connects: tokio::sync::watch::Receiver<u64>,
    /// Gateway: SHA-256 of each desired key's value as last written, so
    /// unchanged deployments are not written again.
    written: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<String, [u8; 32]>>>,
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
            Role::Dispatcher { id } => host_inbox(&names, id)?,
        };
        let servers: Vec<&str> = url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let (connected, connects) = tokio::sync::watch::channel(0u64);
        let client = connect_options(url, auth, inbox, who)
            .await?
            .event_callback(move |event| {
                let connected = connected.clone();
                async move {
                    if matches!(event, async_nats::Event::Connected) {
                        connected.send_modify(|n| *n += 1);
                    }
                }
            })
            .connect(servers.as_slice())
            .await
            .map_err(|e| conn(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let bus = NatsBus {
            client,
            js,
            names,
            url: url.to_string(),
            role: role.clone(),
            connects,
            written: std::sync::Arc::default(),
        };
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
            // It reads one key, which may not be there yet.
            Role::Dispatcher { .. } => {}
        }
        Ok(bus)
    }

    /// Servers in the NATS cluster, as the server we reached tells it.
    pub fn cluster_size(&self) -> usize {
        self.client.server_info().connect_urls.len().max(1)
    }

    /// The JetStream stream of meter records.
    async fn meter_stream(&self) -> Result<jetstream::stream::Stream, BusError> {
        let name = self.names.meter_stream();
        self.js.get_stream(&name).await.map_err(|e| BusError::op(format!("opening stream {name}"), e))
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
    fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    async fn meter_lag(&self) -> Result<Option<u64>, BusError> {
        let info = self
            .meter_stream()
            .await?
            .consumer_info(self.names.meter_consumer())
            .await
            .map_err(|e| BusError::op("reading the meter consumer's state", e))?;
        Ok(Some(info.num_pending + info.num_ack_pending as u64))
    }

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
        use sha2::Digest;
        let store = self.desired_store().await?;
        let max = self.client.server_info().max_payload;
        let existing = self.desired_now(&set.group).await?;
        let mut wanted = std::collections::BTreeSet::new();
        let mut refused = None;
        for d in &set.deployments {
            let key = self.names.desired_key(&set.group, &d.id)?;
            wanted.insert(key.clone());
            let body = serde_json::to_vec(d).map_err(|e| BusError::op("encoding a deployment", e))?;
            if body.len() > max {
                // Refused alone: the group's other deployments go on.
                refused.get_or_insert(BusError::TooLarge { deployment: d.id.clone(), size: body.len(), max });
                continue;
            }
            let digest: [u8; 32] = sha2::Sha256::digest(&body).into();
            // Unchanged and still there (a wiped bucket is written again).
            let written = self.written.lock().get(&key) == Some(&digest);
            if written && existing.contains(&key) {
                continue;
            }
            // The write carries the trace of the change that made it (the
            // API request), for the hosts that apply it.
            let trace = sluice_telemetry::context::current();
            let stored = if trace.is_empty() {
                store.put(&key, body.into()).await.map(drop).map_err(|e| e.to_string())
            } else {
                let mut headers = async_nats::HeaderMap::new();
                for (k, v) in &trace {
                    headers.insert(k.as_str(), v.as_str());
                }
                let subject = format!("$KV.{}.{key}", self.names.desired_bucket());
                match self.js.publish_with_headers(subject, headers, body.into()).await {
                    Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            };
            stored.map_err(|e| BusError::op(format!("storing deployment {} of group {}", d.id, set.group), e))?;
            self.written.lock().insert(key, digest);
        }
        for key in existing.iter().filter(|k| !wanted.contains(*k)) {
            store.delete(key).await.map_err(|e| BusError::op(format!("removing desired key {key}"), e))?;
            self.written.lock().remove(key);
        }
        refused.map_or(Ok(()), Err)
    }

    async fn watch_desired(&self, group: &str) -> Result<BoxStream<'static, DesiredSet>, BusError> {
        DesiredWatch::start(self, group).await
    }

    async fn set_ownership(&self, table: &sluice_group::OwnershipTable) -> Result<(), BusError> {
        let key = self.names.group_key(table.group())?;
        let bucket = self.names.groups_bucket();
        let body = serde_json::to_vec(table).map_err(|e| BusError::op("encoding an ownership table", e))?;
        let store =
            self.js.get_key_value(&bucket).await.map_err(|e| BusError::op(format!("opening KV bucket {bucket}"), e))?;
        store.put(&key, body.into()).await.map_err(|e| {
            BusError::op(format!("storing version {} of group {key}'s ownership table", table.version()), e)
        })?;
        Ok(())
    }

    async fn ownership(&self, group: &str) -> Result<Option<sluice_group::OwnershipTable>, BusError> {
        let key = self.names.group_key(group)?;
        let bucket = self.names.groups_bucket();
        let op = || format!("reading group {key}'s ownership table");
        let Ok(store) = self.js.get_key_value(&bucket).await else {
            // A gateway that publishes no tables yet.
            return Ok(None);
        };
        let Some(body) = store.get(&key).await.map_err(|e| BusError::op(op(), e))? else { return Ok(None) };
        let table: sluice_group::OwnershipTable = serde_json::from_slice(&body)
            .map_err(|e| BusError::Decode { what: "ownership table", reason: e.to_string() })?;
        if table.group() != group {
            return Err(BusError::op(op(), format!("the table under key {key} is group {}'s", table.group())));
        }
        Ok(Some(table))
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
        let consumer = self
            .meter_stream()
            .await?
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
        let messages = consumer
            .stream()
            .expires(METER_PULL_EXPIRES)
            .heartbeat(METER_PULL_EXPIRES / 2)
            .messages()
            .await
            .map_err(|e| BusError::op("consuming meter records", e))?;
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
        let max = self.client.server_info().max_payload.max(1024);
        let body = serde_json::to_vec(batch).map_err(|e| BusError::op("encoding events", e))?;
        if body.len() <= max {
            return self.client.publish(subject, body.into()).await.map_err(|e| BusError::op("publishing events", e));
        }
        // Split into messages under the server's max_payload.
        let mut parts = vec![batch.clone()];
        while let Some(part) = parts.pop() {
            let body = serde_json::to_vec(&part).map_err(|e| BusError::op("encoding events", e))?;
            if body.len() <= max {
                self.client
                    .publish(subject.clone(), body.into())
                    .await
                    .map_err(|e| BusError::op("publishing events", e))?;
            } else if part.events.len() > 1 {
                let mut first = part.clone();
                let second = first.events.split_off(part.events.len() / 2);
                parts.push(EventBatch { host: part.host.clone(), events: second, dropped: 0 });
                parts.push(first);
            } else {
                tracing::warn!(bytes = body.len(), "an NF event is larger than the server's max_payload; dropped");
            }
        }
        Ok(())
    }

    async fn publish_peer(&self, group: &str, to: &str, from: &str, body: Vec<u8>) -> Result<(), BusError> {
        let subject = self.names.peer(group, to, from)?;
        self.client.publish(subject, body.into()).await.map_err(|e| BusError::op("sending peer state", e))
    }

    fn try_publish_peer(&self, group: &str, to: &str, from: &str, body: Vec<u8>) -> Result<Option<Vec<u8>>, BusError> {
        let subject = self.names.peer(group, to, from)?;
        let body = bytes::Bytes::from(body);
        // The client's first poll hands the message to its connection task
        // when its queue has room; otherwise the future is dropped unsent
        // (the queue's send is cancel-safe) and the body goes back.
        match futures::FutureExt::now_or_never(self.client.publish(subject, body.clone())) {
            Some(r) => r.map(|()| None).map_err(|e| BusError::op("sending peer state", e)),
            None => Ok(Some(Vec::from(body))),
        }
    }

    async fn peer_inbox(&self, group: &str, me: &str) -> Result<BoxStream<'static, FromHost<Vec<u8>>>, BusError> {
        let sub = self
            .client
            .subscribe(self.names.peer_inbox(group, me)?)
            .await
            .map_err(|e| BusError::op("subscribing to peer state", e))?;
        Ok(sub.map(|m| FromHost { host: publisher(&m.subject), message: m.payload.to_vec() }).boxed())
    }

    async fn maintain(&self) -> Result<(), BusError> {
        match &self.role {
            Role::Gateway { replicas } => self.ensure(*replicas).await,
            Role::Host { .. } | Role::Dispatcher { .. } => Ok(()),
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

/// The W3C trace context a message's headers carry, if any.
fn trace_context(headers: Option<&async_nats::HeaderMap>) -> Option<sluice_telemetry::context::Carrier> {
    let headers = headers?;
    let fields = ["traceparent", "tracestate"].into_iter().filter_map(|n| headers.get(n).map(|v| (n, v.as_str())));
    let out = sluice_telemetry::context::from_headers(fields);
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_seed_others_may_read_is_refused_and_a_root_owned_group_readable_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.nk");
        std::fs::write(&path, "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY\n").unwrap();
        let chmod = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
        chmod(0o600);
        assert!(read_seed(&path).unwrap().starts_with("SU"));
        chmod(0o644);
        assert!(read_seed(&path).unwrap_err().contains("readable by other users"));
        chmod(0o660);
        assert!(read_seed(&path).is_err(), "its group may not write it");
        // A Kubernetes Secret for a non-root process: root:fsGroup, 0440.
        chmod(0o440);
        let by_root = std::fs::metadata(&path).unwrap().uid() == 0;
        assert_eq!(read_seed(&path).is_ok(), by_root);
    }
}
