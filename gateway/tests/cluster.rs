//! The cluster flow with separate processes over a real nats-server:
//! upload → deploy → traffic → usage equals what the hosts report, hot
//! swaps, bad uploads, tenant isolation, and billing that survives kill -9
//! of the gateway and restarts of a host.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::json;

fn fw_config() -> serde_json::Value {
    json!({ "default": "allow", "log-denied": true, "rules": [{ "action": "deny", "proto": "tcp", "dst-ports": "23" }] })
}

#[test]
fn upload_deploy_traffic_usage_equals_the_host_report() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = Api { base: gw.url.clone() };
    let pcap = trace(dir.path(), 600);
    let report = dir.path().join("h1.json");
    let mut host = start_replay_host(
        &nats,
        &gw,
        dir.path(),
        "h1",
        Replay { pcap: &pcap, loops: 12, pps: 15000, window_ms: 200, report: &report },
    );
    let (_, key) = api.tenant("acme");
    let fw = std::fs::read(nf("firewall")).unwrap();
    let up = api.upload(Some(&key), "firewall", "1.0.0", &fw);
    assert_eq!(up.status, 201, "{}", up.body);
    assert_eq!(up.body["contract"], "0.6.0");
    let up = api.upload(Some(&key), "counter", "1.0.0", &std::fs::read(nf("counter")).unwrap());
    assert_eq!(up.status, 201, "{}", up.body);

    // A chain: firewall -> counter.
    let d = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "edge", "nfs": [
            { "module": "firewall@1.0.0", "config": fw_config() },
            { "module": "counter@1.0.0" } ] }),
    );
    assert_eq!(d.status, 201, "{}", d.body);
    assert_eq!(d.body["nfs"][0]["next"], "counter");
    let running = api.wait_running(&key, "edge", 1);
    assert_eq!(running["hosts"][0]["host"], "h1");

    // A module in use cannot be deleted.
    let del = api.delete(Some(&key), "/v1/modules/firewall@1.0.0");
    assert_eq!(del.status, 409, "{}", del.body);

    // Hot swap: the same firewall as version 2.0.0 with another config.
    assert_eq!(api.upload(Some(&key), "firewall", "2.0.0", &fw).status, 201);
    let up = api.put(
        Some(&key),
        "/v1/deployments/edge",
        &json!({ "nfs": [
            { "module": "firewall@2.0.0", "config": { "default": "allow" } },
            { "module": "counter@1.0.0" } ] }),
    );
    assert_eq!(up.status, 200, "{}", up.body);
    assert_eq!(up.body["revision"], 2);
    api.wait_running(&key, "edge", 2);
    // The host replays the capture 12 times; the swap happened in the
    // middle. Once it is done, stop it: it flushes its last window.
    wait_for(60, "the 12 passes", || (host_report(&report)["traces"].as_u64() == Some(12)).then_some(()));
    host.term();
    let trace_packets = read_count(&pcap);
    let rep = host_report(&report);
    let fw: u64 = ["firewall@1.0.0", "firewall@2.0.0"]
        .iter()
        .map(|k| {
            rep["deployments"].as_object().unwrap().values().next().unwrap()["nfs"][k]["packets"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(
        fw,
        12 * trace_packets,
        "{rep}: across the hot swap, every packet went through exactly one firewall version"
    );

    let expected = report_totals(&[host_report(&report)]);
    assert!(expected.contains_key("firewall@1.0.0") && expected.contains_key("firewall@2.0.0"), "{expected:?}");
    let usage = wait_for(30, "usage to equal the host report", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(u)
    });
    // The firewall's flow state was held and billed: the usage's state
    // byte-ms are the host's, exactly, and priced on the bill.
    assert!(expected["firewall@1.0.0"][5] > 0, "{expected:?}");
    // Every packet the firewall forwarded reached the counter.
    let rep = host_report(&report);
    let dep = rep["deployments"].as_object().unwrap().values().next().unwrap();
    assert!(dep["packets_in"].as_u64().unwrap() > 0);
    let total = &usage["total"];
    assert_eq!(
        total["packets"].as_u64().unwrap(),
        expected.values().map(|t| t[1]).sum::<u64>(),
        "total packets equal the sum of the host's per-NF packets"
    );

    // The firewall's deny events reached the tenant, tagged with the version
    // that emitted them; their exact count is in the usage.
    let events = api.get(Some(&key), "/v1/events?deployment=edge&kind=firewall.deny&limit=1000").body;
    let events = events.as_array().unwrap();
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|e| e["nf"] == "firewall" && e["host"] == "h1" && e["fields"]["rule"] == "1"),
        "{events:?}"
    );
    let emitted: u64 = usage["rows"].as_array().unwrap().iter().map(|r| r["events"].as_u64().unwrap()).sum();
    assert!(emitted >= events.len() as u64, "{emitted} emitted, {} listed", events.len());

    // The bill prices exactly this usage.
    let period = time_period();
    let bill = api.get(Some(&key), &format!("/v1/bill?period={period}")).body;
    assert_eq!(bill["lines"][0]["item"], "packets");
    let billed_packets = (bill["lines"][0]["quantity"].as_f64().unwrap() * 1e6).round() as u64;
    assert_eq!(billed_packets, total["packets"].as_u64().unwrap());
    let state = bill["lines"].as_array().unwrap().iter().find(|l| l["item"] == "state").unwrap();
    let gb_hours = total["state_byte_ms"].as_u64().unwrap() as f64 / 3.6e15;
    assert!(gb_hours > 0.0 && (state["quantity"].as_f64().unwrap() - gb_hours).abs() < 1e-12, "{bill}");
    // State held at the end is the host's latest record of the firewall,
    // which ran 2.0.0 then: none is left in the row of 1.0.0.
    let rows = usage["rows"].as_array().unwrap();
    let row = |version: &str| rows.iter().find(|r| r["nf"] == "firewall" && r["version"] == version).unwrap();
    assert_eq!(row("1.0.0")["state_bytes"], 0, "{usage}");
    let held: u64 = rows.iter().map(|r| r["state_bytes"].as_u64().unwrap()).sum();
    assert_eq!(total["state_bytes"].as_u64(), Some(held), "{usage}");
    for r in rows {
        let gb_hours = r["state_byte_ms"].as_u64().unwrap() as f64 / 3.6e15;
        assert!((r["state_gb_hours"].as_f64().unwrap() - gb_hours).abs() < 1e-12, "{r}");
    }
    let csv = api.get(Some(&key), &format!("/v1/bill?period={period}&format=csv")).body;
    let csv = csv.as_str().unwrap();
    assert!(csv.starts_with("tenant,period,item,unit,quantity"), "{csv}");
    // The header, a line per priced item (packets, data, CPU, invocations,
    // state, offloaded packets) and the total.
    assert_eq!(csv.lines().count(), 8, "{csv}");

    // Deleting the deployment frees the modules.
    assert_eq!(api.delete(Some(&key), "/v1/deployments/edge").status, 204);
    assert_eq!(api.delete(Some(&key), "/v1/modules/firewall@1.0.0").status, 204);
    assert_eq!(api.get(Some(&key), "/v1/modules/firewall@1.0.0").status, 404);
}

