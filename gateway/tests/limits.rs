//! No tenant can block, crash or starve the platform: size limits on what
//! a tenant declares, answered before anything is stored or published, and
//! a deployment that cannot be published fails alone while the group's
//! other deployments (other tenants') still converge. Real gateway, host
//! and nats-server processes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::json;

/// Host `h1` replaying a synthetic trace of `sessions` forever at `pps`.
fn replaying_host(nats: &Nats, gw: &Gateway, dir: &std::path::Path, sessions: usize, pps: u32) -> Proc {
    replaying_host_with(nats, gw, dir, &trace(dir, sessions), pps, &[])
}

/// Host `h1` replaying `pcap` forever at `pps` (0: as fast as it can) with
/// more flags; its report is `<dir>/h1.json`.
fn replaying_host_with(
    nats: &Nats,
    gw: &Gateway,
    dir: &std::path::Path,
    pcap: &std::path::Path,
    pps: u32,
    extra: &[String],
) -> Proc {
    let report = dir.join("h1.json");
    let mut args = Replay { pcap, loops: 0, pps, window_ms: 200, report: &report }.args();
    args.extend(extra.iter().cloned());
    start_host(nats, gw, dir, "h1", &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `--config` flags of a host config holding `toml`.
fn config_flags(dir: &std::path::Path, toml: &str) -> Vec<String> {
    let config = dir.join("host.toml");
    std::fs::write(&config, toml).unwrap();
    vec!["--config".to_string(), config.display().to_string()]
}

/// Runs `f(0..n)` on `n` threads at once; their answers in order.
fn at_once<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..n).map(|i| s.spawn(move || f(i))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn an_oversize_deployment_is_refused_or_fails_alone_and_the_group_converges() {
    let _turn = beside_others();
    let dir = test_dir();
    // A server with a small max_payload: a deployment under the API's
    // limits can still be too large for it.
    let nats = Nats::start_with(dir.path(), |c| c.replace("max_payload: 8MB", "max_payload: 256KB"));
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let _host = replaying_host(&nats, &gw, dir.path(), 100, 2000);
    let (_, big) = api.tenant("big");
    let (_, small) = api.tenant("small");
    let noop = std::fs::read(nf("noop")).unwrap();
    for key in [&big, &small] {
        assert_eq!(api.upload(Some(key), "noop", "1", &noop).status, 201);
    }

    // One NF's config over 64 KiB: 413, nothing stored.
    let huge = "x".repeat(64 * 1024 + 1);
    let r = api.post(Some(&big), "/v1/deployments", &json!({ "name": "huge", "module": "noop@1", "config": huge }));
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.body["error"], "config_too_large", "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("65536"), "{}", r.body);
    assert_eq!(api.get(Some(&big), "/v1/deployments/huge").status, 404);

    // A chain over 512 KiB in all: 413.
    let config = "y".repeat(60 * 1024);
    let chain = |n: usize| {
        (0..n).map(|i| json!({ "name": format!("n{i}"), "module": "noop@1", "config": config })).collect::<Vec<_>>()
    };
    let r = api.post(Some(&big), "/v1/deployments", &json!({ "name": "long", "nfs": chain(9) }));
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.body["error"], "deployment_too_large", "{}", r.body);

    // Under the API's limits but over this server's max_payload: stored,
    // answered 500, and `failed` with the reason.
    let r = api.post(Some(&big), "/v1/deployments", &json!({ "name": "wide", "nfs": chain(5) }));
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(r.body["error"], "publish_failed", "{}", r.body);
    let d = api.get(Some(&big), "/v1/deployments/wide").body;
    assert_eq!(d["status"], "failed", "{d}");
    assert!(d["reason"].as_str().unwrap().contains("max_payload"), "{d}");

    // The group's other deployments, the same tenant's and another's,
    // are published and run.
    let r = api.post(Some(&small), "/v1/deployments", &json!({ "name": "fine", "module": "noop@1" }));
    assert_eq!(r.status, 201, "{}", r.body);
    api.wait_running(&small, "fine", 1);
    let r = api.post(Some(&big), "/v1/deployments", &json!({ "name": "ok", "module": "noop@1", "config": config }));
    assert_eq!(r.status, 201, "{}", r.body);
    api.wait_running(&big, "ok", 1);

    // Fixing the failed one (a shorter chain) publishes it.
    let r = api.put(Some(&big), "/v1/deployments/wide", &json!({ "nfs": chain(2) }));
    assert_eq!(r.status, 200, "{}", r.body);
    api.wait_running(&big, "wide", 2);
    assert_eq!(api.delete(Some(&big), "/v1/deployments/wide").status, 204);
    api.wait_running(&small, "fine", 1);
}

#[test]
fn concurrent_updates_lose_nothing_and_the_host_runs_the_revision_reported() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let _host = replaying_host(&nats, &gw, dir.path(), 100, 2000);
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "noop", "1", &std::fs::read(nf("noop")).unwrap()).status, 201);

    // Eight creates of one name at once: one 201, the others 409, no 500.
    let statuses = at_once(8, |i| {
        let body = json!({ "name": "c", "module": "noop@1", "config": format!("create {i}") });
        api.post(Some(&key), "/v1/deployments", &body).status
    });
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
    api.wait_running(&key, "c", 1);

    // Ten updates at once: each 200 or 409; every 200 is one revision.
    let statuses = at_once(10, |i| {
        let body = json!({ "module": "noop@1", "config": format!("update {i}") });
        api.put(Some(&key), "/v1/deployments/c", &body).status
    });
    assert!(statuses.iter().all(|s| *s == 200 || *s == 409), "{statuses:?}");
    let won = statuses.iter().filter(|s| **s == 200).count();
    assert!(won >= 1, "{statuses:?}");
    let d = api.get(Some(&key), "/v1/deployments/c");
    let revision = d.body["revision"].as_i64().unwrap();
    assert_eq!(revision, 1 + i64::try_from(won).unwrap(), "{statuses:?}");
    // `running` means the host reports the digest of exactly this revision.
    let running = api.wait_running(&key, "c", revision);
    assert_eq!(running["hosts"][0]["revision"], revision);
    assert_eq!(running["nfs"][0]["config"], d.body["nfs"][0]["config"]);

    // If-Match: a stale entity tag is refused with 412, the current one applies.
    let stale = format!("\"{}\"", revision - 1);
    let current = format!("\"{revision}\"");
    let body = json!({ "module": "noop@1", "config": "if-match" });
    let r = api.send("PUT", Some(&key), "/v1/deployments/c", &[("If-Match", &stale)], &body);
    assert_eq!(r.status, 412, "{}", r.body);
    assert_eq!(r.body["error"], "precondition_failed");
    let r = api.send("PUT", Some(&key), "/v1/deployments/c", &[("If-Match", &current)], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    api.wait_running(&key, "c", revision + 1);
    let r = api.send("DELETE", Some(&key), "/v1/deployments/c", &[("If-Match", &current)], &json!({}));
    assert_eq!(r.status, 412, "{}", r.body);
}

