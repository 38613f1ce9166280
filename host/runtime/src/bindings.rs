//! The one place that runs `bindgen!` over `wit/`: the whole host sees one
//! set of generated `sluice:nf` types.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "network-function",
});

pub use sluice::nf::types::{
    Batch, BatchResult, Event, Flow, FlowKey, FlowUpdate, IpAddr, Level, NfInfo, PacketMeta,
    Rewrite, StateOp, Verdict,
};

impl From<sluice_wire::FlowKey> for FlowKey {
    fn from(k: sluice_wire::FlowKey) -> Self {
        FlowKey {
            src: IpAddr { hi: k.src.hi(), lo: k.src.lo() },
            dst: IpAddr { hi: k.dst.hi(), lo: k.dst.lo() },
            src_port: k.src_port,
            dst_port: k.dst_port,
            protocol: k.protocol,
        }
    }
}

impl From<&FlowKey> for sluice_wire::FlowKey {
    fn from(k: &FlowKey) -> Self {
        sluice_wire::FlowKey {
            src: sluice_wire::IpAddr128::from_parts(k.src.hi, k.src.lo),
            dst: sluice_wire::IpAddr128::from_parts(k.dst.hi, k.dst.lo),
            src_port: k.src_port,
            dst_port: k.dst_port,
            protocol: k.protocol,
        }
    }
}