fn time_period() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let z = now.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}")
}

#[test]
fn bad_uploads_get_a_4xx_that_says_why() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[("SLUICE_MAX_MODULE_MB", "1")]);
    let api = Api { base: gw.url.clone() };
    let (_, key) = api.tenant("acme");
    let k = Some(key.as_str());

    let r = api.upload(k, "junk", "1", b"these are not the bytes you are looking for");
    assert_eq!((r.status, r.body["error"].as_str()), (400, Some("not_wasm")), "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("not a WebAssembly binary"));

    // The smallest valid core module: magic and version 1.
    let r = api.upload(k, "core", "1", b"\0asm\x01\0\0\0");
    assert_eq!((r.status, r.body["error"].as_str()), (422, Some("core_module")), "{}", r.body);
    assert!(r.body["message"].as_str().unwrap().contains("not a component"));

    let r = api.upload(k, "other", "1", &std::fs::read(test_nf("wrong-world")).unwrap());
    assert_eq!((r.status, r.body["error"].as_str()), (422, Some("wrong_world")), "{}", r.body);

    let mut broken = std::fs::read(nf("counter")).unwrap();
    broken.truncate(broken.len() / 2);
    let r = api.upload(k, "broken", "1", &broken);
    assert_eq!((r.status, r.body["error"].as_str()), (422, Some("invalid_component")), "{}", r.body);

    let r = api.upload(k, "big", "1", &vec![0u8; 2 << 20]);
    assert_eq!((r.status, r.body["error"].as_str()), (413, Some("too_large")), "{}", r.body);

    let counter = std::fs::read(nf("counter")).unwrap();
    let r = api.upload(k, "bad.name", "1", &counter);
    assert_eq!(r.status, 400, "{}", r.body);
    let r = api.upload(k, "counter", "1%200", &counter);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(api.upload(k, "counter", "1.0", &counter).status, 201);
    let r = api.upload(k, "counter", "1.0", &counter);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(api.upload(None, "counter", "2.0", &counter).status, 401);
    assert_eq!(api.upload(Some("sk_nope"), "counter", "2.0", &counter).status, 401);

    // Bad deployment requests.
    let bad = [
        (json!({ "name": "x" }), 400),
        (json!({ "name": "x", "module": "nope@1" }), 404),
        (json!({ "name": "x", "module": "counter@1.0", "group": "a.b" }), 400),
        (json!({ "name": "x", "module": "counter@1.0", "limits": { "failure_policy": "maybe" } }), 422),
        (json!({ "name": "x", "nfs": [{ "module": "counter@1.0", "next": "ghost" }] }), 400),
        (json!({ "name": "x", "nfs": [{ "module": "counter@1.0" }, { "module": "counter@1.0" }] }), 400),
        (json!({ "name": "x", "module": "counter@1.0", "surprise": 1 }), 400),
    ];
    for (body, status) in bad {
        let r = api.post(k, "/v1/deployments", &body);
        assert_eq!(r.status, status, "{body} -> {}", r.body);
        assert!(r.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", r.body);
    }
    // The firewall refuses a config it cannot parse: refused at deploy time.
    assert_eq!(api.upload(k, "firewall", "1", &std::fs::read(nf("firewall")).unwrap()).status, 201);
    let r = api.post(k, "/v1/deployments", &json!({ "name": "fw", "module": "firewall@1", "config": "{not json" }));
    assert_eq!((r.status, r.body["error"].as_str()), (422, Some("config_rejected")), "{}", r.body);
    let r = api.get(k, "/v1/usage?from=yesterday");
    assert_eq!(r.status, 400, "{}", r.body);
    let r = api.get(k, "/v1/bill?period=2026-13");
    assert_eq!(r.status, 400, "{}", r.body);
}

#[test]
fn tenants_see_and_change_only_their_own_objects() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = Api { base: gw.url.clone() };
    let pcap = trace(dir.path(), 200);
    let mut host = start_host(&nats, &gw, dir.path(), "h1", &["--in", pcap.to_str().unwrap(), "--window-ms", "100"]);
    let (a_id, a) = api.tenant("alpha");
    let (_, b) = api.tenant("beta");
    let (a, b) = (Some(a.as_str()), Some(b.as_str()));
    let up = api.upload(a, "counter", "1", &std::fs::read(nf("counter")).unwrap());
    let module_id = up.body["id"].as_str().unwrap().to_string();
    let d = api.post(a, "/v1/deployments", &json!({ "name": "mine", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);
    let dep_id = d.body["id"].as_str().unwrap().to_string();
    api.wait_running(a.unwrap(), "mine", 1);
    wait_for(30, "alpha's usage", || {
        let u = api.get(a, "/v1/usage").body;
        (u["total"]["packets"].as_u64().unwrap_or(0) > 0).then_some(())
    });

    // Beta gets 404 for every one of alpha's objects, by id or by name.
    for path in [
        format!("/v1/modules/{module_id}"),
        "/v1/modules/counter@1".to_string(),
        format!("/v1/deployments/{dep_id}"),
        "/v1/deployments/mine".to_string(),
        format!("/v1/events?deployment={dep_id}"),
    ] {
        assert_eq!(api.get(b, &path).status, 404, "GET {path}");
        if !path.starts_with("/v1/events") {
            assert_eq!(api.delete(b, &path).status, 404, "DELETE {path}");
        }
    }
    let r = api.put(b, &format!("/v1/deployments/{dep_id}"), &json!({ "module": module_id }));
    assert_eq!(r.status, 404, "{}", r.body);
    let r = api.post(b, "/v1/deployments", &json!({ "name": "steal", "module": module_id }));
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(api.get(b, "/v1/events").body, json!([]));
    for path in ["/v1/modules", "/v1/deployments"] {
        assert_eq!(api.get(b, path).body, json!([]), "{path}");
        assert_eq!(api.get(a, path).body.as_array().unwrap().len(), 1, "{path}");
    }
    let bu = api.get(b, "/v1/usage").body;
    assert_eq!(bu["rows"], json!([]));
    assert_eq!(bu["total"]["packets"], 0);
    let bb = api.get(b, "/v1/bill?period=2026-11").body;
    assert_eq!(bb["usage"], json!([]));
    assert_eq!(api.get(b, "/v1/usage/series?step_ms=1000").body["series"], json!([]));
    let me = api.get(b, "/v1/me").body;
    assert_eq!(me["name"], "beta");
    assert!(me["created_ms"].as_i64().unwrap() > 1_700_000_000_000, "{me}");

    // Operator endpoints need the admin token; tenant endpoints need a tenant key.
    for key in [a, b] {
        assert_eq!(api.get(key, "/v1/tenants").status, 403);
        assert_eq!(api.get(key, "/v1/hosts").status, 403);
        assert_eq!(api.post(key, "/v1/tenants", &json!({ "name": "x" })).status, 403);
        assert_eq!(api.post(key, &format!("/v1/tenants/{a_id}/keys"), &json!({})).status, 403);
    }
    for path in [
        "/v1/modules",
        "/v1/deployments",
        "/v1/events",
        "/v1/usage",
        "/v1/bill?period=2026-11",
        "/v1/me",
        "/v1/tenants",
    ] {
        assert_eq!(api.get(None, path).status, 401, "{path}");
        assert_eq!(api.get(Some("sk_0000"), path).status, if path == "/v1/tenants" { 403 } else { 401 }, "{path}");
    }
    assert_eq!(api.get(Some(ADMIN), "/v1/modules").status, 401, "the admin token is not a tenant key");
    assert_eq!(api.get(Some(ADMIN), "/v1/tenants").body.as_array().unwrap().len(), 2);
    let hosts = api.get(Some(ADMIN), "/v1/hosts").body;
    assert_eq!(hosts[0]["host"], "h1");
    assert_eq!(hosts[0]["alive"], true);
    // A second key for alpha works; the tenant name is unique.
    let k2 = api.post(Some(ADMIN), &format!("/v1/tenants/{a_id}/keys"), &json!({})).body;
    assert_eq!(api.get(k2["api_key"].as_str(), "/v1/modules").body.as_array().unwrap().len(), 1);
    assert_eq!(api.post(Some(ADMIN), "/v1/tenants", &json!({ "name": "alpha" })).status, 409);
    assert_eq!(api.post(Some(ADMIN), "/v1/tenants/t_nobody/keys", &json!({})).status, 404);
    host.term();
}

#[test]
fn killing_the_gateway_mid_stream_loses_and_double_counts_nothing() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let mut gw = Gateway::start(&nats, dir.path(), &[]);
    let api = Api { base: gw.url.clone() };
    let pcap = trace(dir.path(), 400);
    let report = dir.path().join("h1.json");
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.post(Some(&key), "/v1/deployments", &json!({ "name": "c", "module": "counter@1" })).status, 201);
    let mut host = start_replay_host(
        &nats,
        &gw,
        dir.path(),
        "h1",
        Replay { pcap: &pcap, loops: 0, pps: 30000, window_ms: 50, report: &report },
    );
    api.wait_running(&key, "c", 1);
    for round in 0..3 {
        wait_for(30, "meters to flow", || {
            let u = api.get(Some(&key), "/v1/usage").body;
            (u["total"]["records"].as_u64().unwrap_or(0) > 5 * (round + 1)).then_some(())
        });
        gw.kill9();
        // Meters keep flowing into the stream while the gateway is down.
        std::thread::sleep(std::time::Duration::from_millis(700));
        gw.restart();
    }
    host.term();
    let expected = report_totals(&[host_report(&report)]);
    let records: u64 = expected.values().map(|t| t[4]).sum();
    assert!(records > 20, "the host produced {records} records");
    wait_for(60, "usage to equal the host report", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(())
    });
}