/// Peak resident memory of a process, bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn hostile_nfs_beside_a_tenant_leave_its_service_and_bill_exact_and_the_host_bounded() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let pcap = trace(dir.path(), 2000);
    let report = dir.path().join("h1.json");
    // A 1 MiB state budget per NF: flow state counts against it.
    let config = config_flags(dir.path(), "[nf.\"\"]\nstate-budget-mb = 1\n");
    let mut host = replaying_host_with(&nats, &gw, dir.path(), &pcap, 20000, &config);
    let (_, good) = api.tenant("good");
    let (_, evil) = api.tenant("evil");
    assert_eq!(api.upload(Some(&good), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&evil), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    let d = api.post(Some(&good), "/v1/deployments", &json!({ "name": "good", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);
    let good_id = d.body["id"].as_str().unwrap().to_string();
    api.wait_running(&good, "good", 1);

    // A pool over the contract's 16,777,216 resources is refused at
    // `declare` (the gateway's trial start says why, and stays up).
    let r = api.post(
        Some(&evil),
        "/v1/deployments",
        &json!({ "name": "huge", "module": "hostile@1", "config": "pool-huge" }),
    );
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("out of range"), "{}", r.body);
    // The others start: their harm is bounded while they run.
    let modes = ["pool", "big-event", "log-flood", "flow-flood", "panic"];
    for mode in modes {
        let r =
            api.post(Some(&evil), "/v1/deployments", &json!({ "name": mode, "module": "hostile@1", "config": mode }));
        assert_eq!(r.status, 201, "{mode}: {}", r.body);
    }
    for mode in modes {
        api.wait_running(&evil, mode, 1);
    }
    // Let them run, while the good tenant's service keeps answering.
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(8) {
        assert_eq!(api.get(None, "/healthz").status, 200);
        assert_eq!(api.get(Some(&good), "/v1/deployments/good").body["status"], "running");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }

    // Events: none over 4 KiB reached the tenant, and the dropped ones are counted.
    let events = api.get(Some(&evil), "/v1/events?deployment=big-event&limit=1000").body;
    let events = events.as_array().unwrap();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["fields"]["blob"].as_str().unwrap().len() <= 4096));
    // host-log lines are cut and rate-limited: the host's log stays small.
    let log = std::fs::read_to_string(dir.path().join("h1.log")).unwrap();
    assert!(log.len() < 4 << 20, "the host log grew to {} bytes", log.len());
    assert!(log.lines().filter(|l| l.contains("[cut]")).count() > 0);
    assert!(log.lines().all(|l| l.len() < 8192), "a log line over 8 KiB");
    // Memory: 5 instances of at most 64 MiB, 1 MiB of state each, plus
    // the host's own (runtime, buffers): well under 768 MiB. Unbounded,
    // the event and flow floods alone grew a host by gigabytes.
    let rss = peak_rss(host.child.id());
    assert!(rss < 768 << 20, "peak RSS {} MiB", rss >> 20);

    host.term();
    let r = host_report(&report);
    // Every hostile NF processed traffic (none stalled the host's others).
    for mode in modes {
        let id = api.get(Some(&evil), &format!("/v1/deployments/{mode}")).body["id"].as_str().unwrap().to_string();
        assert!(r["deployments"][&id]["packets_in"].as_u64().unwrap() > 0, "{mode}");
    }
    // Meter records name each trap's cause.
    let id = api.get(Some(&evil), "/v1/deployments/panic").body["id"].as_str().unwrap().to_string();
    let nfs = r["deployments"][&id]["nfs"].as_object().unwrap();
    let totals = nfs.values().next().unwrap();
    assert!(totals["traps"].as_u64().unwrap() > 0, "{totals}");
    assert_eq!(totals["trap_causes"]["panic"], totals["traps"], "{totals}");
    // ... and the gateway's usage keeps them per row.
    let traps = totals["traps"].clone();
    wait_for(60, "the trap causes in the usage", || {
        let u = api.get(Some(&evil), "/v1/usage").body;
        let row = u["rows"].as_array()?.iter().find(|r| r["deployment"] == id.as_str())?.clone();
        (row["traps"] == traps && row["trap_causes"]["panic"] == traps).then_some(())
    });
    // The good tenant's bill is exactly what the host processed for it.
    let mine = &r["deployments"][&good_id]["nfs"];
    let expected = report_totals(&[json!({ "deployments": { "good": { "nfs": mine } } })]);
    wait_for(60, "the good tenant's usage to equal the host report", || {
        let u = api.get(Some(&good), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(())
    });
    // Flow state: the flood asked for 4 KiB for each of the trace's
    // thousands of flows (megabytes); the host held it at the 1 MiB budget
    // and refused the rest.
    let flood = api.get(Some(&evil), "/v1/deployments/flow-flood").body["id"].as_str().unwrap().to_string();
    let held = wait_for(60, "the flood's state in the usage", || {
        let u = api.get(Some(&evil), "/v1/usage").body;
        let row = u["rows"].as_array()?.iter().find(|r| r["deployment"] == flood.as_str())?.clone();
        row["state_bytes"].as_u64().filter(|&b| b > 0)
    });
    assert!(held <= 1 << 20, "the flood holds {held} bytes of state, over its 1 MiB budget");
    assert!(held > 1 << 19, "the flood holds {held} bytes: it never reached its budget, the test did not flood");
}

