//! What a deployment takes of a host's traffic and how its NFs see it.
//!
//! The control protocol, the gateway and the engine share these words, so
//! they live below all three: [`Attachment`]s (which packets, and where
//! they leave), the [`FragmentMode`] (what NFs see of fragmented IP) and
//! the [`Spread`] (which packets meet on one worker), and the one rule
//! for names ([`check_name`]) of tenants, modules, deployments, groups and
//! hosts.
//! Matching packets against attachments is the engine's classifier;
//! reassembly and fragments that follow their first are the runtime's.

mod attachment;
mod fragment_mode;
mod name;
mod spread;

pub use attachment::{Attachment, AttachmentError, MAX_VLAN, Side, outside_ports};
pub use fragment_mode::FragmentMode;
pub use name::{NAME_PATTERN, NameError, check_name, check_version};
pub use spread::Spread;