#[test]
fn a_restarted_host_resumes_and_billing_stays_exact() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = Api { base: gw.url.clone() };
    let pcap = trace(dir.path(), 400);
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "firewall", "1", &std::fs::read(nf("firewall")).unwrap()).status, 201);
    let r = api.post(
        Some(&key),
        "/v1/deployments",
        &json!({ "name": "fw", "module": "firewall@1", "config": fw_config() }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let mut reports = Vec::new();
    for run in 0..2 {
        // The same host id and state directory: the host rejoins, reads the
        // desired state from the KV bucket and starts the deployment again.
        let report = dir.path().join(format!("h1-{run}.json"));
        let mut host = start_replay_host(
            &nats,
            &gw,
            dir.path(),
            "h1",
            Replay { pcap: &pcap, loops: 0, pps: 20000, window_ms: 100, report: &report },
        );
        api.wait_running(&key, "fw", 1);
        wait_for(30, "this run's meters", || {
            std::fs::read(&report)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .filter(|r| report_totals(std::slice::from_ref(r)).values().map(|t| t[4]).sum::<u64>() >= 5)
        });
        host.term();
        reports.push(host_report(&report));
    }
    assert_ne!(reports[0]["boot"], reports[1]["boot"]);
    let expected = report_totals(&reports);
    wait_for(30, "usage to equal both runs' reports", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(())
    });
    // Nothing is left unpublished in the outbox.
    let outbox = dir.path().join("state-h1/outbox");
    assert_eq!(std::fs::read_dir(outbox).unwrap().count(), 0);
}

