//! The embedded default end to end: `sluice dev` (gateway + host + in-process
//! bus + SQLite), driven by the `sluice` CLI as a tenant would, then the
//! dashboard in real headless Chromium, whose charts must show the numbers
//! the API returns.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// The admin token `sluice dev` generated.
static DEV_ADMIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn sluice(url: &str, key: Option<&str>, args: &[&str]) -> String {
    let mut c = Command::new(sibling_bin("sluice"));
    let admin = DEV_ADMIN.get().map(String::as_str).unwrap_or(ADMIN);
    c.args(args).env("SLUICE_URL", url).env("SLUICE_ADMIN_TOKEN", admin).env_remove("SLUICE_API_KEY");
    if let Some(k) = key {
        c.env("SLUICE_API_KEY", k);
    }
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "sluice {args:?} failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn dev_mode_cli_flow_and_the_dashboard_in_chromium() {
    let _turn = beside_others();
    let dir = test_dir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let data = dir.path().join("dev");
    let log = std::fs::File::create(dir.path().join("dev.log")).unwrap();
    // A plan without allowances, so that a small trace costs something.
    let plan = dir.path().join("gateway.toml");
    std::fs::write(
        &plan,
        "[billing]\nper-million-packets = 100.0\nper-gb = 50.0\n[billing.included]\npackets = 0\ngb = 0.0\ncpu-seconds = 0.0\ninvocations = 0\n",
    )
    .unwrap();
    let child = Command::new(sibling_bin("sluice"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--window-ms", "200"])
        .arg("--data")
        .arg(&data)
        .arg("--config")
        .arg(&plan)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let mut dev = Proc { child, name: "sluice dev".into() };
    wait_for(60, "sluice dev to answer", || ureq::get(format!("{url}/healthz")).call().ok());
    // It generated an admin token, readable by its owner only.
    use std::os::unix::fs::PermissionsExt;
    let token_file = data.join("admin-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "admin-token has mode {mode:o}");
    DEV_ADMIN.set(std::fs::read_to_string(&token_file).unwrap().trim().to_string()).unwrap();

    // The tenant flow through the CLI.
    let first = sluice(&url, None, &["tenant", "create", "acme", "--key-only"]).trim().to_string();
    assert!(first.starts_with("sk_"), "{first}");
    // The operator's view: the dev host is registered and alive.
    let hosts = wait_for(10, "the dev host to heartbeat", || {
        let h = sluice(&url, None, &["host", "list"]);
        h.lines().any(|l| l.starts_with("dev ") && l.contains(" yes ")).then_some(h)
    });
    assert!(hosts.contains("default"), "{hosts}");
    // Key rotation through the CLI: the new key works, the first is refused.
    let rotated = sluice(&url, Some(&first), &["key", "rotate"]);
    let key =
        rotated.lines().find_map(|l| l.split_whitespace().last().filter(|w| w.starts_with("sk_"))).unwrap().to_string();
    let keys = sluice(&url, Some(&key), &["key", "list"]);
    assert_eq!(keys.lines().count(), 2, "{keys}");
    assert!(keys.lines().nth(1).unwrap().trim_end().ends_with('*'), "{keys}");
    let me = ureq::get(format!("{url}/v1/me")).header("Authorization", format!("Bearer {first}")).call();
    assert!(matches!(me, Err(ureq::Error::StatusCode(401))), "{me:?}");
    let k = Some(key.as_str());
    let fw = nf("firewall");
    let out = sluice(&url, k, &["nf", "upload", fw.to_str().unwrap(), "--version", "1.0.0"]);
    assert!(out.contains("uploaded firewall@1.0.0"), "{out}");
    let cfg = dir.path().join("fw.json");
    std::fs::write(
        &cfg,
        r#"{"default":"allow","log-denied":true,"rules":[{"action":"deny","proto":"tcp","dst-ports":"23"}]}"#,
    )
    .unwrap();
    let out = sluice(&url, k, &["deploy", "edge", "-m", "firewall@1.0.0", "--config-file", cfg.to_str().unwrap()]);
    assert!(out.contains("edge") && out.contains("running"), "{out}");

    // Traffic: a capture renamed into the spool.
    let pcap = trace(dir.path(), 500);
    let packets = sluice_pcap_count(&pcap);
    let spool = data.join("spool");
    std::fs::copy(&pcap, spool.join(".incoming")).unwrap();
    std::fs::rename(spool.join(".incoming"), spool.join("office.pcap")).unwrap();
    let api = Api { base: url.clone() };
    let usage = wait_for(30, "the trace to be metered", || {
        let u = api.get(k, "/v1/usage").body;
        (u["total"]["packets"].as_u64() == Some(packets)).then_some(u)
    });
    assert!(spool.join("done/office.pcap").exists());
    let out = sluice(&url, k, &["usage"]);
    assert!(out.contains(&packets.to_string()), "{out}");

    // The dashboard, in Chromium.
    let node_dir = workspace().join("tests/dashboard");
    assert!(
        node_dir.join("node_modules/playwright-core").exists(),
        "playwright-core is missing: run `make setup` (npm install in tests/dashboard)"
    );
    // Opened from a `sluice dashboard` link: signed in, no key in any URL.
    let link = sluice(&url, k, &["dashboard"]).trim().to_string();
    assert!(link.starts_with(&format!("{url}/dashboard#sign-in=")) && !link.contains(&key), "{link}");
    let out = Command::new("node").arg(node_dir.join("check.mjs")).args([&url, &link]).output().unwrap();
    assert!(
        out.status.success(),
        "dashboard check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["page_errors"], Value::Array(vec![]), "{shown}");
    assert_eq!(shown["address"], format!("{url}/dashboard"), "the used ticket left the address bar");
    assert_eq!(shown["signed_in_with"], "ds_", "a read-only session, not the key");
    // The link worked once; its session reads but changes nothing.
    let ticket = link.split("#sign-in=").nth(1).unwrap();
    let again = api.post(None, "/v1/dashboard/session", &serde_json::json!({ "ticket": ticket }));
    assert_eq!(again.status, 401, "{}", again.body);
    let fresh = sluice(&url, k, &["dashboard", "-o", "json"]);
    let fresh: Value = serde_json::from_str(&fresh).unwrap();
    let ticket = fresh["url"].as_str().unwrap().split("#sign-in=").nth(1).unwrap().to_string();
    let session = api.post(None, "/v1/dashboard/session", &serde_json::json!({ "ticket": ticket }));
    assert_eq!(session.status, 200, "{}", session.body);
    let token = session.body["token"].as_str().unwrap().to_string();
    assert_eq!(api.get(Some(&token), "/v1/me").body["name"], "acme");
    let write = api.post(Some(&token), "/v1/me/keys", &serde_json::json!({}));
    assert_eq!((write.status, write.body["error"].as_str()), (403, Some("forbidden")), "{}", write.body);
    assert_eq!(api.get(Some("ds_not-a-session"), "/v1/me").status, 401);
    assert_eq!(shown["foreign_requests"], Value::Array(vec![]), "the page fetched something from elsewhere: {shown}");

    let total = &usage["total"];
    for m in ["packets", "bytes", "cpu_ns", "invocations", "state_byte_ms", "state_bytes"] {
        assert_eq!(shown["tiles"][m], total[m], "tile {m}");
    }
    // What became of the packets, per row and in total: the firewall
    // forwarded some and dropped the telnet connections, and every packet
    // is one of forwarded, dropped or policy.
    for m in ["forwarded", "dropped", "rewritten", "policy"] {
        assert_eq!(shown["outcomes"][m], total[m], "usage table column {m}");
    }
    assert_eq!(shown["outcomes"]["offloaded"], total["offloaded_packets"], "usage table column offloaded");
    for r in usage["rows"].as_array().unwrap().iter().chain([total]) {
        let n = |m: &str| r[m].as_u64().unwrap();
        assert_eq!(n("forwarded") + n("dropped") + n("policy"), n("packets"), "{r}");
    }
    assert!(total["dropped"].as_u64().unwrap() > 0 && total["forwarded"].as_u64().unwrap() > 0, "{total}");
    let mut by_nf: BTreeMap<String, BTreeMap<&str, u64>> = BTreeMap::new();
    for r in usage["rows"].as_array().unwrap() {
        let e = by_nf.entry(format!("{}@{}", r["nf"].as_str().unwrap(), r["version"].as_str().unwrap())).or_default();
        for m in ["packets", "bytes", "cpu_ns"] {
            *e.entry(m).or_default() += r[m].as_u64().unwrap();
        }
    }
    for m in ["packets", "bytes", "cpu_ns"] {
        let expected: BTreeMap<String, u64> = by_nf.iter().map(|(k, v)| (k.clone(), v[m])).collect();
        let bars: BTreeMap<String, u64> = serde_json::from_value(shown["charts"][m]["bars"].clone()).unwrap();
        let legend: BTreeMap<String, u64> = serde_json::from_value(shown["charts"][m]["legend"].clone()).unwrap();
        assert_eq!(bars, expected, "{m} chart bars");
        assert_eq!(legend, expected, "{m} chart legend");
    }
    assert_eq!(shown["modules"], serde_json::json!(["firewall"]));
    // The events table shows the newest 20 events, as the API lists them.
    let events = api.get(k, "/v1/events?limit=20").body;
    let kinds: Vec<&str> = events.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(!kinds.is_empty(), "the firewall logs denied telnet connections");
    assert_eq!(shown["events"], serde_json::json!(kinds));
    // The logs table shows the newest 20 NF log lines and traps.
    let logs = api.get(k, "/v1/logs?limit=20").body;
    assert_eq!(shown["logs"].as_array().unwrap().len(), logs["lines"].as_array().unwrap().len(), "{shown}");
    let out = sluice(&url, k, &["events", "--kind", "firewall.deny", "--limit", "3"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.lines().all(|l| l.contains("firewall.deny") && l.contains("rule=1")), "{out}");
    // Events name their deployment and carry both clocks; `since` filters.
    assert!(out.lines().all(|l| l.contains("edge/")), "{out}");
    let e = &events[0];
    assert_eq!(e["deployment_name"], "edge", "{e}");
    assert!(e["time"].as_str().unwrap().contains('T') && e["packet_time"].as_str().unwrap().contains('T'), "{e}");
    let later = api.get(k, "/v1/events?since=2100-01-01T00:00:00Z").body;
    assert_eq!(later, serde_json::json!([]));
    // Events page like every list: newest first, the next (older) page in
    // the Link header with the same filters, the pages together the list.
    let whole = api.get(k, "/v1/events?kind=firewall.deny&limit=5").body;
    let mut paged = Vec::new();
    let mut next = Some("/v1/events?kind=firewall.deny&limit=2".to_string());
    while let Some(path) = next.take() {
        let r = api.get(k, &path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        paged.extend(r.body.as_array().unwrap().iter().cloned());
        next = r.next.filter(|_| paged.len() < 5);
    }
    paged.truncate(5);
    assert_eq!(Value::Array(paged), whole);
    assert!(whole.as_array().unwrap().iter().all(|e| e["kind"] == "firewall.deny"), "{whole}");
    assert_eq!(api.get(k, "/v1/events?after=not-a-cursor").status, 400);
    assert_eq!(shown["deployments"], serde_json::json!([{ "name": "edge", "status": "running" }]));

    // The downloaded bill is the API's CSV bill of the month on screen.
    let month =
        shown["csv_name"].as_str().unwrap().trim_start_matches("sluice-bill-").trim_end_matches(".csv").to_string();
    let api_csv = api.get(k, &format!("/v1/bill?period={month}&format=csv")).body;
    assert_eq!(shown["csv"].as_str().unwrap(), api_csv.as_str().unwrap());
    let bill = api.get(k, &format!("/v1/bill?period={month}")).body;
    assert_eq!(shown["bill_total"].as_str(), bill["total"].as_str());
    // Money is integer minor units and the same as a decimal string.
    let minor = bill["total_minor"].as_i64().unwrap();
    assert!(minor > 0, "the plan has no allowances, so the bill is not zero: {bill}");
    assert_eq!(bill["total"].as_str().unwrap(), format!("{}.{:02}", minor / 100, minor % 100));
    let lines_minor: i64 = bill["lines"].as_array().unwrap().iter().map(|l| l["amount_minor"].as_i64().unwrap()).sum();
    assert_eq!(lines_minor, minor);
    let billed = (bill["lines"][0]["quantity"].as_f64().unwrap() * 1e6).round() as u64;
    assert_eq!(billed, packets);

    // The CLI bill agrees.
    let csv = sluice(&url, k, &["bill", "--period", &month, "--csv"]);
    assert_eq!(csv, api_csv.as_str().unwrap());
    assert!(csv.ends_with('\n'), "the CSV's last line has no end: {csv:?}");

    // Ctrl-C: the dev cluster stops cleanly and keeps its data.
    let _ = Command::new("kill").args(["-INT", &dev.child.id().to_string()]).status();
    let st = dev.child.wait().unwrap();
    assert!(st.success(), "sluice dev exited with {st}");
    assert!(data.join("gateway/gateway.db").exists());
}

fn sluice_pcap_count(p: &std::path::Path) -> u64 {
    // Every frame of the synthetic trace; the host counts what it reads.
    let bytes = std::fs::read(p).unwrap();
    let mut n = 0u64;
    let mut off = 24usize;
    while off + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        off += 16 + incl;
        n += 1;
    }
    n
}
