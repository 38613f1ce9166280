//! Desired deployments: watching a group's keys of the desired bucket.

use super::*;
use super::{NatsBus, trace_context};
use crate::messages::DesiredSet;
use crate::subjects::Names;
use async_nats::jetstream;
use futures::StreamExt;
use futures::stream::BoxStream;

impl NatsBus {
    /// A named ordered consumer of `group`'s keys in the desired bucket,
    /// from their current values on, with how many current values it
    /// delivers first. The create request carries its filter, which the
    /// server checks against the host's permissions (an unnamed one could
    /// read every group).
    pub(super) async fn open_watch(&self, group: &str, headers_only: bool) -> Result<(u64, DesiredMessages), BusError> {
        let keys = self.names.desired_keys(group)?;
        let stream_name = format!("KV_{}", self.names.desired_bucket());
        let op = || format!("watching the desired deployments of group {group}");
        let stream = self.js.get_stream(&stream_name).await.map_err(|e| BusError::op(op(), e))?;
        let who = match &self.role {
            Role::Host { host } | Role::Dispatcher { id: host } => host.clone(),
            Role::Gateway { .. } => "gateway".into(),
        };
        let deliver_subject = self.client.new_inbox();
        let id = deliver_subject.rsplit('.').next().unwrap_or_default().to_string();
        let consumer = stream
            .create_consumer(consumer::push::OrderedConfig {
                name: Some(format!("watch_{who}_{id}")),
                deliver_subject,
                filter_subject: format!("$KV.{}.{keys}", self.names.desired_bucket()),
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                replay_policy: consumer::ReplayPolicy::Instant,
                headers_only,
                ..Default::default()
            })
            .await
            .map_err(|e| BusError::op(op(), e))?;
        // From the create answer: a host may not ask for consumer info.
        let initial = consumer.cached_info().num_pending;
        tracing::debug!(group, initial, consumer = %consumer.cached_info().name, "watching the desired deployments");
        let messages = consumer.messages().await.map_err(|e| BusError::op(op(), e))?;
        Ok((initial, messages.map(|m| m.map_err(|e| e.to_string())).boxed()))
    }

    /// The deployments a group's keys hold now (gateway: which keys exist).
    pub(super) async fn desired_now(&self, group: &str) -> Result<std::collections::BTreeSet<String>, BusError> {
        let (mut left, mut messages) = self.open_watch(group, true).await?;
        let mut keys = std::collections::BTreeSet::new();
        while left > 0 {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .map_err(|_| BusError::op(format!("listing the desired keys of group {group}"), "timed out"))?;
            let m = match m {
                Some(Ok(m)) => m,
                Some(Err(e)) => return Err(BusError::op(format!("listing the desired keys of group {group}"), e)),
                None => break,
            };
            let key = desired_key_of(&self.names, &m.subject);
            if is_deletion(&m) {
                keys.remove(&key);
            } else {
                keys.insert(key);
            }
            left = m.info().map(|i| i.pending).unwrap_or(0);
        }
        Ok(keys)
    }
}

/// Messages of a desired-state watch.
type DesiredMessages = BoxStream<'static, Result<jetstream::Message, String>>;

/// A host's watch of its group's desired deployments: the current set
/// once every current key has arrived, then again after every change.
pub(super) struct DesiredWatch {
    bus: NatsBus,
    group: String,
    /// The consumer and how many current values it still has to deliver
    /// before the set is complete; none: to be re-established.
    current: Option<(u64, DesiredMessages)>,
    deployments: std::collections::BTreeMap<String, DeploymentSpec>,
    /// The trace context each key's message carried.
    traces: std::collections::BTreeMap<String, sluice_telemetry::context::Carrier>,
    connects: tokio::sync::watch::Receiver<u64>,
}