#[test]
fn the_gateway_sheds_slow_clients_sends_safe_headers_and_keeps_shared_blobs() {
    let _turn = beside_others();
    use std::io::{Read, Write};
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();

    // Slowloris: connections that never finish their headers are closed
    // (10 s), while others are served.
    let mut slow: Vec<std::net::TcpStream> = (0..8)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
            s
        })
        .collect();
    assert_eq!(api.get(None, "/healthz").status, 200);
    let started = std::time::Instant::now();
    for s in &mut slow {
        let mut buf = [0u8; 64];
        // Closed (0 bytes or a reset), not answered and not left open.
        let n = s.read(&mut buf).unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text:?}");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(25), "slow clients held for {:?}", started.elapsed());

    // The dashboard and the API say how browsers may use them.
    let page = ureq::get(format!("{}/dashboard", gw.url)).call().unwrap();
    let h = page.headers();
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["x-frame-options"], "DENY");
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("script-src 'sha256-"), "{csp}");

    // Memory no host can give is refused, naming the limit.
    let (_, a) = api.tenant("a");
    let (_, b) = api.tenant("b");
    let noop = std::fs::read(nf("noop")).unwrap();
    assert_eq!(api.upload(Some(&a), "noop", "1", &noop).status, 201);
    let r = api.post(
        Some(&a),
        "/v1/deployments",
        &json!({ "name": "big", "nfs": [{ "module": "noop@1", "limits": { "memory_mb": 1024 } }] }),
    );
    assert_eq!((r.status, r.body["error"].as_str()), (422, Some("invalid_limit")), "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("memory_mb must be 1-256"), "{}", r.body);

    // Two tenants share a blob (same bytes): one deleting its module while
    // the other uploads and deploys never takes the other's bytes away.
    for round in 0..15 {
        let version = format!("{round}");
        std::thread::scope(|s| {
            s.spawn(|| {
                let _ = api.delete(Some(&a), "/v1/modules/noop@1");
                assert_eq!(api.upload(Some(&a), "noop", "1", &noop).status, 201);
            });
            s.spawn(|| {
                assert_eq!(api.upload(Some(&b), "noop", &version, &noop).status, 201);
            });
        });
        let name = format!("d{round}");
        let r = api.post(Some(&b), "/v1/deployments", &json!({ "name": name, "module": format!("noop@{version}") }));
        assert_eq!(r.status, 201, "round {round}: {}", r.body);
    }
}

