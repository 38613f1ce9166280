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

use crate::bus::{Ack, Bus, BusError, MeterDelivery, verify_digest};
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

/// A connection to NATS for one cluster.
#[derive(Debug, Clone)]
pub struct NatsBus {
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    url: String,
}

impl NatsBus {
    /// Connects (retrying until the server is up) and makes sure the
    /// cluster's stream and buckets exist. `who` names the connection in
    /// the server's monitoring.
    pub async fn connect(url: &str, cluster: &str, who: &str) -> Result<Self, BusError> {
        let names = Names::new(cluster)?;
        let conn = |reason: String| BusError::Connect { url: url.to_string(), reason };
        let client = async_nats::ConnectOptions::new()
            .name(who)
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .connect(url)
            .await
            .map_err(|e| conn(e.to_string()))?;
        let js = jetstream::new(client.clone());
        let bus = NatsBus { client, js, names, url: url.to_string() };
        tokio::time::timeout(Duration::from_secs(30), bus.ensure())
            .await
            .map_err(|_| conn("JetStream did not answer within 30 s; is the server started with -js?".into()))??;
        Ok(bus)
    }

    async fn ensure(&self) -> Result<(), BusError> {
        let n = &self.names;
        self.js
            .get_or_create_stream(stream::Config {
                name: n.meter_stream(),
                description: Some("Sluice meter records".into()),
                subjects: vec![n.meters()],
                storage: stream::StorageType::File,
                duplicate_window: DUPLICATE_WINDOW,
                max_age: METER_RETENTION,
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
                    ..Default::default()
                })
                .await
                .map_err(|e| self.conn(format!("creating object store {}: {e}", n.module_bucket())))?;
        }
        Ok(())
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

    async fn heartbeats(&self) -> Result<BoxStream<'static, Heartbeat>, BusError> {
        let sub = self
            .client
            .subscribe(self.names.heartbeats())
            .await
            .map_err(|e| BusError::op("subscribing to heartbeats", e))?;
        Ok(sub
            .filter_map(|m| async move {
                match serde_json::from_slice::<Heartbeat>(&m.payload) {
                    Ok(hb) => Some(hb),
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
        let key = self.names.desired_key(group)?;
        let watch = self
            .desired_store()
            .await?
            .watch_with_history(&key)
            .await
            .map_err(|e| BusError::op(format!("watching the desired set of group {group}"), e))?;
        let group = group.to_string();
        Ok(watch
            .filter_map(move |entry| {
                let group = group.clone();
                async move {
                    let entry = match entry {
                        Ok(e) => e,
                        Err(e) => {
                            tracing::warn!(%group, "desired-set watch: {e}");
                            return None;
                        }
                    };
                    if entry.operation != kv::Operation::Put {
                        return Some(DesiredSet { group, deployments: Vec::new() });
                    }
                    match serde_json::from_slice::<DesiredSet>(&entry.value) {
                        Ok(set) => Some(set),
                        Err(e) => {
                            tracing::warn!(%group, "ignoring a malformed desired set: {e}");
                            None
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
                    Ok(record) => Ok(MeterDelivery { record, ack: Ack::Nats(Box::new(m)) }),
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

    async fn events(&self) -> Result<BoxStream<'static, EventBatch>, BusError> {
        let sub =
            self.client.subscribe(self.names.events()).await.map_err(|e| BusError::op("subscribing to events", e))?;
        Ok(sub
            .filter_map(|m| async move {
                match serde_json::from_slice::<EventBatch>(&m.payload) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::warn!(subject = %m.subject, "ignoring malformed events: {e}");
                        None
                    }
                }
            })
            .boxed())
    }
}
