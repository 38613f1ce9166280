//! The one place that runs `bindgen!` over `wit/`: one module per released
//! version of `sluice:nf`. Every version shares `types` field for field, so
//! later versions' types are mapped onto 0.1.0's: the whole host sees one
//! set of batch and result types whatever version an NF was built against.

/// `sluice:nf@0.1.0`: batches and events, no state tables.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.1.0",
        world: "network-function",
    });
}

/// `sluice:nf@0.2.0`: 0.1.0 plus the `state` import and the `expired`
/// export.
pub mod v0_2 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.2.0",
        world: "network-function",
        with: {
            "sluice:nf/types@0.2.0": super::v0_1::sluice::nf::types,
        },
    });
}

/// `sluice:nf@0.3.0`: 0.2.0 with single-writer tables (one more
/// `consistency` case).
pub mod v0_3 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.3.0",
        world: "network-function",
        with: {
            "sluice:nf/types@0.3.0": super::v0_1::sluice::nf::types,
        },
    });
}

/// `sluice:nf@0.4.0`: 0.3.0 with `scan` and `top-k` (listing a table) and
/// the `scan-page` record. Its `state` types are 0.3.0's field for field
/// but generated anew (wasmtime's `with` maps whole interfaces, and this
/// one has more functions); `host.rs` converts them.
pub mod v0_4 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.4.0",
        world: "network-function",
        with: {
            "sluice:nf/types@0.4.0": super::v0_1::sluice::nf::types,
        },
    });
}

/// `sluice:nf@0.5.0`: 0.4.0 with the `offload` import (flow offload).
/// Its `host-log` and `state` are 0.4.0's field for field, generated anew
/// for the same reason as 0.4.0's; `host.rs` serves both with one body.
pub mod v0_5 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.5.0",
        world: "network-function",
        with: {
            "sluice:nf/types@0.5.0": super::v0_1::sluice::nf::types,
        },
    });
}

/// `sluice:nf@0.6.0`: 0.5.0 with the batch handed to `process` as one
/// byte list (a batch frame, `sluice_wire::abi::seal_frame`). Its
/// `host-log`, `state` and `offload` are 0.5.0's field for field,
/// generated anew as 0.5.0's are; `host.rs` serves them with the same
/// bodies.
pub mod v0_6 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.6.0",
        world: "network-function",
        with: {
            "sluice:nf/types@0.6.0": super::v0_1::sluice::nf::types,
        },
    });
}

/// `sluice:nf@0.7.0`: 0.6.0 with `process` answering in one byte list (a
/// result frame, `sluice_wire::abi::ResultFrame`) and ended offload
/// entries handed in the batch frame instead of through `returned`. Its
/// `host-log` and `state` are 0.5.0's field for field, served with the
/// same bodies; its `offload` is 0.5.0's without `returned`.
pub mod v0_7 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.7.0",
        world: "network-function",
        with: {
            "sluice:nf/types@0.7.0": super::v0_1::sluice::nf::types,
        },
    });
}

pub use v0_1::sluice::nf::types::{Batch, BatchResult, Event, FlowUpdate, Level, NfInfo, Rewrite, StateOp};

/// The name of an event level as reports and the gateway write it.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
        Level::Error => "error",
    }
}