#[test]
fn an_update_the_host_refuses_is_failed_with_the_reason_and_the_old_revision_runs_on() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = Api { base: gw.url.clone() };
    let mut host = start_host(&nats, &gw, dir.path(), "h1", &[]);
    let (_, key) = api.tenant("acme");
    let k = Some(key.as_str());
    assert_eq!(api.upload(k, "firewall", "1", &std::fs::read(nf("firewall")).unwrap()).status, 201);
    assert_eq!(api.upload(k, "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let r = api.post(
        k,
        "/v1/deployments",
        &json!({ "name": "guard", "nfs": [{ "name": "guard", "module": "firewall@1", "config": fw_config() }] }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    api.wait_running(&key, "guard", 1);
    // The counter keeps no flow state: swapping the stateful firewall for it
    // would drop its connections, so the host refuses and keeps revision 1.
    let r = api.put(k, "/v1/deployments/guard", &json!({ "nfs": [{ "name": "guard", "module": "counter@1" }] }));
    assert_eq!(r.status, 200, "{}", r.body);
    let d = wait_for(30, "the refusal", || {
        let d = api.get(k, "/v1/deployments/guard").body;
        (d["status"] == "failed").then_some(d)
    });
    let reason = d["reason"].as_str().unwrap();
    assert!(reason.starts_with("h1: ") && reason.contains("keeps no flow state"), "{reason}");
    assert!(reason.contains("revision 1 keeps running"), "{reason}");
    assert_eq!(d["hosts"][0]["revision"], 2);
    assert_eq!(d["hosts"][0]["state"], "failed");
    // Going back to a version the host accepts makes it run again.
    let r = api.put(
        k,
        "/v1/deployments/guard",
        &json!({ "nfs": [{ "name": "guard", "module": "firewall@1", "config": fw_config() }] }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    api.wait_running(&key, "guard", 3);
    host.term();
}

/// API conventions: every error is the JSON error body (unknown paths and
/// methods, query strings and path segments that do not parse); a 201
/// carries the new object's Location; applying the same deployment again
/// keeps its revision.
#[test]
fn errors_are_json_created_objects_say_where_and_a_no_op_update_keeps_the_revision() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let (_, key) = api.tenant("acme");
    let k = Some(key.as_str());
    for (method, path, status, code) in [
        ("GET", "/v1/nothing-here", 404, "no_route"),
        ("GET", "/nothing-here", 404, "no_route"),
        ("DELETE", "/v1/usage", 405, "method_not_allowed"),
        ("GET", "/v1/events?limit=lots", 400, "bad_request"),
        ("GET", "/v1/usage?from=yesterday", 400, "bad_request"),
        ("GET", "/v1/deployments/%FF%FE", 400, "bad_request"),
    ] {
        let r = api.send(method, k, path, &[], &serde_json::Value::Null);
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert_eq!(r.body["error"], code, "{method} {path}: {}", r.body);
        assert!(r.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{method} {path}: {}", r.body);
    }

    // Created objects say where they are.
    let wasm = std::fs::read(nf("counter")).unwrap();
    let up = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
        .post(format!("{}/v1/modules?name=counter&version=1", gw.url))
        .header("Authorization", format!("Bearer {key}"))
        .header("Content-Type", "application/wasm")
        .send(&wasm[..])
        .unwrap();
    assert_eq!(up.status(), 201);
    let location = up.headers().get("location").unwrap().to_str().unwrap().to_string();
    assert!(location.starts_with("/v1/modules/"), "{location}");
    assert_eq!(api.get(k, &location).status, 200);
    let spec = json!({ "name": "c", "module": "counter@1" });
    let created = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
        .post(format!("{}/v1/deployments", gw.url))
        .header("Authorization", format!("Bearer {key}"))
        .send_json(&spec)
        .unwrap();
    assert_eq!(created.status(), 201);
    let location = created.headers().get("location").unwrap().to_str().unwrap().to_string();
    assert_eq!(api.get(k, &location).body["name"], "c");
    assert_eq!(created.headers().get("etag").unwrap().to_str().unwrap(), "\"1\"");

    // The same spec again changes nothing; a different one is revision 2.
    let again = api.put(k, "/v1/deployments/c", &json!({ "module": "counter@1" }));
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["revision"], 1, "{}", again.body);
    let changed = api.put(
        k,
        "/v1/deployments/c",
        &json!({ "nfs": [{ "module": "counter@1", "limits": { "deadline_ms": 20 } }] }),
    );
    assert_eq!(changed.body["revision"], 2, "{}", changed.body);

    // Lists are paged: a JSON array, and a Link to the next page while
    // more follow; the pages together are the whole list, in order.
    for v in ["2", "3"] {
        assert_eq!(api.upload(k, "counter", v, &wasm).status, 201);
    }
    let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let get_page = |path: &str| {
        let mut r =
            agent.get(format!("{}{path}", gw.url)).header("Authorization", format!("Bearer {key}")).call().unwrap();
        let status = r.status().as_u16();
        let link = r.headers().get("link").map(|v| v.to_str().unwrap().to_string());
        let body: serde_json::Value = serde_json::from_slice(&r.body_mut().read_to_vec().unwrap()).unwrap();
        (status, body, link)
    };
    let (_, all, link) = get_page("/v1/modules");
    assert_eq!(all.as_array().unwrap().len(), 3);
    assert_eq!(link, None, "one page holds them all");
    let mut seen = Vec::new();
    let mut next = Some("/v1/modules?limit=2".to_string());
    while let Some(path) = next.take() {
        let (status, body, link) = get_page(&path);
        assert_eq!(status, 200, "{path}: {body}");
        assert!(body.as_array().unwrap().len() <= 2);
        seen.extend(body.as_array().unwrap().iter().map(|m| m["version"].clone()));
        next = link.map(|l| {
            assert!(l.ends_with("; rel=\"next\""), "{l}");
            l.trim_start_matches('<').split('>').next().unwrap().to_string()
        });
    }
    assert_eq!(serde_json::Value::Array(seen), json!(["1", "2", "3"]));
    // A cursor stays valid when its item goes.
    let (_, first, link) = get_page("/v1/modules?limit=1");
    assert_eq!(first[0]["version"], "1");
    let second = link.unwrap().trim_start_matches('<').split('>').next().unwrap().to_string();
    assert_eq!(api.delete(k, "/v1/modules/counter@2").status, 204);
    let (_, rest, _) = get_page(&second);
    assert_eq!(rest[0]["version"], "3", "{rest}");
    for bad in ["/v1/modules?limit=0", "/v1/modules?limit=1001", "/v1/modules?after=zz", "/v1/deployments?after=%00"] {
        let (status, body, _) = get_page(bad);
        assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")), "{bad}: {body}");
    }
    assert_eq!(api.post(k, "/v1/deployments", &json!({ "name": "d", "module": "counter@3" })).status, 201);
    let (_, d1, link) = get_page("/v1/deployments?limit=1");
    assert_eq!(d1[0]["name"], "c");
    let (_, d2, link2) = get_page(link.unwrap().trim_start_matches('<').split('>').next().unwrap());
    assert_eq!((d2[0]["name"].as_str(), link2), (Some("d"), None));
}