#[test]
fn quotas_answer_409_or_429_and_bound_what_one_tenant_holds() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        "[quotas]\ndeployments = 3\nnfs-per-group = 4\nmodules = 3\nmodule-mb = 64\nuploads-in-flight = 1\ncompiles = 1\n",
    )
    .unwrap();
    let gw = Gateway::start(&nats, dir.path(), &[("SLUICE_GATEWAY_CONFIG", config.to_str().unwrap())]);
    let api = gw.api();
    let (_, a) = api.tenant("a");
    let (_, b) = api.tenant("b");
    let noop = std::fs::read(nf("noop")).unwrap();

    // Module versions: the fourth is over the quota; another tenant is not.
    for v in ["1", "2", "3"] {
        assert_eq!(api.upload(Some(&a), "noop", v, &noop).status, 201);
    }
    let r = api.upload(Some(&a), "noop", "4", &noop);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["error"], "quota_exceeded");
    assert!(r.body["message"].as_str().unwrap().contains("quotas.modules"), "{}", r.body);
    assert_eq!(api.upload(Some(&b), "noop", "1", &noop).status, 201);

    // NF instances per group: a chain of 3 and one of 2 exceed 4.
    let chain = |n: usize| (0..n).map(|i| json!({ "name": format!("n{i}"), "module": "noop@1" })).collect::<Vec<_>>();
    assert_eq!(api.post(Some(&a), "/v1/deployments", &json!({ "name": "c3", "nfs": chain(3) })).status, 201);
    let r = api.post(Some(&a), "/v1/deployments", &json!({ "name": "c2", "nfs": chain(2) }));
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("quotas.nfs-per-group"), "{}", r.body);
    // An update is counted without the deployment's own NFs.
    assert_eq!(api.put(Some(&a), "/v1/deployments/c3", &json!({ "nfs": chain(4) })).status, 200);
    assert_eq!(api.put(Some(&a), "/v1/deployments/c3", &json!({ "nfs": chain(2) })).status, 200);
    // Deployments: the fourth is over the quota.
    for name in ["d1", "d2"] {
        assert_eq!(api.post(Some(&a), "/v1/deployments", &json!({ "name": name, "module": "noop@1" })).status, 201);
    }
    let r = api.post(Some(&a), "/v1/deployments", &json!({ "name": "d3", "module": "noop@1" }));
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("quotas.deployments"), "{}", r.body);
    // The other tenant is not affected.
    assert_eq!(api.post(Some(&b), "/v1/deployments", &json!({ "name": "x", "nfs": chain(4) })).status, 201);

    // Uploads in flight: with one allowed, an upload whose body is still
    // coming holds the tenant's turn (taken before the body is read), so
    // another upload of the tenant gets 429 at once, not queued; another
    // tenant is not held (its upload goes on to its own quota check); once
    // the slow one is done, the next upload gets the turn.
    use std::io::{Read, Write};
    let addr = api.base.trim_start_matches("http://").to_string();
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        slow,
        "POST /v1/modules?name=noop&version=slow HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {b}\r\n\
         Content-Type: application/wasm\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        noop.len()
    )
    .unwrap();
    slow.write_all(&noop[..1024]).unwrap();
    slow.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for i in 0..3 {
        let r = api.upload(Some(&b), "noop", &format!("p{i}"), &noop);
        assert_eq!(r.status, 429, "{}", r.body);
        assert_eq!(r.body["error"], "too_many_uploads", "{}", r.body);
    }
    let r = api.upload(Some(&a), "noop", "9", &noop);
    assert_eq!(
        (r.status, &r.body["error"]),
        (409, &json!("quota_exceeded")),
        "the other tenant is not held: {}",
        r.body
    );
    slow.write_all(&noop[1024..]).unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert_eq!(api.upload(Some(&b), "noop", "after", &noop).status, 201);
}

