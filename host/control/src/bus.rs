//! The operations hosts and the gateway need from the control plane.

use crate::messages::{DesiredSet, EventBatch, Heartbeat, MeterRecord};
use crate::subjects::NameError;
use futures::StreamExt;
use futures::stream::BoxStream;

/// Why a bus operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// A bad name token.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Cannot reach or set up NATS.
    #[error("NATS at {url}: {reason}")]
    Connect {
        /// Server URL.
        url: String,
        /// Cause.
        reason: String,
    },
    /// An operation failed on the wire.
    #[error("{op}: {reason}")]
    Op {
        /// What was attempted.
        op: String,
        /// Cause.
        reason: String,
    },
    /// A module blob is not in the store.
    #[error("module {digest} is not in the module store; upload it again through the gateway")]
    NoModule {
        /// Digest asked for.
        digest: String,
    },
    /// A module blob does not match its digest.
    #[error("module {digest} from the module store is corrupt (its SHA-256 is {actual})")]
    Corrupt {
        /// Digest asked for.
        digest: String,
        /// Digest of what came back.
        actual: String,
    },
    /// A deployment too large for one NATS message.
    #[error(
        "deployment {deployment} encodes to {size} bytes, over the NATS server's max_payload of {max}; shorten its configs"
    )]
    TooLarge {
        /// Deployment id.
        deployment: String,
        /// Encoded size.
        size: usize,
        /// The server's limit.
        max: usize,
    },
    /// A message could not be decoded.
    #[error("bad {what} message: {reason}")]
    Decode {
        /// Kind of message.
        what: &'static str,
        /// Cause.
        reason: String,
    },
    /// The meter feed has already been taken (one consumer per bus).
    #[error("the meter feed of this bus is already being consumed")]
    MetersTaken,
}

impl BusError {
    pub(crate) fn op(op: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        BusError::Op { op: op.into(), reason: reason.to_string() }
    }
}

/// A message with the host that published it. On NATS that is the last
/// token of the subject it came on, which only that host may publish to
/// (see [`crate::auth`]); what the message itself claims is checked
/// against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromHost<T> {
    /// The publishing host.
    pub host: String,
    /// The message.
    pub message: T,
}

/// A meter record handed to the gateway; `ack` after storing it (or
/// `reject` it), or it is delivered again.
pub struct MeterDelivery {
    /// The host that published it (see [`FromHost`]).
    pub publisher: String,
    /// The record.
    pub record: MeterRecord,
    pub(crate) ack: Ack,
}

pub(crate) enum Ack {
    None,
    Nats(Box<async_nats::jetstream::Message>),
}

impl std::fmt::Debug for MeterDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeterDelivery").field("record", &self.record).finish_non_exhaustive()
    }
}

impl MeterDelivery {
    /// Confirms the record is stored, so it is not delivered again.
    pub async fn ack(self) -> Result<(), BusError> {
        match self.ack {
            Ack::None => Ok(()),
            Ack::Nats(m) => m.ack().await.map_err(|e| BusError::op("acknowledging a meter record", e)),
        }
    }

    /// Drops a record that must not be stored, so it is never delivered
    /// again.
    pub async fn reject(self) -> Result<(), BusError> {
        match self.ack {
            Ack::None => Ok(()),
            Ack::Nats(m) => m
                .ack_with(async_nats::jetstream::AckKind::Term)
                .await
                .map_err(|e| BusError::op("rejecting a meter record", e)),
        }
    }
}

