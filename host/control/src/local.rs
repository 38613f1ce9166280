//! The in-process bus: `sluice dev` (gateway and host in one process) and
//! unit tests. Same semantics as NATS where they matter: the desired set of
//! a group is kept and replayed to late watchers, meter records are
//! delivered in order, heartbeats are best effort. Everything in one
//! process is one trust domain: a message's publisher is the host it names.

use crate::bus::{Ack, Bus, BusError, FromHost, MeterDelivery, verify_digest};
use crate::messages::{DesiredSet, EventBatch, Heartbeat, MeterRecord};
use futures::StreamExt;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, watch};

/// Channels in one process.
#[derive(Debug)]
pub struct LocalBus {
    heartbeats: broadcast::Sender<Heartbeat>,
    events: broadcast::Sender<EventBatch>,
    desired: Mutex<HashMap<String, watch::Sender<Option<DesiredSet>>>>,
    modules: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    tables: Mutex<HashMap<String, sluice_group::OwnershipTable>>,
    meters_tx: mpsc::UnboundedSender<MeterRecord>,
    meters_rx: Mutex<Option<mpsc::UnboundedReceiver<MeterRecord>>>,
}

impl Default for LocalBus {
    fn default() -> Self {
        let (meters_tx, rx) = mpsc::unbounded_channel();
        LocalBus {
            heartbeats: broadcast::channel(256).0,
            events: broadcast::channel(1024).0,
            desired: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            tables: Mutex::new(HashMap::new()),
            meters_tx,
            meters_rx: Mutex::new(Some(rx)),
        }
    }
}

impl LocalBus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    fn group(&self, group: &str) -> watch::Sender<Option<DesiredSet>> {
        let mut map = self.desired.lock();
        map.entry(group.to_string()).or_insert_with(|| watch::channel(None).0).clone()
    }
}

#[async_trait::async_trait]
impl Bus for LocalBus {
    async fn heartbeat(&self, hb: &Heartbeat) -> Result<(), BusError> {
        // No receiver yet is fine: heartbeats are best effort.
        let _ = self.heartbeats.send(hb.clone());
        Ok(())
    }

    async fn heartbeats(&self) -> Result<BoxStream<'static, FromHost<Heartbeat>>, BusError> {
        Ok(feed(self.heartbeats.subscribe()).map(|hb| FromHost { host: hb.host.clone(), message: hb }).boxed())
    }

    async fn set_desired(&self, set: &DesiredSet) -> Result<(), BusError> {
        self.group(&set.group).send_replace(Some(set.clone()));
        Ok(())
    }

    async fn set_ownership(&self, table: &sluice_group::OwnershipTable) -> Result<(), BusError> {
        self.tables.lock().insert(table.group().to_string(), table.clone());
        Ok(())
    }

    async fn ownership(&self, group: &str) -> Result<Option<sluice_group::OwnershipTable>, BusError> {
        Ok(self.tables.lock().get(group).cloned())
    }

    async fn watch_desired(&self, group: &str) -> Result<BoxStream<'static, DesiredSet>, BusError> {
        let mut rx = self.group(group).subscribe();
        rx.mark_changed();
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                let current = rx.borrow_and_update().clone();
                if let Some(set) = current {
                    return Some((set, rx));
                }
            }
        })
        .boxed())
    }

    async fn put_module(&self, digest: &str, bytes: &[u8]) -> Result<(), BusError> {
        verify_digest(digest, bytes)?;
        let mut map = self.modules.lock();
        map.entry(digest.to_string()).or_insert_with(|| Arc::new(bytes.to_vec()));
        Ok(())
    }

    async fn get_module(&self, digest: &str) -> Result<Vec<u8>, BusError> {
        let map = self.modules.lock();
        map.get(digest).map(|b| b.to_vec()).ok_or_else(|| BusError::NoModule { digest: digest.to_string() })
    }

    async fn publish_meter(&self, rec: &MeterRecord) -> Result<(), BusError> {
        self.meters_tx.send(rec.clone()).map_err(|_| BusError::op("publishing a meter record", "the bus is closed"))
    }

    async fn meters(&self) -> Result<BoxStream<'static, Result<MeterDelivery, BusError>>, BusError> {
        let rx = self.meters_rx.lock().take().ok_or(BusError::MetersTaken)?;
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            let record = rx.recv().await?;
            Some((Ok(MeterDelivery { publisher: record.host.clone(), record, ack: Ack::None }), rx))
        })
        .boxed())
    }

    async fn publish_events(&self, batch: &EventBatch) -> Result<(), BusError> {
        let _ = self.events.send(batch.clone());
        Ok(())
    }

    async fn events(&self) -> Result<BoxStream<'static, FromHost<EventBatch>>, BusError> {
        Ok(feed(self.events.subscribe()).map(|b| FromHost { host: b.host.clone(), message: b }).boxed())
    }
}

/// A broadcast receiver as a stream that skips what it lagged behind on
/// (both feeds it serves are best effort).
fn feed<T: Clone + Send + 'static>(rx: broadcast::Receiver<T>) -> BoxStream<'static, T> {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(v) => return Some((v, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[tokio::test]
    async fn late_watchers_get_the_current_set_then_changes() {
        let bus = LocalBus::new();
        let mut set = DesiredSet { group: "g".into(), ..Default::default() };
        bus.set_desired(&set).await.unwrap();
        let mut w = bus.watch_desired("g").await.unwrap();
        assert_eq!(w.next().await.unwrap(), set);
        set.deployments.clear();
        set.group = "g".into();
        bus.set_desired(&DesiredSet { group: "other".into(), ..Default::default() }).await.unwrap();
        bus.set_desired(&set).await.unwrap();
        assert_eq!(w.next().await.unwrap().group, "g");
    }

    #[tokio::test]
    async fn modules_are_checked_against_their_digest() {
        let bus = LocalBus::new();
        let digest = "7f83b1657ff1fc53b92dc18148a1d65dfc2d4b1fa3d677284addd200126d9069"; // "Hello World!"
        assert!(matches!(bus.put_module(digest, b"nope").await, Err(BusError::Corrupt { .. })));
        bus.put_module(digest, b"Hello World!").await.unwrap();
        assert_eq!(bus.get_module(digest).await.unwrap(), b"Hello World!");
        assert!(matches!(bus.get_module("00").await, Err(BusError::NoModule { .. })));
    }

    #[tokio::test]
    async fn the_meter_feed_has_one_consumer() {
        let bus = LocalBus::new();
        let mut feed = bus.meters().await.unwrap();
        assert!(matches!(bus.meters().await, Err(BusError::MetersTaken)));
        let rec = MeterRecord {
            id: "h-b-1".into(),
            host: "h".into(),
            tenant: "t".into(),
            deployment: "d".into(),
            nf: "fw".into(),
            module: "fw".into(),
            version: "1".into(),
            digest: "x".into(),
            window_start_ms: 0,
            window_end_ms: 1000,
            meters: crate::Meters {
                invocations: 1,
                packets: 2,
                bytes: 3,
                cpu_ns: 4,
                state_ops: 5,
                ..Default::default()
            },
        };
        bus.publish_meter(&rec).await.unwrap();
        let d = feed.next().await.unwrap().unwrap();
        assert_eq!(d.record, rec);
        d.ack().await.unwrap();
    }
}
