//! Flow offload (`sluice:nf@0.5.0`): the firewall of the NF library with
//! and without offloading its established connections, in memory, on long
//! and short connections, against its native build (which cannot offload).

use crate::{Bench, median};
use anyhow::Result;
use sluice_runtime::{Chain, NativeNf, NfInstance, NfLimits, NfSpec, RawPacket, Runtime};
use sluice_wire::build::FrameSpec;
use sluice_wire::tcp::flags::{ACK, FIN, PSH, SYN};
use std::path::Path;

/// Connections per trace.
const CONNECTIONS: usize = 256;

/// `CONNECTIONS` TCP connections, interleaved: handshake, `data` segments
/// alternating direction, FIN, FIN, ACK; 64-byte frames, one per µs.
pub fn connections(data: usize) -> Vec<Vec<u8>> {
    let mut per_conn: Vec<Vec<Vec<u8>>> = Vec::with_capacity(CONNECTIONS);
    for c in 0..CONNECTIONS {
        let client = [10, 1, (c >> 8) as u8, c as u8];
        let server = [10, 200, 0, 1 + (c % 16) as u8];
        let port = 20_000 + c as u16;
        let out = |f| FrameSpec::tcp4(client, port, server, 443, f).with_frame_len(64).build();
        let back = |f| FrameSpec::tcp4(server, 443, client, port, f).with_frame_len(64).build();
        let mut v = vec![out(SYN), back(SYN | ACK), out(ACK)];
        v.extend((0..data).map(|i| if i % 2 == 0 { back(PSH | ACK) } else { out(ACK) }));
        v.extend([out(FIN | ACK), back(FIN | ACK), out(ACK)]);
        per_conn.push(v);
    }
    let longest = per_conn.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest).flat_map(|i| per_conn.iter().filter_map(move |c| c.get(i).cloned())).collect()
}

/// One row: a trace, its ns per packet natively, in Wasm and in Wasm
/// with offload, and the share of packets that passed under entries.
pub struct Row {
    flows: &'static str,
    packets_per_flow: usize,
    native: f64,
    wasm: f64,
    offload: f64,
    offloaded: f64,
}

/// Measures the firewall (`config`, to which `"offload":true` is added for
/// the offloading build) over long (64 segments after the handshake) and
/// short (4) connections, batch 32.
pub fn measure(
    runtime: &Runtime,
    nfs: &Path,
    config: &str,
    native: fn() -> Box<dyn NativeNf>,
    bench: &Bench,
) -> Result<Vec<Row>> {
    let module = runtime.load_file(&nfs.join("firewall.wasm"))?;
    let spec = |config: String| NfSpec {
        module: module.clone(),
        config: config.into_bytes().into(),
        limits: NfLimits::default(),
        owner: None,
    };
    let offload_config = match config.trim_end().strip_suffix('}') {
        Some(body) => format!("{body},\"offload\":true}}"),
        None => anyhow::bail!("the firewall config is no JSON object"),
    };
    let mut rows = Vec::new();
    for (flows, data) in [("long", 64), ("short", 4)] {
        let frames = connections(data);
        let packets = crate::raw(&frames);
        let mut n = Chain::from_instances(vec![NfInstance::new_native(runtime, spec(config.to_string()), native())?]);
        let mut w = Chain::new(runtime, &[spec(config.to_string())])?;
        let mut o = Chain::new(runtime, &[spec(offload_config.clone())])?;
        let passes = passes(&mut n, &packets);
        anyhow::ensure!(
            passes == packets.len(),
            "the firewall dropped {} of its own connections' packets",
            packets.len() - passes
        );
        // Alternated, so that each gets the machine as the others do.
        let mut native_ns = Vec::new();
        let mut wasm_ns = Vec::new();
        let mut offload_ns = Vec::new();
        for _ in 0..3 {
            native_ns.push(bench.per_packet(&mut n, &packets, 32));
            wasm_ns.push(bench.per_packet(&mut w, &packets, 32));
            offload_ns.push(bench.per_packet(&mut o, &packets, 32));
        }
        let m = o.stages().first().map(|s| s.meters().clone()).unwrap_or_default();
        let offloaded = m.offloaded_packets as f64 / (m.packets + m.offloaded_packets).max(1) as f64;
        rows.push(Row {
            flows,
            packets_per_flow: frames.len() / CONNECTIONS,
            native: median(&mut native_ns),
            wasm: median(&mut wasm_ns),
            offload: median(&mut offload_ns),
            offloaded,
        });
    }
    Ok(rows)
}

/// Packets of one pass the chain forwards.
fn passes(chain: &mut Chain, packets: &[RawPacket<'_>]) -> usize {
    packets
        .chunks(32)
        .map(|c| chain.process(c).iter().filter(|r| matches!(r.fate, sluice_runtime::Fate::Forward(_))).count())
        .sum()
}

/// The Markdown section.
pub fn render(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str("\n## Flow offload: the firewall's established connections without a call\n\n");
    s.push_str(&format!(
        "The NF library's firewall (the stateful firewall of the tables above) with `offload = true`: each direction of an accepted connection is offloaded at its first packet after the handshake, and its later packets pass under the host's entry until the FIN, which the firewall sees. {CONNECTIONS} TCP connections, interleaved, each a handshake, a number of 64-byte segments alternating direction and FIN, FIN, ACK; replayed in batches of 32 (a replay opens every connection again). **native** is the firewall compiled into the host (it cannot offload), **wasm** the same component without offload, **offload** with it; three rounds alternated, median. **offloaded** is the share of packets that passed under entries.\n\n"
    ));
    s.push_str("| connections | packets each | native ns/pkt | wasm ns/pkt | offload ns/pkt | offload/wasm speed | offload/native speed | offloaded |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.2}× | {:.2}× | {:.0} % |\n",
            r.flows,
            r.packets_per_flow,
            r.native,
            r.wasm,
            r.offload,
            r.wasm / r.offload,
            r.native / r.offload,
            r.offloaded * 100.0
        ));
    }
    s
}
