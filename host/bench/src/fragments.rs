//! What each fragment mode costs: the NAT over 3,000-byte UDP datagrams,
//! whole, as three IPv4 fragments that follow their first, and as three
//! fragments the chain reassembles (and cuts again) before the NAT.

use crate::{Bench, NAT_CONFIG, raw};
use anyhow::{Context, Result};
use sluice_runtime::fragments::FragmentMode;
use sluice_runtime::{Chain, NfLimits, NfSpec, Runtime};
use sluice_wire::build::FrameSpec;
use sluice_wire::ipv4::Ipv4Packet;
use std::path::Path;

/// Datagrams per pass.
const DATAGRAMS: usize = 512;
/// UDP payload of each.
const PAYLOAD: usize = 3000;

/// `DATAGRAMS` whole UDP datagrams from 512 inside flows, without Don't
/// Fragment.
fn datagrams() -> Vec<Vec<u8>> {
    (0..DATAGRAMS)
        .map(|i| {
            let host = [10, 1, (i / 250) as u8, 1 + (i % 250) as u8];
            let mut f = FrameSpec::udp4(host, 40_000 + i as u16, [198, 51, 100, 7], 53)
                .with_payload(vec![i as u8; PAYLOAD])
                .build();
            if let Some(ip) = f.get_mut(14..) {
                if let Some(ident) = ip.get_mut(4..6) {
                    ident.copy_from_slice(&(i as u16).to_be_bytes());
                }
                // Flags and fragment offset: none (Don't Fragment clear).
                if let Some(flags) = ip.get_mut(6..8) {
                    flags.copy_from_slice(&[0, 0]);
                }
                Ipv4Packet::new_unchecked(ip).fill_checksum();
            }
            f
        })
        .collect()
}

/// The section: ns per datagram in each mode, and the ratio to whole
/// datagrams.
pub fn section(runtime: &Runtime, nfs: &Path, bench: &Bench, batch: usize) -> Result<String> {
    let whole = datagrams();
    let mut fragments = Vec::new();
    for d in &whole {
        fragments.extend(sluice_wire::fragment::split_ipv4(d, 1500).map_err(|e| anyhow::anyhow!("{e:?}"))?);
    }
    let path = nfs.join("nat.wasm");
    let module = runtime.load_file(&path).with_context(|| format!("loading {} (run `make nfs`)", path.display()))?;
    let spec = NfSpec { module, config: NAT_CONFIG.as_bytes().into(), limits: NfLimits::default(), owner: None };
    let measure = |frames: &[Vec<u8>], mode: FragmentMode| -> Result<f64> {
        let mut chain = Chain::new(runtime, std::slice::from_ref(&spec))?;
        chain.set_fragment_mode(mode);
        let packets = raw(frames);
        Ok(bench.per_packet(&mut chain, &packets, batch) * frames.len() as f64 / DATAGRAMS as f64)
    };
    let base = measure(&whole, FragmentMode::Follow)?;
    let follow = measure(&fragments, FragmentMode::Follow)?;
    let reassemble = measure(&fragments, FragmentMode::Reassemble)?;
    let mut md = String::from("\n## Fragmented datagrams: follow vs reassemble\n\n");
    md.push_str(&format!(
        "The NAT (Wasm) over {DATAGRAMS} UDP datagrams of {PAYLOAD} bytes from {DATAGRAMS} inside flows, batch {batch}: **whole** (one 3,042-byte frame each), and cut into three IPv4 fragments of at most 1,500 bytes, first fragment first, through a chain in each fragment mode: **follow** (the NAT sees the first fragment, the other two get its verdict and address rewrite from the host) and **reassemble** (the host holds the fragments, the NAT sees the whole datagram, the host cuts the result into three fragments again). ns per datagram, median of the samples; ratio to whole datagrams in the same run.\n\n"
    ));
    md.push_str("| datagrams as | ns per datagram | vs whole |\n|---|---:|---:|\n");
    for (name, ns) in [("whole", base), ("3 fragments, follow", follow), ("3 fragments, reassemble", reassemble)] {
        md.push_str(&format!("| {name} | {ns:.0} | {:.2} |\n", ns / base));
    }
    Ok(md)
}
