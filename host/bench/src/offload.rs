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

/// One row: an NF, a trace, its ns per packet natively, in Wasm and in
/// Wasm with offload, and the share of packets that passed under entries.
pub struct Row {
    nf: &'static str,
    flows: &'static str,
    packets_per_flow: usize,
    native: f64,
    wasm: f64,
    offload: f64,
    offloaded: f64,
}

/// An NF of the library measured with and without offload: its module, its
/// configuration (a JSON object, to which `offload`'s members are added to
/// offload) and its native build.
pub struct Case {
    /// The module's name (`<nfs>/<name>.wasm`).
    pub name: &'static str,
    /// The case's name in the table.
    pub label: &'static str,
    pub config: &'static str,
    /// JSON members that turn offload on (`"offload":true`, ...).
    pub offload: &'static str,
    pub native: fn() -> Box<dyn NativeNf>,
}

/// The NAT's public address in [`nat_connections`] (`crate::NAT_CONFIG`'s).
const NAT_PUBLIC: [u8; 4] = [203, 0, 113, 1];

/// [`connections`] for a NAT in front of the clients: servers outside
/// (198.51.100.x), replies to the NAT's public address and the port the
/// NAT gives each connection (learnt by running the connections' first
/// packets through a fresh NAT, which hands out ports in the same order).
fn nat_connections(runtime: &Runtime, spec: &NfSpec, data: usize) -> Result<Vec<Vec<u8>>> {
    let client = |c: usize| [10, 1, (c >> 8) as u8, c as u8];
    let server = |c: usize| [198, 51, 100, 1 + (c % 16) as u8];
    let port = |c: usize| 20_000 + c as u16;
    let syns: Vec<Vec<u8>> = (0..CONNECTIONS)
        .map(|c| FrameSpec::tcp4(client(c), port(c), server(c), 443, SYN).with_frame_len(64).build())
        .collect();
    let mut learn = Chain::new(runtime, std::slice::from_ref(spec))?;
    let mut public = Vec::with_capacity(CONNECTIONS);
    for chunk in crate::raw(&syns).chunks(32) {
        for (r, p) in learn.process(chunk).iter().zip(chunk) {
            let out = r.data.as_deref().unwrap_or(p.data);
            match sluice_wire::parse(out).key {
                Some(k) if matches!(r.fate, sluice_runtime::Fate::Forward(_)) => public.push(k.src_port),
                _ => anyhow::bail!("the NAT did not translate a connection's first packet"),
            }
        }
    }
    let mut per_conn: Vec<Vec<Vec<u8>>> = Vec::with_capacity(CONNECTIONS);
    for (c, public_port) in public.into_iter().enumerate() {
        let out = |f| FrameSpec::tcp4(client(c), port(c), server(c), 443, f).with_frame_len(64).build();
        let back = |f| FrameSpec::tcp4(server(c), 443, NAT_PUBLIC, public_port, f).with_frame_len(64).build();
        let mut v = vec![out(SYN), back(SYN | ACK), out(ACK)];
        v.extend((0..data).map(|i| if i % 2 == 0 { back(PSH | ACK) } else { out(ACK) }));
        v.extend([out(FIN | ACK), back(FIN | ACK), out(ACK)]);
        per_conn.push(v);
    }
    let longest = per_conn.iter().map(Vec::len).max().unwrap_or(0);
    Ok((0..longest).flat_map(|i| per_conn.iter().filter_map(move |c| c.get(i).cloned())).collect())
}