impl DesiredWatch {
    /// Watches `group`'s desired deployments: the first watch must work (a
    /// refused one is a configuration error); later ones are retried until
    /// they do.
    pub(super) async fn start(bus: &NatsBus, group: &str) -> Result<BoxStream<'static, DesiredSet>, BusError> {
        let first = bus.open_watch(group, false).await?;
        let mut connects = bus.connects.clone();
        connects.borrow_and_update();
        let state = DesiredWatch {
            bus: bus.clone(),
            group: group.to_string(),
            current: Some(first),
            deployments: std::collections::BTreeMap::new(),
            traces: std::collections::BTreeMap::new(),
            connects,
        };
        Ok(futures::stream::unfold(state, |mut w| async move {
            let set = w.next_set().await;
            Some((set, w))
        })
        .boxed())
    }

    pub(super) fn set(&self) -> DesiredSet {
        let traces = self
            .deployments
            .iter()
            .filter_map(|(key, d)| self.traces.get(key).map(|t| (d.id.clone(), t.clone())))
            .collect();
        DesiredSet { group: self.group.clone(), deployments: self.deployments.values().cloned().collect(), traces }
    }

    async fn next_set(&mut self) -> DesiredSet {
        loop {
            let Some((left, messages)) = self.current.as_mut() else {
                match self.bus.open_watch(&self.group, false).await {
                    Ok((left, messages)) => {
                        self.deployments.clear();
                        self.current = Some((left, messages));
                        if left == 0 {
                            return self.set();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(group = %self.group, "cannot watch the desired deployments yet: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                continue;
            };
            let next = tokio::select! {
                next = messages.next() => next,
                _ = self.connects.changed() => {
                    // Reconnected: the consumer may have gone with the
                    // server; watch again from the current values.
                    tracing::info!(group = %self.group, "reconnected; watching the desired deployments again");
                    self.current = None;
                    continue;
                }
                _ = tokio::time::sleep(WATCH_SILENCE) => {
                    tracing::debug!(group = %self.group, "desired-state watch silent for {WATCH_SILENCE:?}; watching again");
                    self.current = None;
                    continue;
                }
            };
            match next {
                Some(Ok(m)) => {
                    let key = desired_key_of(&self.bus.names, &m.subject);
                    tracing::debug!(group = %self.group, %key, left = *left, "desired-state message");
                    if is_deletion(&m) {
                        self.deployments.remove(&key);
                        self.traces.remove(&key);
                    } else {
                        match trace_context(m.headers.as_ref()) {
                            Some(t) => self.traces.insert(key.clone(), t),
                            None => self.traces.remove(&key),
                        };
                        match serde_json::from_slice::<DeploymentSpec>(&m.payload) {
                            Ok(d) if self.bus.names.desired_key(&self.group, &d.id).ok().as_deref() == Some(&key) => {
                                self.deployments.insert(key, d);
                            }
                            Ok(d) => {
                                tracing::warn!(group = %self.group, %key, "ignoring a deployment ({}) under another's key", d.id)
                            }
                            Err(e) => tracing::warn!(group = %self.group, %key, "ignoring a malformed deployment: {e}"),
                        }
                    }
                    *left = m.info().map(|i| i.pending).unwrap_or(0);
                    if *left == 0 {
                        return self.set();
                    }
                }
                Some(Err(e)) => {
                    // A server lost, a leader moved: watch again from the
                    // current values (converging twice is harmless).
                    tracing::warn!(group = %self.group, "desired-state watch: {e}; watching again");
                    self.current = None;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                None => {
                    self.current = None;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
}

/// The KV key a message of the desired bucket is about.
fn desired_key_of(names: &Names, subject: &async_nats::Subject) -> String {
    let prefix = format!("$KV.{}.", names.desired_bucket());
    subject.as_str().strip_prefix(&prefix).unwrap_or(subject.as_str()).to_string()
}

/// Whether a KV message deletes its key.
fn is_deletion(m: &jetstream::Message) -> bool {
    m.headers.as_ref().and_then(|h| h.get("KV-Operation")).is_some_and(|v| v.as_str() == "DEL" || v.as_str() == "PURGE")
}