#[test]
fn one_tenants_many_deployments_leave_room_for_the_next_tenant() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let _host = replaying_host(&nats, &gw, dir.path(), 50, 500);
    let (_, a) = api.tenant("a");
    let (_, b) = api.tenant("b");
    let noop = std::fs::read(nf("noop")).unwrap();
    assert_eq!(api.upload(Some(&a), "noop", "1", &noop).status, 201);
    assert_eq!(api.upload(Some(&b), "noop", "1", &noop).status, 201);
    // 40 deployments (more than the 32 instances a host once held) ...
    for i in 0..40 {
        let r = api.post(Some(&a), "/v1/deployments", &json!({ "name": format!("d{i}"), "module": "noop@1" }));
        assert_eq!(r.status, 201, "{}", r.body);
    }
    for i in 0..40 {
        api.wait_running(&a, &format!("d{i}"), 1);
    }
    // ... and the next tenant's still starts.
    assert_eq!(api.post(Some(&b), "/v1/deployments", &json!({ "name": "mine", "module": "noop@1" })).status, 201);
    api.wait_running(&b, "mine", 1);
}

/// The first core this process may run on (`Cpus_allowed_list`).
fn first_core() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    list.split([',', '-']).next().unwrap().to_string()
}

/// Packets deployment `id` has taken in, with the moment the host's report
/// (rewritten every second) last changed them.
fn sample(report: &std::path::Path, id: &str) -> (std::time::Instant, u64) {
    let read = || {
        std::fs::read(report)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|r| r["deployments"][id]["packets_in"].as_u64())
    };
    let before = read();
    wait_for(30, "the host report to move on", || {
        std::thread::sleep(std::time::Duration::from_millis(10));
        read().filter(|n| Some(*n) != before).map(|n| (std::time::Instant::now(), n))
    })
}

