//! Helpers shared by the integration tests: where the built components
//! are, and building captures from frame specs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sluice_pcap::PcapSink;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn find(dir_var: &str, default: &str, name: &str) -> PathBuf {
    let dir = std::env::var(dir_var).map(PathBuf::from).unwrap_or_else(|_| workspace().join(default));
    let p = dir.join(format!("{name}.wasm"));
    assert!(p.exists(), "{} is missing: run `make nfs test-nfs` (or `make test`) first", p.display());
    p
}

/// A component from `nfs-wasm/` (built by `make nfs`).
pub fn nf(name: &str) -> PathBuf {
    find("SLUICE_NFS_DIR", "target/nfs", name)
}

/// A test-only component (built by `make test-nfs`). One that target only
/// `test-nfs`'s cargo build produces but does not copy (a new bin of
/// `tests/nfs/hostile`) is taken from cargo's output directory.
pub fn test_nf(name: &str) -> PathBuf {
    let built = workspace().join("target/wasm32-wasip2/nf").join(format!("{name}.wasm"));
    let dir =
        std::env::var("SLUICE_TEST_NFS_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target/nfs-test"));
    if !dir.join(format!("{name}.wasm")).exists() && built.exists() {
        return built;
    }
    find("SLUICE_TEST_NFS_DIR", "target/nfs-test", name)
}

/// Copies a component under another name (chains need distinct names).
pub fn nf_as(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let dst = dir.join(format!("{name}.wasm"));
    std::fs::copy(src, &dst).unwrap();
    dst
}

/// Writes frames to a pcap with timestamps 1 ms apart.
pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut sink = PcapSink::create(path).unwrap();
    for (i, f) in frames.iter().enumerate() {
        sink.write(1_700_000_000_000_000_000 + i as u64 * 1_000_000, f.len() as u32, f).unwrap();
    }
    sink.finish().unwrap();
}

/// Reads the frames of a pcap.
pub fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let t = sluice_pcap::Trace::open(path).unwrap();
    t.packets().iter().map(|p| t.data(p).to_vec()).collect()
}

/// A host config from TOML text, written next to the test's files.
pub fn host_config(dir: &Path, toml: &str) -> sluice_host::HostConfig {
    let p = dir.join("host.toml");
    std::fs::write(&p, toml).unwrap();
    let mut c = sluice_host::HostConfig::load(Some(&p)).unwrap();
    c.cache_dir = workspace().join("target/sluice-cache");
    c
}

/// Writes frames with explicit timestamps (ns).
pub fn write_pcap_at(path: &Path, frames: &[(u64, Vec<u8>)]) {
    let mut sink = PcapSink::create(path).unwrap();
    for (ts, f) in frames {
        sink.write(*ts, f.len() as u32, f).unwrap();
    }
    sink.finish().unwrap();
}

/// `frames` stamped 1 ms apart, as `write_pcap` does.
pub fn stamped(frames: &[Vec<u8>]) -> Vec<(u64, Vec<u8>)> {
    frames.iter().enumerate().map(|(i, f)| (1_700_000_000_000_000_000 + i as u64 * 1_000_000, f.clone())).collect()
}

/// Runs the host over `frames` (timestamp, bytes) with the host config
/// `config` (TOML) and the NFs `nfs`; `tweak` may change the config and
/// options (batch size, workers, chain, swaps) first. Returns the report
/// and the forwarded frames.
pub fn run_host(
    config: &str,
    nfs: Vec<PathBuf>,
    frames: &[(u64, Vec<u8>)],
    tweak: impl FnOnce(&mut sluice_host::HostConfig, &mut sluice_host::RunOptions),
) -> (sluice_host::Report, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let output = dir.path().join("out.pcap");
    write_pcap_at(&input, frames);
    let mut c = host_config(dir.path(), config);
    let mut opts = sluice_host::RunOptions {
        nfs,
        chain: None,
        swaps: vec![],
        input,
        output: Some(output.clone()),
        progress: false,
    };
    tweak(&mut c, &mut opts);
    let report = sluice_host::run(&c, &opts).unwrap();
    (report, read_pcap(&output))
}