/// Measures each case over long (64 segments after the handshake) and
/// short (4) connections, batch 32: the firewall over [`connections`], the
/// NAT over [`nat_connections`].
pub fn measure(runtime: &Runtime, nfs: &Path, cases: &[Case], bench: &Bench) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for case in cases {
        let module = runtime.load_file(&nfs.join(format!("{}.wasm", case.name)))?;
        let spec = |config: String| NfSpec {
            module: module.clone(),
            config: config.into_bytes().into(),
            limits: NfLimits::default(),
            owner: None,
        };
        let offload_config = match case.config.trim_end().strip_suffix('}') {
            Some(body) => format!("{body},{}}}", case.offload),
            None => anyhow::bail!("the {} config is no JSON object", case.name),
        };
        for (flows, data) in [("long", 64), ("short", 4)] {
            let frames = if case.name == "nat" {
                nat_connections(runtime, &spec(case.config.to_string()), data)?
            } else {
                connections(data)
            };
            let packets = crate::raw(&frames);
            let mut n = Chain::from_instances(vec![NfInstance::new_native(
                runtime,
                spec(case.config.to_string()),
                (case.native)(),
            )?]);
            let mut w = Chain::new(runtime, &[spec(case.config.to_string())])?;
            let mut o = Chain::new(runtime, &[spec(offload_config.clone())])?;
            for (what, chain) in [("native", &mut n), ("wasm", &mut w), ("offloading", &mut o)] {
                let passes = passes(chain, &packets);
                anyhow::ensure!(
                    passes == packets.len(),
                    "the {what} {} dropped {} of its own connections' packets",
                    case.name,
                    packets.len() - passes
                );
            }
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
                nf: case.label,
                flows,
                packets_per_flow: frames.len() / CONNECTIONS,
                native: median(&mut native_ns),
                wasm: median(&mut wasm_ns),
                offload: median(&mut offload_ns),
                offloaded,
            });
        }
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
    s.push_str("\n## Flow offload: established connections without a call\n\n");
    s.push_str(&format!(
        "The NF library's firewall (the stateful firewall of the tables above) and NAT (`{}`) with `offload = true`. The firewall offloads each direction of an accepted connection at its fourth established packet (`offload-after`, default 4: the counts are kept in the instance's memory, `sluice_sdk::offload::Admission`), or at its first with `offload-after = 1`; the NAT offloads each outbound connection with its translation at its first packet, and translates the replies itself (see `nfs-wasm/nat/README.md`). Later packets pass under the host's entry until the FIN, which the NF sees. {CONNECTIONS} TCP connections, interleaved, each a handshake, a number of 64-byte segments alternating direction and FIN, FIN, ACK (for the NAT, servers outside and replies to its public address); replayed in batches of 32 (a replay opens every connection again). **native** is the NF compiled into the host (it cannot offload), **wasm** the same component without offload, **offload** with it; three rounds alternated, median. **offloaded** is the share of packets that passed under entries.\n\n",
        crate::NAT_CONFIG
    ));
    s.push_str("| NF | connections | packets each | native ns/pkt | wasm ns/pkt | offload ns/pkt | offload/wasm speed | offload/native speed | offloaded |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2}× | {:.2}× | {:.0} % |\n",
            r.nf,
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

/// One language's row of [`languages`]: the conformance suite's offloading
/// firewall (`tests/conformance/offload/nf.*`) without and with offload,
/// ns per packet on long and short connections.
pub struct LangRow {
    lang: sluice_cli::Lang,
    /// Per trace of [`TRACES`]: ns/packet without offload, and per
    /// setting of [`AFTER`] ns/packet with it and the share offloaded.
    traces: Vec<(f64, Vec<(f64, f64)>)>,
}

/// The `offload-after` settings measured: each direction offloaded at its
/// first eligible packet, and at its fourth (the SDKs' admission counts).
const AFTER: [u32; 2] = [1, 4];

/// The traces of [`languages`]: data segments per connection after the
/// handshake.
const TRACES: [(&str, usize); 2] = [("long", 64), ("short", 4)];

/// The conformance case's firewall with every connection of
/// [`connections`] opened from inside; no DSCP change, so that it does
/// what the conformance firewall does plus counting.
const LANG_CONFIG: &str = "inside=10.0.0.0/8\n";

/// Builds the conformance suite's offloading firewall in every language
/// and measures each build without and with `offload=true` over long and
/// short connections, batch 32, three rounds alternated, median.
pub fn languages(sdk_root: &Path, scratch: &Path, langs: &[sluice_cli::Lang], bench: &Bench) -> Result<Vec<LangRow>> {
    let sdk = sluice_cli::Sdk::locate(Some(sdk_root))?.for_projects()?;
    let runtime = Runtime::new(sluice_runtime::RuntimeConfig::default())?;
    let traces: Vec<Vec<Vec<u8>>> = TRACES.iter().map(|(_, data)| connections(*data)).collect();
    let mut rows = Vec::new();
    for &lang in langs {
        let Some(bytes) = crate::languages::build(&sdk, sdk_root, scratch, "offload", lang)? else { continue };
        let module = runtime.load("offload", &bytes)?;
        let spec = |config: &str| NfSpec {
            module: module.clone(),
            config: config.as_bytes().into(),
            limits: NfLimits::default(),
            owner: None,
        };
        let mut row = LangRow { lang, traces: Vec::new() };
        for ((name, _), frames) in TRACES.iter().zip(&traces) {
            eprintln!("  {lang}: {name} connections ...");
            let packets = crate::raw(frames);
            let mut w = Chain::new(&runtime, &[spec(LANG_CONFIG)])?;
            let mut with: Vec<Chain> = AFTER
                .iter()
                .map(|after| {
                    Chain::new(&runtime, &[spec(&format!("{LANG_CONFIG}offload=true\noffload-after={after}\n"))])
                })
                .collect::<Result<_, _>>()?;
            let forwarded = passes(&mut w, &packets);
            anyhow::ensure!(
                forwarded == packets.len(),
                "the {lang} firewall dropped its own connections' packets ({forwarded} of {} passed)",
                packets.len()
            );
            for (o, after) in with.iter_mut().zip(AFTER) {
                let passed = passes(o, &packets);
                anyhow::ensure!(
                    passed == packets.len(),
                    "the {lang} firewall with offload-after {after} dropped its own connections' packets ({passed} of {} passed)",
                    packets.len()
                );
            }
            let mut wasm_ns = Vec::new();
            let mut offload_ns: Vec<Vec<f64>> = vec![Vec::new(); AFTER.len()];
            for _ in 0..3 {
                wasm_ns.push(bench.per_packet(&mut w, &packets, 32));
                for (o, ns) in with.iter_mut().zip(&mut offload_ns) {
                    ns.push(bench.per_packet(o, &packets, 32));
                }
            }
            let settings = with
                .iter()
                .zip(&mut offload_ns)
                .map(|(o, ns)| {
                    let m = o.stages().first().map(|s| s.meters().clone()).unwrap_or_default();
                    let share = m.offloaded_packets as f64 / (m.packets + m.offloaded_packets).max(1) as f64;
                    (median(ns), share)
                })
                .collect();
            row.traces.push((median(&mut wasm_ns), settings));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The Markdown section of [`languages`].
pub fn render_languages(rows: &[LangRow]) -> String {
    let mut s = String::from("\n## Flow offload in each guest language\n\n");
    s.push_str(&format!(
        "The conformance suite's offloading firewall (`tests/conformance/offload/nf.*`: the conformance firewall plus one `counter-add` per batch; with `offload=true` it offloads each direction of an established connection at its `offload-after`th packet without SYN, FIN or RST before the connection's first FIN, counted by the SDK's `Admission`, and adds the counts of ended entries to its table), built by `sluice nf build`'s code path, config `{}`, over the connections of the table above ({CONNECTIONS}, interleaved, 64-byte frames; long: 64 segments after the handshake, short: 4), batch 32. **without** is ns/packet without offload, **offload-after 1** and **4** with `offload=true` and each direction offloaded at its first or its fourth eligible packet (three rounds alternated, median); **speed** is without ÷ with; **vs Rust without** is the Rust build without offload ÷ this row's ns/packet with it; **offloaded** the share of packets that passed under entries.\n\n",
        LANG_CONFIG.trim()
    ));
    s.push_str("| language | connections | without | offload-after 1 | offload-after 4 | speed, after 1 | speed, after 4 | after 1 vs Rust without | after 4 vs Rust without | offloaded (after 1, 4) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    let rust = rows.iter().find(|r| r.lang == sluice_cli::Lang::Rust);
    for r in rows {
        for (t, (without, settings)) in r.traces.iter().enumerate() {
            let base = rust.and_then(|b| b.traces.get(t)).map(|b| b.0).unwrap_or(f64::NAN);
            let ns = |k: usize| settings.get(k).map_or(f64::NAN, |s| s.0);
            let shares: Vec<String> = settings.iter().map(|(_, share)| format!("{:.0} %", share * 100.0)).collect();
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {} |\n",
                r.lang,
                TRACES.get(t).map_or("", |(name, _)| name),
                without,
                ns(0),
                ns(1),
                without / ns(0),
                without / ns(1),
                base / ns(0),
                base / ns(1),
                shares.join(", ")
            ));
        }
    }
    s
}