/// Packets per second of deployment `id` over about `secs` seconds.
fn rate(report: &std::path::Path, id: &str, secs: u64) -> f64 {
    let (t0, n0) = sample(report, id);
    std::thread::sleep(std::time::Duration::from_secs(secs));
    let (t1, n1) = sample(report, id);
    (n1 - n0) as f64 / t1.duration_since(t0).as_secs_f64()
}

/// The best of `windows` rates of `secs` seconds each: a window in which
/// the machine ran something else of its own (a 2-core CI runner does)
/// tells nothing about how the host shares its core, while one window at
/// the full rate shows the share is there to take.
fn best_rate(report: &std::path::Path, id: &str, windows: usize, secs: u64) -> f64 {
    (0..windows).map(|_| rate(report, id, secs)).fold(0.0, f64::max)
}

/// Twelve spinning NFs of one tenant on the core a neighbour's deployment
/// runs on: the OS shares a core per thread, which would leave the
/// neighbour, which needs a quarter of the core, a thirteenth of it (0.31
/// of its rate); the host shares it per tenant, so the neighbour keeps its
/// throughput. The bound (0.6) sits between the two, far enough from both
/// that a 2-core CI runner whose core is busy with other work some seconds
/// (which the per-tenant share does not make up for) still tells them
/// apart.
#[test]
fn spinning_nfs_of_one_tenant_leave_a_neighbour_on_their_core_its_throughput() {
    const SPINNERS: usize = 12;
    let _turn = measuring_alone();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let pcap = trace(dir.path(), 500);
    let report = dir.path().join("h1.json");
    let core = first_core();
    let host = |pps: u32| replaying_host_with(&nats, &gw, dir.path(), &pcap, pps, &["--cores".into(), core.clone()]);
    let (_, good) = api.tenant("good");
    let (_, evil) = api.tenant("evil");
    assert_eq!(api.upload(Some(&good), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&evil), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    let d = api.post(Some(&good), "/v1/deployments", &json!({ "name": "good", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);
    let id = d.body["id"].as_str().unwrap().to_string();

    // What the neighbour's deployment processes alone on the core, unpaced.
    let mut h = host(0);
    api.wait_running(&good, "good", 1);
    let capacity = rate(&report, &id, 3);
    h.term();
    // Paced at a quarter of that: it needs a quarter of the core, and its
    // share beside one other tenant is half of it, a margin wide enough
    // for a CI runner whose core is slower some seconds than others.
    let pps = (capacity / 4.0) as u32;
    let mut h = host(pps);
    api.wait_running(&good, "good", 1);
    let alone = best_rate(&report, &id, 3, 3);
    // Twelve spinning NFs of another tenant join it on the core.
    for i in 0..SPINNERS {
        let name = format!("spin{i}");
        let r =
            api.post(Some(&evil), "/v1/deployments", &json!({ "name": name, "module": "hostile@1", "config": "loop" }));
        assert_eq!(r.status, 201, "{}", r.body);
    }
    for i in 0..SPINNERS {
        api.wait_running(&evil, &format!("spin{i}"), 1);
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let with = best_rate(&report, &id, 3, 3);
    h.term();
    eprintln!(
        "capacity {capacity:.0} pps, paced at {pps}: alone {alone:.0} pps, beside {SPINNERS} spinning NFs {with:.0} pps"
    );
    assert!(with >= 0.6 * alone, "the neighbour fell from {alone:.0} to {with:.0} packets/s");
    // The spinners kept running (and trapping), paused for their share.
    let r = host_report(&report);
    let spinners: Vec<&serde_json::Value> = r["deployments"]
        .as_object()
        .unwrap()
        .values()
        .filter(|d| d["tenant"] != r["deployments"][&id]["tenant"])
        .collect();
    assert_eq!(spinners.len(), SPINNERS);
    assert!(spinners.iter().all(|d| d["packets_in"].as_u64().unwrap() > 0));
    assert!(spinners.iter().map(|d| d["paused_ms"].as_u64().unwrap()).sum::<u64>() > 0);
    assert!(spinners.iter().all(|d| d["cores"] == core.as_str()), "{r}");
}

/// A `serve` host's `[nf.<name>]` sections cap the NFs of that name in
/// every deployment, whatever the deployment asks; NFs of other names run
/// with `[nf.""]`.
#[test]
fn host_sections_cap_the_nfs_of_their_name() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    // 1 MiB for NFs named `counter`: less than the module's own minimum.
    let config = config_flags(dir.path(), "[nf.counter]\nmemory-mb = 1\n");
    let mut host = replaying_host_with(&nats, &gw, dir.path(), &trace(dir.path(), 50), 1000, &config);
    let (_, key) = api.tenant("t");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    // The NF is named after its module, and asks for 64 MiB.
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "a", "module": "counter@1", "limits": { "memory_mb": 64 } }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "b", "nfs": [{ "name": "free", "module": "counter@1" }] }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    api.wait_running(&key, "b", 1);
    let d = wait_for(30, "the capped NF to fail on the host", || {
        let d = api.get(Some(&key), "/v1/deployments/a").body;
        (d["status"] == "failed").then_some(d)
    });
    let reason = d["reason"].as_str().unwrap();
    assert!(reason.contains("memory"), "{reason}");
    host.term();
}

/// Every per-NF limit a host has can be asked for through the API (and
/// `sluice deploy`), reaches the deployment's spec, and is bounded: an
/// out-of-range value is a 422 naming the NF and the field.
#[test]
fn every_nf_limit_goes_through_the_api_and_the_cli_within_bounds() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let (_, key) = api.tenant("t");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let limits = json!({
        "failure_policy": "fail-open", "deadline_ms": 20, "memory_mb": 32, "start_deadline_ms": 2500,
        "fuel": 0, "max_flows": 1000, "max_flow_state_bytes": 128, "state_budget_mb": 8, "log_lines_per_second": 5
    });
    let r = api.post(Some(&key), "/v1/deployments", &json!({ "name": "a", "module": "counter@1", "limits": limits }));
    assert_eq!(r.status, 201, "{}", r.body);
    let d = api.get(Some(&key), "/v1/deployments/a").body;
    for (k, v) in limits.as_object().unwrap() {
        assert_eq!(&d["nfs"][0]["limits"][k], v, "{k}: {d}");
    }
    for (field, bad) in [
        ("failure_policy", json!("fail-sometimes")),
        ("deadline_ms", json!(0)),
        ("deadline_ms", json!(1001)),
        ("memory_mb", json!(0)),
        ("memory_mb", json!(257)),
        ("start_deadline_ms", json!(0)),
        ("start_deadline_ms", json!(30_001)),
        ("fuel", json!(1_000_000_000_001u64)),
        ("max_flows", json!(0)),
        ("max_flows", json!(16_777_217)),
        ("max_flow_state_bytes", json!(0)),
        ("max_flow_state_bytes", json!(65_537)),
        ("state_budget_mb", json!(0)),
        ("state_budget_mb", json!(1025)),
        ("log_lines_per_second", json!(10_001)),
    ] {
        let r = api.post(
            Some(&key),
            "/v1/deployments",
            &json!({ "name": "b", "module": "counter@1", "limits": { field: bad } }),
        );
        assert_eq!((r.status, r.body["error"].as_str()), (422, Some("invalid_limit")), "{field}={bad}: {}", r.body);
        let message = r.body["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("NF 'counter': {field}")), "{field}={bad}: {message}");
    }
    // An update is checked the same way, and the deployment keeps its
    // limits.
    let r = api.put(Some(&key), "/v1/deployments/a", &json!({ "module": "counter@1", "limits": { "max_flows": 0 } }));
    assert_eq!((r.status, r.body["error"].as_str()), (422, Some("invalid_limit")), "{}", r.body);
    assert_eq!(api.get(Some(&key), "/v1/deployments/a").body["nfs"][0]["limits"], limits);
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "b", "module": "counter@1", "limits": { "stack_mb": 1 } }),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("unknown field `stack_mb`"), "{}", r.body);
    // An `init` that never returns is stopped by the start deadline at the
    // gateway's trial start, and the error names the limit to raise.
    assert_eq!(api.upload(Some(&key), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "slow", "module": "hostile@1", "config": "init-loop", "limits": { "start_deadline_ms": 100 } }),
    );
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.to_string().contains("exceeded the start deadline of 100 ms"), "{}", r.body);
    // The CLI sends the same limits for every NF of the deployment.
    let out = std::process::Command::new(sibling_bin("sluice"))
        .args([
            "deploy",
            "c",
            "-m",
            "counter@1",
            "--start-deadline-ms",
            "2000",
            "--state-budget-mb",
            "8",
            "--wait",
            "0",
        ])
        .args(["--failure-policy", "fail-open", "--fuel", "0", "--max-flows", "10", "--deadline-ms", "25"])
        .args(["--memory-mb", "16", "--max-flow-state-bytes", "512", "--log-lines-per-second", "7"])
        .env("SLUICE_URL", &api.base)
        .env("SLUICE_API_KEY", &key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let d = api.get(Some(&key), "/v1/deployments/c").body;
    assert_eq!(
        d["nfs"][0]["limits"],
        json!({
            "failure_policy": "fail-open", "deadline_ms": 25, "memory_mb": 16, "start_deadline_ms": 2000,
            "fuel": 0, "max_flows": 10, "max_flow_state_bytes": 512, "state_budget_mb": 8, "log_lines_per_second": 7
        }),
        "{d}"
    );
    // Out of range is refused before anything is sent (the gateway would
    // answer 404 for this module), naming the flag.
    for (flag, bad) in [
        ("--start-deadline-ms", "0"),
        ("--deadline-ms", "1001"),
        ("--fuel", "1000000000001"),
        ("--max-flows", "16777217"),
        ("--max-flow-state-bytes", "65537"),
        ("--log-lines-per-second", "10001"),
        ("--memory-mb", "0"),
        ("--state-budget-mb", "0"),
        ("--failure-policy", "fail-sometimes"),
    ] {
        let out = std::process::Command::new(sibling_bin("sluice"))
            .args(["deploy", "d", "-m", "missing@1", flag, bad])
            .env("SLUICE_URL", &api.base)
            .env("SLUICE_API_KEY", &key)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(flag) && !err.contains("404"), "{flag} {bad}: {err}");
    }
    // The state budget's bound is the gateway's: the CLI shows its answer.
    let out = std::process::Command::new(sibling_bin("sluice"))
        .args(["deploy", "d", "-m", "counter@1", "--state-budget-mb", "4096"])
        .env("SLUICE_URL", &api.base)
        .env("SLUICE_API_KEY", &key)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("state_budget_mb must be 1-1024"), "{err}");
}

