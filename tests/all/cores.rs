//! Workers on cores: each pinned where the config says, and deadlines that
//! count the CPU time an NF used, so workers sharing a core never make a
//! well-behaved NF trap, while a runaway NF is still stopped.

use sluice_engine::cores::CoreList;
use sluice_host::{RunOptions, run};
use sluice_tests::{host_config, nf, test_nf, write_pcap};
use sluice_wire::build::FrameSpec;
use std::path::Path;

/// `n` UDP frames over 4096 flows (so every worker gets some).
fn frames(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let f = (i % 4096) as u16;
            FrameSpec::udp4([10, 0, (f >> 8) as u8, f as u8], 1000 + f, [192, 168, 0, 1], 53).build()
        })
        .collect()
}

fn first_core() -> usize {
    CoreList::allowed().unwrap().for_worker(0).unwrap()
}

fn run_on_one_core(dir: &Path, module: &Path, workers: usize, packets: usize, nf_section: &str) -> sluice_host::Report {
    let input = dir.join("in.pcap");
    write_pcap(&input, &frames(packets));
    let config =
        host_config(dir, &format!("batch-size = 256\nworkers = {workers}\ncores = \"{}\"\n{nf_section}", first_core()));
    let opts = RunOptions {
        nfs: vec![module.to_path_buf()],
        chain: None,
        swaps: vec![],
        input,
        output: None,
        progress: false,
    };
    run(&config, &opts).unwrap()
}

/// Eight workers on one core, each NF call allowed 1 ms: workers are
/// preempted for many milliseconds in the middle of calls, which a
/// wall-clock deadline counted as the NF's.
#[test]
fn more_workers_than_cores_never_trap_a_well_behaved_nf() {
    let dir = tempfile::tempdir().unwrap();
    let section = "[nf.firewall]\ndeadline-ms = 1\n[nf.firewall.config]\ndefault = \"allow\"\n";
    let r = run_on_one_core(dir.path(), &nf("firewall"), 8, 400_000, section);
    let core = first_core().to_string();
    assert_eq!(r.cores, core);
    assert_eq!(r.worker_cores, vec![core; 8], "every worker runs on the one core it was given");
    assert_eq!(r.traps, 0, "{:?}", r.nfs[0].meters.trap_causes);
    assert_eq!(r.packets_out, 400_000);
    assert!(r.nfs[0].meters.invocations >= 400_000 / 256);
}

/// A looping NF on workers that share a core is still stopped on every
/// batch, with the cause in the report.
#[test]
fn a_runaway_nf_is_still_stopped_when_workers_share_a_core() {
    let dir = tempfile::tempdir().unwrap();
    let section = "[nf.hostile]\ndeadline-ms = 5\nconfig-text = \"loop\"\nfailure-policy = \"fail-open\"\n";
    let r = run_on_one_core(dir.path(), &test_nf("hostile"), 3, 3 * 256, section);
    let m = &r.nfs[0].meters;
    assert_eq!(m.traps, m.invocations, "{m:?}");
    assert!(m.traps >= 3);
    assert_eq!(m.trap_causes.get("deadline exceeded").copied(), Some(m.traps), "{:?}", m.trap_causes);
    assert_eq!(r.packets_out, 3 * 256, "fail-open forwards the trapped batches");
}

/// A `cores` list the process may not use is refused before any work.
#[test]
fn cores_outside_the_process_affinity_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &frames(4));
    let config = host_config(dir.path(), "cores = \"1023\"\n");
    let opts = RunOptions { nfs: vec![nf("noop")], chain: None, swaps: vec![], input, output: None, progress: false };
    let e = run(&config, &opts).unwrap_err().to_string();
    assert!(e.contains("cores '1023'"), "{e}");
    let config = host_config(dir.path(), "cores = \"3-1\"\n");
    let opts = RunOptions { nfs: vec![nf("noop")], ..opts };
    let e = run(&config, &opts).unwrap_err().to_string();
    assert!(e.contains("backwards"), "{e}");
}
