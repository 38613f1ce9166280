//! Running an SDK NF natively, as a plain Rust call, through the same host
//! code as Wasm NFs.
//!
//! The batch is converted from the host's generated types to the SDK's
//! (copying the packet bytes once, as lowering into guest memory does) and
//! the result back. What remains between this and the Wasm path is the
//! sandbox: the canonical ABI's lifting/lowering, guest allocation, and
//! Cranelift versus LLVM code.

use sluice_runtime::NativeNf;
use sluice_runtime::bindings as h;
use sluice_sdk::wit::sluice::nf::types as g;
use sluice_sdk::{Batch, NetworkFunction};

/// An SDK NF behind the [`NativeNf`] interface.
pub struct SdkNative<T>(Option<T>);

impl<T> SdkNative<T> {
    /// Not yet initialized.
    pub fn new() -> Self {
        SdkNative(None)
    }
}

impl<T> Default for SdkNative<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The batch frame a 0.6.0 guest gets: one allocation, the same copies.
fn to_guest(b: &h::Batch) -> Result<Batch, String> {
    let mut frame = Vec::with_capacity(
        b.data.len() + 8 + b.descriptors.len() * 8 + b.flow_states.len() + sluice_wire::abi::FRAME_TRAILER,
    );
    frame.extend_from_slice(&b.data);
    sluice_wire::abi::seal_frame(&mut frame, &b.descriptors, &b.flow_states);
    Batch::from_frame(frame)
}

fn from_guest(r: g::BatchResult) -> h::BatchResult {
    h::BatchResult {
        verdicts: r.verdicts,
        rewrites: r.rewrites.into_iter().map(|w| h::Rewrite { packet: w.packet, data: w.data }).collect(),
        flow_updates: r
            .flow_updates
            .into_iter()
            .map(|u| h::FlowUpdate {
                flow: u.flow,
                op: match u.op {
                    g::StateOp::Set(v) => h::StateOp::Set(v),
                    g::StateOp::Remove => h::StateOp::Remove,
                },
            })
            .collect(),
    }
}

impl<T: NetworkFunction + Send> NativeNf for SdkNative<T> {
    fn init(&mut self, config: &[u8]) -> Result<h::NfInfo, String> {
        let (nf, info) = T::init(config)?;
        self.0 = Some(nf);
        Ok(h::NfInfo { wants_flow_state: info.wants_flow_state, flow_idle_timeout_ns: info.flow_idle_timeout_ns })
    }

    fn process(&mut self, batch: &h::Batch) -> Result<h::BatchResult, String> {
        let nf = self.0.as_mut().ok_or("process before init")?;
        let mut b = to_guest(batch)?;
        nf.process(&mut b)?;
        Ok(from_guest(b.finish()))
    }

    fn expired(&mut self, table: u32, entries: &[u8]) -> Result<(), String> {
        let nf = self.0.as_mut().ok_or("expired before init")?;
        nf.expired(table, entries)
    }
}