/// A host whose runtime's pool slot is 128 MiB: the gateway learns the
/// slot from its heartbeats and answers an NF that asks for more with 422
/// naming the host, instead of a 201 and a deployment that fails there.
#[test]
fn a_deployment_asking_more_memory_than_its_groups_hosts_have_is_refused() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let extra = config_flags(dir.path(), "max_memory_mb = 128\n");
    let _host = replaying_host_with(&nats, &gw, dir.path(), &trace(dir.path(), 5), 100, &extra);
    wait_for(30, "the host's heartbeat with its memory slot", || {
        let hosts = api.get(Some(ADMIN), "/v1/hosts").body;
        hosts
            .as_array()?
            .iter()
            .any(|h| h["host"] == "h1" && h["alive"] == true && h["memory_slot_mb"] == 128)
            .then_some(())
    });
    let (_, a) = api.tenant("a");
    assert_eq!(api.upload(Some(&a), "noop", "1", &std::fs::read(nf("noop")).unwrap()).status, 201);
    let ask = |mb: u64| json!({ "name": format!("m{mb}"), "module": "noop@1", "limits": { "memory_mb": mb } });
    let r = api.post(Some(&a), "/v1/deployments", &ask(200));
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["error"], "invalid_limit", "{}", r.body);
    let message = r.body["message"].as_str().unwrap();
    assert!(message.contains("1-128") && message.contains("host 'h1' has 128 MiB"), "{message}");
    let r = api.post(Some(&a), "/v1/deployments", &ask(100));
    assert_eq!(r.status, 201, "{}", r.body);
    api.wait_running(&a, "m100", 1);
}
