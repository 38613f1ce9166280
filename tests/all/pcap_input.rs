//! Damaged and unusual captures through the host.

use sluice_host::{RunError, RunOptions, run};
use sluice_tests::{host_config, nf, write_pcap};
use sluice_wire::build::FrameSpec;

fn opts(input: std::path::PathBuf) -> RunOptions {
    RunOptions { nfs: vec![nf("counter")], chain: None, swaps: vec![], input, output: None, progress: false }
}

#[test]
fn a_file_that_is_not_a_capture_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.pcap");
    std::fs::write(&p, "hello, I am text").unwrap();
    let e = run(&host_config(dir.path(), ""), &opts(p)).unwrap_err();
    assert!(matches!(e, RunError::Pcap(_)), "{e}");
    assert!(e.to_string().contains("not a pcap or pcapng file"), "{e}");
}

#[test]
fn a_missing_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = run(&host_config(dir.path(), ""), &opts(dir.path().join("nope.pcap"))).unwrap_err();
    assert!(e.to_string().contains("nope.pcap"), "{e}");
}

#[test]
fn a_truncated_capture_processes_whole_records_and_reports_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.pcap");
    let frames: Vec<Vec<u8>> = (0..10).map(|i| FrameSpec::udp4([10, 0, 0, 1], i, [10, 0, 0, 2], 53).build()).collect();
    write_pcap(&p, &frames);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 20]).unwrap();
    let r = run(&host_config(dir.path(), ""), &opts(p)).unwrap();
    assert_eq!(r.packets_in, 9);
    assert!(r.input.truncated_at.is_some());
    assert!(r.summary().contains("cut off"));
}

#[test]
fn malformed_frames_pass_through_an_nf_without_harm() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("junk.pcap");
    let good = FrameSpec::tcp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2, 2).build();
    let mut frames = vec![vec![], vec![0xff; 3], vec![0; 14], good[..20].to_vec(), good.clone()];
    // Random garbage of many lengths.
    let mut x: u32 = 12345;
    for len in [1usize, 13, 15, 33, 54, 60, 1500] {
        frames.push(
            (0..len)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (x >> 16) as u8
                })
                .collect(),
        );
    }
    write_pcap(&p, &frames);
    let r = run(&host_config(dir.path(), ""), &opts(p)).unwrap();
    assert_eq!(r.packets_in, frames.len() as u64);
    assert_eq!(r.packets_out, frames.len() as u64);
    assert_eq!(r.traps, 0);
}

#[test]
fn pcapng_input_is_read() {
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("in.pcapng");
    let mut w = PcapNgWriter::new(std::fs::File::create(&p).unwrap()).unwrap();
    let eth = InterfaceDescriptionBlock { linktype: pcap_file::DataLink::ETHERNET, snaplen: 0, options: vec![] };
    let raw = InterfaceDescriptionBlock { linktype: pcap_file::DataLink::RAW, snaplen: 0, options: vec![] };
    w.write_pcapng_block(eth).unwrap();
    w.write_pcapng_block(raw).unwrap();
    let frame = FrameSpec::udp4([10, 0, 0, 1], 5, [10, 0, 0, 2], 53).build();
    for iface in [0u32, 1, 0] {
        let epb = EnhancedPacketBlock {
            interface_id: iface,
            timestamp: std::time::Duration::from_secs(1),
            original_len: frame.len() as u32,
            data: frame.clone().into(),
            options: vec![],
        };
        w.write_pcapng_block(epb).unwrap();
    }
    drop(w);
    let r = run(&host_config(dir.path(), ""), &opts(p)).unwrap();
    assert_eq!(r.packets_in, 2);
    assert_eq!(r.input.skipped_link_type, 1);
}
