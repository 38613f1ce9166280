//! Linear chains: later NFs see only what earlier ones forwarded.

use sluice_host::{RunOptions, run};
use sluice_tests::{host_config, nf, read_pcap, write_pcap};
use sluice_wire::build::FrameSpec;

#[test]
fn counter_after_firewall_counts_survivors_only() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.pcap");
    let frames: Vec<Vec<u8>> = (0..50u16)
        .map(|i| {
            let dport = if i % 5 == 0 { 22 } else { 80 };
            FrameSpec::tcp4([10, 0, 0, 1], 1000 + i, [10, 0, 0, 2], dport, 2).build()
        })
        .collect();
    write_pcap(&input, &frames);
    let config = host_config(
        dir.path(),
        r#"
        batch-size = 8
        [nf.firewall.config]
        rules = [{ action = "allow", proto = "tcp", dst-ports = "80" }]
        "#,
    );
    let opts = RunOptions {
        nfs: vec![nf("firewall"), nf("counter")],
        chain: None,
        swaps: vec![],
        input,
        output: None,
        progress: false,
    };
    let r = run(&config, &opts).unwrap();
    assert_eq!(r.nfs[0].meters.dropped, 10);
    assert_eq!(r.nfs[1].meters.packets, 40);
    assert_eq!(r.nfs[1].meters.bytes, r.nfs[0].meters.bytes * 40 / 50);
    assert_eq!(r.packets_out, 40);
    // Meters are counted per call, not sampled.
    assert_eq!(r.nfs[0].meters.invocations, 7);
    assert!(r.nfs[0].meters.cpu_ns > 0);
}

/// firewall → ids (label 1: web) | rest (everything else) → tail (both join).
fn branching_chain(dir: &std::path::Path) -> std::path::PathBuf {
    let counter = nf("counter");
    let rest = sluice_tests::nf_as(&counter, dir, "rest");
    let tail = sluice_tests::nf_as(&counter, dir, "tail");
    let chain = dir.join("chain.toml");
    std::fs::write(
        &chain,
        format!(
            r#"
            [[nf]]
            name = "firewall"
            module = "{fw}"
            next = "rest"
            labels = {{ 1 = "ids" }}

            [[nf]]
            name = "ids"
            module = "{ids}"
            next = "tail"

            [[nf]]
            name = "rest"
            module = "{rest}"
            next = "tail"

            [[nf]]
            name = "tail"
            module = "{tail}"
            "#,
            fw = nf("firewall").display(),
            ids = nf("ids").display(),
            rest = rest.display(),
            tail = tail.display(),
        ),
    )
    .unwrap();
    chain
}

const BRANCH_CONFIG: &str = r#"
[nf.firewall.config]
rules = [
  { action = "allow", proto = "tcp", dst-ports = "80", label = 1 },
  { action = "allow", proto = "udp" },
]
[nf.ids.config]
mode = "ips"
rules = ['drop tcp any any -> any 80 (msg:"exe"; content:"evil.exe"; sid:9;)']
"#;

#[test]
fn a_branching_chain_distributes_by_label_and_joins_in_order() {
    use sluice_wire::tcp::flags::{ACK, PSH, SYN};
    let dir = tempfile::tempdir().unwrap();
    let web = |sp: u16, fl, payload: &[u8]| {
        FrameSpec::tcp4([10, 0, 0, 1], sp, [10, 0, 0, 2], 80, fl).with_payload(payload.to_vec()).build()
    };
    let web_reply = |dp: u16| FrameSpec::tcp4([10, 0, 0, 2], 80, [10, 0, 0, 1], dp, SYN | ACK).build();
    let dns = |sp: u16| FrameSpec::udp4([10, 0, 0, 1], sp, [10, 0, 0, 53], 53).build();
    let ssh = FrameSpec::tcp4([10, 0, 0, 1], 7000, [10, 0, 0, 2], 22, SYN).build();
    let frames = vec![
        web(5000, SYN, b""),
        dns(6000),
        web_reply(5000),
        web(5001, SYN, b""),
        web(5000, PSH | ACK, b"GET /ev"),
        dns(6001),
        web(5000, PSH | ACK, b"il.exe"), // completes the signature: IPS drops it
        ssh.clone(),                     // denied by the firewall
        web(5001, PSH | ACK, b"fine"),
        web(5000, ACK, b"after"), // the flow is blocked from now on
    ];
    let input = dir.path().join("in.pcap");
    let output = dir.path().join("out.pcap");
    write_pcap(&input, &frames);
    let config = host_config(dir.path(), BRANCH_CONFIG);
    for batch in [1, 4, 32] {
        let mut c = config.clone();
        c.batch_size = batch;
        let opts = RunOptions {
            nfs: vec![],
            chain: Some(branching_chain(dir.path())),
            swaps: vec![],
            input: input.clone(),
            output: Some(output.clone()),
            progress: false,
        };
        let r = run(&c, &opts).unwrap();
        let names: Vec<&str> = r.nfs.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["firewall", "ids", "rest", "tail"]);
        let m = |i: usize| &r.nfs[i].meters;
        assert_eq!(m(0).packets, 10);
        assert_eq!(m(0).dropped, 1, "ssh");
        assert_eq!(m(1).packets, 7, "the web packets, both directions, went to the IDS (batch {batch})");
        assert_eq!(m(1).dropped, 2, "the signature packet and the rest of its flow");
        assert_eq!(m(2).packets, 2, "the DNS packets went the other way");
        assert_eq!(m(3).packets, 7, "both branches join at the tail");
        let expected: Vec<Vec<u8>> = [0usize, 1, 2, 3, 4, 5, 8].iter().map(|&i| frames[i].clone()).collect();
        assert_eq!(read_pcap(&output), expected, "joined packets keep their arrival order");
        assert!(r.events.iter().any(|e| e.kind == "ids.alert" && e.fields["sid"] == "9"));
    }
}

#[test]
fn a_chain_file_that_loops_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let chain = dir.path().join("chain.toml");
    let fw = nf("firewall");
    std::fs::write(
        &chain,
        format!(
            "[[nf]]\nname='a'\nmodule='{0}'\nnext='b'\n[[nf]]\nname='b'\nmodule='{0}'\nlabels={{ 3 = 'a' }}\n",
            fw.display()
        ),
    )
    .unwrap();
    let input = dir.path().join("in.pcap");
    write_pcap(&input, &[FrameSpec::udp4([10, 0, 0, 1], 1, [10, 0, 0, 2], 2).build()]);
    let opts = RunOptions { nfs: vec![], chain: Some(chain), swaps: vec![], input, output: None, progress: false };
    let e = run(&host_config(dir.path(), ""), &opts).unwrap_err().to_string();
    assert!(e.contains("'b' routes to 'a', which comes before it"), "{e}");
}
