//! The one place that runs `bindgen!` over `wit/`: the whole host sees one
//! set of generated `sluice:nf` types.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "network-function",
});

pub use sluice::nf::types::{Batch, BatchResult, Event, FlowUpdate, Level, NfInfo, Rewrite, StateOp};
