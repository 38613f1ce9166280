//! The Sluice data path, one for every way packets reach a host.
//!
//! A [`Worker`] owns one chain of NF instances (see
//! [`sluice_runtime::Chain`]); a [`Dispatch`] moves packets through
//! workers a batch at a time: its step takes a batch from a [`PacketIo`],
//! runs each worker's chain once over its part, and hands every packet's
//! result back to the same I/O, which sends, writes or records it. A
//! worker alone on its I/O is the one-lane case
//! ([`Dispatch::step_one`]), and every packet thread runs the same loop
//! around its step ([`Driver`]). Everything between
//! receiving and delivering happens here, once: the views of the batch,
//! frames too long for any NF (refused alone), the chain's verdicts,
//! rewrites, meters (with trap causes) and events, and hot swaps between
//! batches. The I/O decides only where packets come from and go to:
//!
//! - [`CaptureIo`]: packets of a capture, in file order or in the order of
//!   a list of indices (`sluice-host run`'s workers, `serve`'s replays and
//!   spool captures);
//! - `DpdkIo` (feature `dpdk`): the RX/TX queues of a worker on DPDK
//!   ports (`sluice-host dpdk`).
//!
//! On a host shared by tenants, a [`Dispatch`] gives each packet of a
//! batch to at most one deployment's worker ([`Lane`]) by the
//! deployments' traffic [`Attachment`]s, and applies the host's
//! [`Unmatched`] policy to the rest.
//!
//! Workers of several tenants that share a core get equal shares of it
//! per tenant ([`FairShare`]), not per thread.
//!
//! Buffers are kept between batches: a step allocates nothing on its own
//! (the guest's answer, lifted by the canonical ABI, aside).

pub mod capture;
pub mod classify;
pub mod cores;
pub mod datagrams;
pub mod dispatch;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod driver;
pub mod fair;
#[cfg(feature = "dpdk")]
pub mod handoff;
pub mod idle;
pub mod io;
pub mod worker;

pub use capture::{CaptureIo, Order};
pub use classify::{Attachment, AttachmentError, Classifier, Side, Unmatched, outside_ports};
pub use dispatch::{Dispatch, DispatchCounters, Lane};
pub use driver::{Driver, End, Pass};
pub use fair::{FairShare, Share};
pub use io::{OutputCount, PacketIo, PortReport, QueueCounters, Receive, Results, ResultsIter};
pub use sluice_runtime::fragments::FragmentMode;
pub use sluice_wire::steer::SteerMark;
pub use worker::{Worker, recycle};
