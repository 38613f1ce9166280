//! The Sluice runtime: loads `sluice:nf` components once and calls them
//! once per packet batch.
//!
//! What it owns, and why here:
//! - [`Runtime`]: one wasmtime engine per host (Cranelift, component model
//!   without async support, pooling allocator, epoch interruption, optional
//!   fuel, on-disk code cache), so compiled code is shared by all workers.
//! - [`NfModule`]: a validated, compiled, type-checked component. Loading
//!   tells a non-Wasm file, a core module and a component of another world
//!   apart, because tenants need to know which mistake they made.
//! - [`NfInstance`]: one instance per NF per worker with its limits
//!   ([`NfLimits`]), meters ([`Meters`]) and host-owned flow state
//!   ([`FlowTable`]). A trap never escapes: the batch gets the NF's failure
//!   policy and the instance is re-created, state intact.
//! - [`Chain`]: NFs of a worker called in sequence over one batch.
//!
//! ```no_run
//! use sluice_runtime::{Chain, NfLimits, NfSpec, RawPacket, Runtime, RuntimeConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = Runtime::new(RuntimeConfig::default())?;
//! let module = runtime.load_file("target/nfs/firewall.wasm".as_ref())?;
//! let spec = NfSpec { module, config: br#"{"default":"allow"}"#.as_slice().into(), limits: NfLimits::default(), owner: None };
//! let mut chain = Chain::new(&runtime, &[spec])?;
//! let frame = sluice_wire::build::FrameSpec::udp4([10, 0, 0, 1], 5000, [10, 0, 0, 2], 53).build();
//! let results = chain.process(&[RawPacket { data: &frame, wire_len: frame.len() as u32, timestamp_ns: 0, ingress_port: 0 }]);
//! println!("{:?}", results[0].fate);
//! # Ok(()) }
//! ```

pub mod batch;
pub mod bindings;
pub mod chain;
pub mod cpu_time;
pub mod error;
pub mod fate;
pub mod flow_state;
pub mod fragments;
pub mod function_cache;
pub mod guest_io;
pub mod host;
pub mod instance;
pub mod limits;
pub mod meters;
pub mod module;
pub mod offload;
pub mod owner;
mod pre;
pub mod reassembly;
pub mod stages;
pub mod trap;
pub mod wasm_runtime;

pub use batch::{BatchBuilder, RawPacket};
pub use chain::{Chain, ChainCounters, Defer, FlowHook, Hold, Routes, check_routes};
pub use error::RuntimeError;
pub use fate::{Fate, PacketResult};
pub use flow_state::{ExportedFlow, FlowTable, ImportError};
pub use instance::{BatchStatus, EmittedEvent, NativeNf, NfInstance, NfSpec, StageOutput};
pub use limits::{FailurePolicy, NfLimits};
pub use meters::Meters;
pub use module::NfModule;
pub use offload::OffloadCounters;
pub use owner::NfOwner;
pub use stages::{StageTimes, StagesPerPacket, Stopwatch};
pub use trap::TrapCause;
pub use wasm_runtime::{Runtime, RuntimeConfig};
