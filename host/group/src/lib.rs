//! Host groups: which host owns which flow.
//!
//! The gateway's group controller builds an [`OwnershipTable`] per group
//! from the group's active members and publishes it; a dispatcher sends
//! each flow to its slot's owner, and hosts replicate a flow's state to the
//! slot's next owners, which are exactly the hosts that take the slot over
//! when its owner goes (see [`table`]). A dispatcher moves a flow to a
//! new owner only between flowlets ([`flowlet`]). Release pools are split
//! between the hosts by blocks placed like flows ([`blocks`]).

pub mod blocks;
pub mod flowlet;
mod maglev;
pub mod table;

pub use blocks::{POOL_BLOCK, block_hash, block_of, block_range};
pub use flowlet::{FlowletCounters, Flowlets, NO_HOST, Route, Steer};
pub use table::{DEFAULT_SLOTS, MAX_DEPTH, MAX_MEMBERS, Member, OwnershipTable, TableError};
