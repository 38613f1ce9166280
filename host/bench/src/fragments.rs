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
/// Rounds of the three measurements.
const ROUNDS: usize = 5;

/// The smallest and largest of `v`.
fn spread(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

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
    let chain = |mode: FragmentMode| -> Result<Chain> {
        let mut c = Chain::new(runtime, std::slice::from_ref(&spec))?;
        c.set_fragment_mode(mode);
        Ok(c)
    };
    let (whole_raw, frag_raw) = (raw(&whole), raw(&fragments));
    let mut cases = [
        (chain(FragmentMode::Follow)?, &whole_raw, Vec::new()),
        (chain(FragmentMode::Follow)?, &frag_raw, Vec::new()),
        (chain(FragmentMode::Reassemble)?, &frag_raw, Vec::new()),
    ];
    // Rounds of the three in turn, so a slow spell of the machine falls on
    // all of them; each round's ratios are to that round's whole datagrams.
    let mut ratios = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        let mut round = [0.0; 3];
        for (i, (c, packets, ns)) in cases.iter_mut().enumerate() {
            let per = bench.per_packet(c, packets, batch) * packets.len() as f64 / DATAGRAMS as f64;
            ns.push(per);
            if let Some(r) = round.get_mut(i) {
                *r = per;
            }
        }
        for (k, r) in ratios.iter_mut().enumerate() {
            r.push(round.get(k + 1).copied().unwrap_or(f64::NAN) / round[0]);
        }
    }
    let [base, follow, reassemble] = cases.map(|(_, _, mut ns)| crate::median(&mut ns));
    let [mut rf, mut rr] = ratios;
    let (rf_lo, rf_hi) = spread(&rf);
    let (rr_lo, rr_hi) = spread(&rr);
    let (follow_ratio, reassemble_ratio) = (crate::median(&mut rf), crate::median(&mut rr));
    let mut md = String::from("\n## Fragmented datagrams: follow vs reassemble\n\n");
    md.push_str(&format!(
        "The NAT (Wasm) over {DATAGRAMS} UDP datagrams of {PAYLOAD} bytes from {DATAGRAMS} inside flows, batch {batch}: **whole** (one 3,042-byte frame each), and cut into three IPv4 fragments of at most 1,500 bytes, first fragment first, through a chain in each fragment mode: **follow** (the NAT sees the first fragment, the other two get its verdict and address rewrite from the host) and **reassemble** (the host holds the fragments, the NAT sees the whole datagram, the host cuts the result into three fragments again). {ROUNDS} rounds of the three in turn; ns per datagram: median over the rounds of each round's median sample; **vs whole**: median of the rounds' ratios to that round's whole datagrams (range in brackets).\n\n"
    ));
    md.push_str("| datagrams as | ns per datagram | vs whole |\n|---|---:|---:|\n");
    md.push_str(&format!("| whole | {base:.0} | 1.00 |\n"));
    md.push_str(&format!("| 3 fragments, follow | {follow:.0} | {follow_ratio:.2} ({rf_lo:.2}–{rf_hi:.2}) |\n"));
    md.push_str(&format!(
        "| 3 fragments, reassemble | {reassemble:.0} | {reassemble_ratio:.2} ({rr_lo:.2}–{rr_hi:.2}) |\n"
    ));
    Ok(md)
}
