//! Peer state between the hosts of a group (SNF §5: ephemeral state kept
//! on the host that processes the flow, replicated to the host that would
//! process it next).
//!
//! - Each live worker's lane of a deployment ([`LanePeer`]) marks the flows
//!   its batches touched. Every replication interval it exports their state
//!   from every NF of its chain (flow-state bytes and per-flow table
//!   entries, each with its logical clock) and sends it, batched per host,
//!   to the flow's **next owner**: the first host of the flow's slot in the
//!   group's ownership table that is not this one (the owner itself when
//!   this host is not the owner, e.g. one that is finishing flows after a
//!   table change). A flow whose state ended is sent as an empty entry, so
//!   the replica is forgotten rather than resurrected.
//! - When the table changes, every flow this host holds whose next owner
//!   changed is sent at the next interval too (the flows a new or a
//!   draining host takes over get their state before their next flowlet).
//! - The receiving host keeps replicas in its [`PeerStore`]. When a batch
//!   brings a flow the store holds a replica of, the replica is imported
//!   into the lane's NFs before the chain runs; a part whose clock is not
//!   newer than what the NF holds is stale and refused.
//!
//! - A flowlet the dispatcher moved here whose state is neither here nor
//!   replicated is pulled from the host that had it, its packets waiting
//!   meanwhile ([`pull`]). A pull's request and answer take the hosts'
//!   peer links where they are set up ([`link`]): one datagram each way
//!   instead of two hops through the bus.
//!
//! Nothing here is on the path of a host that is not in a group with
//! peers: a lane without a table does no work but marking flows.

pub mod commit;
mod counters;
mod hook;
mod host;
pub mod link;
mod out;
pub mod pull;
pub mod store;
pub mod wire;

pub use counters::{GlobalTable, MovedFrom, PeerCounters, PoolCounters, wait_bucket_floor, wait_quantile};
pub use hook::{BUSY_EVERY, LATE, LanePeer, REFRESH};
pub use host::{GLOBAL_EVERY, MAX_MESSAGE, Peer, Raised, host_by_hash, next_owner, pools, set_fifo};
pub use link::{LinkError, LinkOffer, PeerLink};
pub use out::{Direct, Outgoing, PeerOut};
pub use store::{PeerStore, Replica, StoreCounters};
pub use wire::{
    BindingsKind, CommitAck, CommitBatch, FlowRequest, GlobalBatch, PeerBatch, PeerMessage, PoolBindings, PoolRelease,
    TableValues, WireError,
};

type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