/// The control plane as both sides use it.
#[async_trait::async_trait]
pub trait Bus: Send + Sync + 'static {
    /// Whether the bus is connected now (an in-process bus always is).
    fn connected(&self) -> bool {
        true
    }

    /// Gateway: meter records published and not yet stored and
    /// acknowledged by the meter consumer (none: the bus cannot tell).
    async fn meter_lag(&self) -> Result<Option<u64>, BusError> {
        Ok(None)
    }

    /// Host: announce liveness and deployment status (best effort).
    async fn heartbeat(&self, hb: &Heartbeat) -> Result<(), BusError>;
    /// Gateway: every host's heartbeats.
    async fn heartbeats(&self) -> Result<BoxStream<'static, FromHost<Heartbeat>>, BusError>;
    /// Gateway: replace the desired deployments of a group (durable). A
    /// deployment that cannot be stored ([`BusError::TooLarge`]) is left
    /// out and its error returned after the others are stored.
    async fn set_desired(&self, set: &DesiredSet) -> Result<(), BusError>;
    /// Host: the desired deployments of `group`: the current set first
    /// (possibly empty), then the whole set again after every change.
    async fn watch_desired(&self, group: &str) -> Result<BoxStream<'static, DesiredSet>, BusError>;
    /// Gateway: store a module blob under its digest (idempotent).
    async fn put_module(&self, digest: &str, bytes: &[u8]) -> Result<(), BusError>;
    /// Host: fetch a module blob, checked against its digest.
    async fn get_module(&self, digest: &str) -> Result<Vec<u8>, BusError>;
    /// Host: publish a meter record; returns once it is stored durably.
    /// Publishing the same record again is harmless.
    async fn publish_meter(&self, rec: &MeterRecord) -> Result<(), BusError>;
    /// Gateway: the meter records, at least once each, until acked.
    async fn meters(&self) -> Result<BoxStream<'static, Result<MeterDelivery, BusError>>, BusError>;
    /// Host: publish NF events (best effort).
    async fn publish_events(&self, batch: &EventBatch) -> Result<(), BusError>;
    /// Gateway: every host's NF events.
    async fn events(&self) -> Result<BoxStream<'static, FromHost<EventBatch>>, BusError>;
    /// Gateway: publish a group's flow-ownership table (durable; replaces
    /// the group's previous one).
    async fn set_ownership(&self, table: &sluice_group::OwnershipTable) -> Result<(), BusError>;
    /// Host, dispatcher: the latest flow-ownership table of `group`, if one
    /// was published.
    async fn ownership(&self, group: &str) -> Result<Option<sluice_group::OwnershipTable>, BusError>;
    /// Host: sends peer state to host `to` of `group`, as host `from`
    /// (best effort: a lost message is a replica that is older, and the
    /// next one replaces it).
    async fn publish_peer(&self, group: &str, to: &str, from: &str, body: Vec<u8>) -> Result<(), BusError> {
        let _ = (group, to, from, body);
        Err(BusError::op("sending peer state", "this bus connects no other hosts"))
    }
    /// Host: [`Bus::publish_peer`] for a thread that must not wait (a live
    /// worker answering a pull): `Ok(None)` when the message was handed to
    /// the bus at once, `Ok(Some(body))`, the body given back, when it
    /// could not be without waiting (send it with [`Bus::publish_peer`]).
    fn try_publish_peer(&self, group: &str, to: &str, from: &str, body: Vec<u8>) -> Result<Option<Vec<u8>>, BusError> {
        let _ = (group, to, from);
        Ok(Some(body))
    }
    /// Host: the peer state the other hosts of `group` send to `me`, each
    /// message with its sender.
    async fn peer_inbox(&self, group: &str, me: &str) -> Result<BoxStream<'static, FromHost<Vec<u8>>>, BusError> {
        let _ = (group, me);
        Ok(futures::stream::empty().boxed())
    }
    /// Gateway, periodically: keeps the durable storage as configured (on
    /// NATS: scales the streams to the cluster's size as servers join).
    async fn maintain(&self) -> Result<(), BusError> {
        Ok(())
    }
}

/// Checks a blob against the digest it was asked for.
pub fn verify_digest(digest: &str, bytes: &[u8]) -> Result<(), BusError> {
    use sha2::Digest;
    let actual = hex::encode(sha2::Sha256::digest(bytes));
    if actual == digest { Ok(()) } else { Err(BusError::Corrupt { digest: digest.to_string(), actual }) }
}
