//! The control plane's trust boundaries, tried as an attacker would, over
//! a real nats-server run with the shipped configuration (mutual TLS, nkey
//! users, subject permissions): no credentials get in; a host's
//! credentials for another group cannot bill, deploy, stop, read or
//! impersonate anything of the victim's; the victim's usage stays exactly
//! what its host processed. Plus API keys (list, rotate, revoke) and group
//! grants.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use async_nats::jetstream;
use serde_json::json;
use sluice_control::{EventBatch, Heartbeat, MeterRecord, Meters, NfEvent};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A raw NATS client signed in with `name`'s nkey and certificate, that
/// records the server's error messages (permission violations).
async fn attacker(nats: &Nats, name: &str, inbox: &str) -> (async_nats::Client, Arc<Mutex<Vec<String>>>) {
    let (seed, _) = nats.pki.nkey(name);
    let (cert, key) = nats.pki.client_cert(name);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e2 = errors.clone();
    let client = async_nats::ConnectOptions::with_nkey(sluice_control::nats::read_seed(&seed).unwrap())
        .add_root_certificates(nats.pki.ca())
        .add_client_certificate(cert, key)
        .require_tls(true)
        .custom_inbox_prefix(inbox)
        .event_callback(move |ev| {
            let e2 = e2.clone();
            async move {
                if let async_nats::Event::ServerError(e) = ev {
                    e2.lock().unwrap().push(e.to_string());
                }
            }
        })
        .connect(nats.url.as_str())
        .await
        .unwrap();
    (client, errors)
}

/// Waits until the server reported a permission violation naming each of `subjects`.
async fn violations(errors: &Arc<Mutex<Vec<String>>>, subjects: &[&str]) {
    for _ in 0..200 {
        let v = errors.lock().unwrap().clone();
        let seen = |s: &&str| v.iter().any(|e| e.contains("Permissions Violation") && e.contains(*s));
        if subjects.iter().all(seen) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("expected permission violations for {subjects:?}, saw {:?}", errors.lock().unwrap());
}

fn forged_record(id: &str, host: &str, tenant: &str, deployment: &str) -> MeterRecord {
    MeterRecord {
        id: id.into(),
        host: host.into(),
        tenant: tenant.into(),
        deployment: deployment.into(),
        nf: "counter".into(),
        module: "counter".into(),
        version: "1".into(),
        digest: "0".repeat(64),
        window_start_ms: 1,
        window_end_ms: 2,
        meters: Meters { invocations: 1, packets: 1_000_000_000_000, bytes: 1 << 40, ..Default::default() },
    }
}

#[test]
fn forged_messages_are_refused_and_the_victims_usage_stays_exact() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let pcap = trace(dir.path(), 300);
    let report = dir.path().join("h1.json");
    let (victim, key) = api.tenant("victim");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let d = api.post(Some(&key), "/v1/deployments", &json!({ "name": "c", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);
    let deployment = d.body["id"].as_str().unwrap().to_string();
    let mut h1 = start_replay_host(
        &nats,
        &gw,
        dir.path(),
        "h1",
        Replay { pcap: &pcap, loops: 4, pps: 20000, window_ms: 100, report: &report },
    );
    api.wait_running(&key, "c", 1);
    // The attacker holds the credentials of h2, a real host of group "other".
    register_host(&nats, &gw, "h2", "other");
    // ...and of h3, whose nkey was never registered.
    let _ = nats.pki.nkey("h3");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // No credentials at all: no client certificate, no nkey.
        let bare = async_nats::ConnectOptions::new()
            .add_root_certificates(nats.pki.ca())
            .require_tls(true)
            .connect(nats.url.as_str())
            .await;
        assert!(bare.is_err(), "a client without credentials got in");
        // A certificate but no nkey, and a certificate with an unknown nkey.
        let (cert, ckey) = nats.pki.client_cert("h3");
        let no_nkey = async_nats::ConnectOptions::new()
            .add_root_certificates(nats.pki.ca())
            .add_client_certificate(cert.clone(), ckey.clone())
            .connect(nats.url.as_str())
            .await;
        assert!(no_nkey.is_err(), "a client without an nkey got in");
        let (seed3, _) = nats.pki.nkey("h3");
        let unknown = async_nats::ConnectOptions::with_nkey(sluice_control::nats::read_seed(&seed3).unwrap())
            .add_root_certificates(nats.pki.ca())
            .add_client_certificate(cert, ckey)
            .connect(nats.url.as_str())
            .await;
        assert!(unknown.is_err(), "an unregistered nkey got in");

        let (client, errors) = attacker(&nats, "h2", "_INBOX_test_h2").await;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(Duration::from_secs(2));

        // 1. A meter record on h1's subject: not allowed to publish there.
        let forged = forged_record("h1-x-1", "h1", &victim, &deployment);
        let body = serde_json::to_vec(&forged).unwrap();
        let r = js.publish("sluice.meter.v1.test.h1", body.clone().into()).await;
        let acked = match r {
            Ok(ack) => ack.await.is_ok(),
            Err(_) => false,
        };
        assert!(!acked, "a meter record on another host's subject was stored");
        // 2. The same bill on its own subject, in its own name, and with a
        // pre-claimed id of h1: stored in the stream, refused by the gateway.
        for rec in [
            forged_record("h2-x-1", "h2", &victim, &deployment),
            forged_record("h2-x-2", "h1", &victim, &deployment),
            forged_record(&format!("h1-{}-0", "0".repeat(32)), "h2", &victim, &deployment),
        ] {
            let ack = js.publish("sluice.meter.v1.test.h2", serde_json::to_vec(&rec).unwrap().into()).await.unwrap();
            ack.await.unwrap();
        }
        // 3. Desired state: write, delete, read the victim's group; create or delete streams.
        let kv = js.get_key_value("sluice-desired-test").await.unwrap();
        let key = format!("default.{deployment}");
        assert!(kv.put(&key, b"{}".to_vec().into()).await.is_err(), "a host wrote desired state");
        assert!(kv.put("default.d_evil", b"{}".to_vec().into()).await.is_err(), "a host added desired state");
        assert!(kv.delete(&key).await.is_err(), "a host deleted desired state");
        assert!(kv.purge(&key).await.is_err(), "a host purged desired state");
        let read = kv.get(&key).await;
        assert!(read.is_err() || read.unwrap().is_none(), "a host read another group's desired state");
        assert!(js.delete_stream("SLUICE_METERS_test").await.is_err(), "a host deleted the meter stream");
        assert!(
            js.create_stream(jetstream::stream::Config {
                name: "EVIL".into(),
                subjects: vec!["sluice.meter.v1.test.h1".into()],
                ..Default::default()
            })
            .await
            .is_err(),
            "a host created a stream"
        );
        // Watching the victim's group through the bus is refused; its own works.
        let auth = sluice_control::NatsAuth {
            nkey_file: Some(nats.pki.nkey("h2").0),
            ca_file: Some(nats.pki.ca()),
            cert_file: Some(nats.pki.client_cert("h2").0),
            key_file: Some(nats.pki.client_cert("h2").1),
            creds_file: None,
        };
        let bus = sluice_control::NatsBus::connect(
            &nats.url,
            "test",
            &auth,
            sluice_control::Role::Host { host: "h2".into() },
            "attacker",
        )
        .await
        .unwrap();
        use sluice_control::Bus;
        let watch = tokio::time::timeout(Duration::from_secs(10), bus.watch_desired("default")).await;
        assert!(matches!(watch, Ok(Err(_)) | Err(_)), "a host watched another group's desired state");
        assert!(bus.watch_desired("other").await.is_ok(), "a host cannot watch its own group");
        // Nor another group's flow-ownership table.
        let table = tokio::time::timeout(Duration::from_secs(3), bus.ownership("default")).await;
        assert!(!matches!(table, Ok(Ok(Some(_)))), "a host read another group's ownership table");
        // Nor write one: a forged table would steer the group's flows.
        let forged = sluice_control::OwnershipTable::build(
            "default",
            u64::MAX,
            0,
            &[sluice_control::Member { host: "h2".into(), weight: 1 }],
            13,
            1,
        )
        .unwrap();
        let put = tokio::time::timeout(Duration::from_secs(3), bus.set_ownership(&forged)).await;
        assert!(!matches!(put, Ok(Ok(()))), "a host published an ownership table");

        // 4. Heartbeats and events: on h1's subjects (refused by the
        // server), and on its own claiming the victim's group (refused by
        // the gateway).
        let hb = Heartbeat {
            host: "h1".into(),
            group: "default".into(),
            boot: "x".into(),
            started_ms: 1,
            sent_ms: sluice_control::now_ms(),
            interval_ms: 1000,
            version: "evil".into(),
            deployments: Vec::new(),
            capacity_pps: 0,
            load_pps: 0,
            table_version: None,
            memory_slot_mb: 0,
        };
        client.publish("sluice.ctl.v1.test.host.heartbeat.h1", serde_json::to_vec(&hb).unwrap().into()).await.unwrap();
        // 5. With h1's own credentials (its nkey and certificate, stolen):
        // records on its own subject for the victim placed on its group, but
        // more than h1 can process in their window, or with windows the
        // gateway's clock refutes: stored in the stream, refused unbilled.
        let (thief, _) = attacker(&nats, "h1", "_INBOX_test_h1").await;
        let thief = jetstream::new(thief);
        let now = sluice_control::now_ms();
        let at = |start: u64, end: u64, packets: u64| MeterRecord {
            window_start_ms: start,
            window_end_ms: end,
            meters: Meters { invocations: 1, packets, bytes: packets * 64, ..Default::default() },
            ..forged_record(&format!("h1-{}-{start}{end}", "f".repeat(32)), "h1", &victim, &deployment)
        };
        for rec in [
            at(now - 1000, now, 1_000_000_000_000),
            at(now + 3_600_000, now + 3_601_000, 10),
            at(now - 3_600_000, now, 10),
        ] {
            let ack = thief.publish("sluice.meter.v1.test.h1", serde_json::to_vec(&rec).unwrap().into()).await.unwrap();
            ack.await.unwrap();
        }
        let hb2 = Heartbeat { host: "h2".into(), ..hb.clone() };
        client.publish("sluice.ctl.v1.test.host.heartbeat.h2", serde_json::to_vec(&hb2).unwrap().into()).await.unwrap();
        let ev = NfEvent {
            tenant: victim.clone(),
            deployment: deployment.clone(),
            nf: "counter".into(),
            version: "1".into(),
            kind: "forged.alert".into(),
            level: "error".into(),
            timestamp_ns: 1,
            flow: None,
            fields: Default::default(),
        };
        let batch = |host: &str| EventBatch { host: host.into(), events: vec![ev.clone()], dropped: 0 };
        client.publish("sluice.event.v1.test.h1", serde_json::to_vec(&batch("h1")).unwrap().into()).await.unwrap();
        client.publish("sluice.event.v1.test.h2", serde_json::to_vec(&batch("h2")).unwrap().into()).await.unwrap();
        // Eavesdropping on the gateway's and h1's inboxes, or every feed.
        for s in ["_INBOX_test_gateway.>", "_INBOX_test_h1.>", "sluice.>", "$KV.>", ">"] {
            let _ = client.subscribe(s).await;
        }
        client.flush().await.unwrap();
        violations(
            &errors,
            &[
                "sluice.meter.v1.test.h1",
                "$KV.sluice-desired-test.default",
                "$JS.API.DIRECT.GET.KV_sluice-desired-test",
                "$JS.API.STREAM.DELETE.SLUICE_METERS_test",
                "$JS.API.STREAM.CREATE.EVIL",
                "heartbeat.h1",
                "sluice.event.v1.test.h1",
                "Subscription to \"_INBOX_test_gateway.>\"",
                "Subscription to \"_INBOX_test_h1.>\"",
                "Subscription to \">\"",
            ],
        )
        .await;
    });

    // The gateway refused what reached it, counted it and said why.
    let rejects = wait_for(30, "the gateway to refuse the forgeries", || {
        let r = api.get(Some(ADMIN), "/v1/rejects").body;
        let c = &r["counts"];
        (c["meter"].as_u64() >= Some(6) && c["heartbeat"].as_u64() >= Some(1) && c["event"].as_u64() >= Some(1))
            .then_some(r)
    });
    let reasons: Vec<String> =
        rejects["recent"].as_array().unwrap().iter().map(|r| r["reason"].as_str().unwrap().to_string()).collect();
    assert!(reasons.iter().any(|r| r.contains("never placed on group 'other'")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("names host 'h1'")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("is not one of this host's")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("claims group 'default'")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("exceed what host 'h1' can process")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("after the gateway's clock")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("longer than [meters] max-window-ms")), "{reasons:?}");
    assert!(api.get(Some(&key), "/v1/events?kind=forged.alert").body.as_array().unwrap().is_empty());
    // h2 is not listed as running anything, and h1 is still h1.
    let hosts = api.get(Some(ADMIN), "/v1/hosts").body;
    let h1_row = hosts.as_array().unwrap().iter().find(|h| h["host"] == "h1").unwrap().clone();
    assert_eq!(h1_row["group"], "default");
    assert_ne!(h1_row["version"], "evil");

    // The victim's deployment runs on, and its usage is exactly what h1 processed.
    wait_for(60, "h1's passes", || (host_report(&report)["traces"].as_u64() == Some(4)).then_some(()));
    h1.term();
    let expected = report_totals(&[host_report(&report)]);
    assert!(expected.values().map(|t| t[1]).sum::<u64>() > 0);
    wait_for(30, "usage to equal h1's report", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(())
    });
    let d = api.get(Some(&key), "/v1/deployments/c").body;
    assert_eq!(d["revision"], 1);
}

#[test]
fn keys_are_listed_rotated_and_revoked_and_groups_are_granted() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let (id, k1) = api.tenant("acme");
    // The scheme is case-insensitive.
    let r = ureq::get(format!("{}/v1/me", gw.url)).header("Authorization", format!("bEaReR {k1}")).call();
    assert_eq!(r.unwrap().status(), 200);

    let k2 = api.post(Some(&k1), "/v1/me/keys", &json!({})).body["api_key"].as_str().unwrap().to_string();
    let keys = api.get(Some(&k2), "/v1/me/keys").body;
    assert_eq!(keys.as_array().unwrap().len(), 2);
    assert_eq!(keys.as_array().unwrap().iter().filter(|k| k["current"] == true).count(), 1);
    assert_eq!(api.get(Some(ADMIN), &format!("/v1/tenants/{id}/keys")).body.as_array().unwrap().len(), 2);

    // Rotation: the new key works, the old one is refused on the next request.
    let rotated = api.post(Some(&k1), "/v1/me/keys/rotate", &json!({}));
    assert_eq!(rotated.status, 201, "{}", rotated.body);
    let k3 = rotated.body["api_key"].as_str().unwrap().to_string();
    assert_eq!(api.get(Some(&k1), "/v1/me").status, 401);
    assert_eq!(api.get(Some(&k3), "/v1/me").status, 200);

    // Revocation by prefix, by the tenant and by the operator.
    let prefix2 = k2.trim_start_matches("sk_")[..8].to_string();
    assert_eq!(api.delete(Some(&k3), &format!("/v1/me/keys/{prefix2}")).status, 204);
    assert_eq!(api.get(Some(&k2), "/v1/me").status, 401);
    assert_eq!(api.delete(Some(&k3), "/v1/me/keys/ffffffff").status, 404);
    let prefix3 = k3.trim_start_matches("sk_")[..8].to_string();
    let (_, other) = api.tenant("other");
    assert_eq!(api.delete(Some(&other), &format!("/v1/me/keys/{prefix3}")).status, 404, "another tenant's key");
    assert_eq!(api.delete(Some(&k3), &format!("/v1/tenants/{id}/keys/{prefix3}")).status, 403);
    assert_eq!(api.delete(Some(ADMIN), &format!("/v1/tenants/{id}/keys/{prefix3}")).status, 204);
    assert_eq!(api.get(Some(&k3), "/v1/me").status, 401);

    // Groups: only granted ones.
    let k4 = api.post(Some(ADMIN), &format!("/v1/tenants/{id}/keys"), &json!({})).body["api_key"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(api.get(Some(&k4), "/v1/me").body["groups"], json!(["default"]));
    assert_eq!(api.upload(Some(&k4), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let denied =
        api.post(Some(&k4), "/v1/deployments", &json!({ "name": "c", "module": "counter@1", "group": "secure" }));
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert_eq!(denied.body["error"], "group_not_granted");
    assert_eq!(api.put(Some(&k4), &format!("/v1/tenants/{id}/groups"), &json!({ "groups": ["secure"] })).status, 403);
    let g = api.put(Some(ADMIN), &format!("/v1/tenants/{id}/groups"), &json!({ "groups": ["secure", "default"] }));
    assert_eq!(g.status, 200, "{}", g.body);
    assert_eq!(g.body["groups"], json!(["default", "secure"]));
    assert_eq!(api.put(Some(ADMIN), &format!("/v1/tenants/{id}/groups"), &json!({ "groups": ["a.b"] })).status, 400);
    let ok = api.post(Some(&k4), "/v1/deployments", &json!({ "name": "c", "module": "counter@1", "group": "secure" }));
    assert_eq!(ok.status, 201, "{}", ok.body);
    // Moving it to a group not granted is refused too.
    let mv = api.put(Some(&k4), "/v1/deployments/c", &json!({ "module": "counter@1", "group": "elsewhere" }));
    assert_eq!(mv.status, 403, "{}", mv.body);

    // Host registry: bad input is refused, duplicates conflict.
    assert_eq!(api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h9", "group": "g", "nkey": "nope" })).status, 400);
    assert_eq!(api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h.9", "group": "g" })).status, 400);
    assert_eq!(api.post(Some(&k4), "/v1/hosts", &json!({ "id": "h9", "group": "g" })).status, 403);
    assert_eq!(api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h9", "group": "g" })).status, 201);
    assert_eq!(api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h9", "group": "g" })).status, 409);
    assert_eq!(api.delete(Some(ADMIN), "/v1/hosts/h9").status, 204);
    assert_eq!(api.delete(Some(ADMIN), "/v1/hosts/h9").status, 404);
}

/// A NATS server the gateway does not share a machine with (a pod in
/// Kubernetes) follows the host registry through `sluice-gateway
/// nats-auth-sync`: its first block lets the gateway alone in (the same
/// block `nats-auth` writes); a host registered later gets in with no
/// operator reload, and a removed one is written out again; an answer
/// carrying another gateway key is refused.
#[test]
fn a_servers_authorization_follows_the_registry_through_nats_auth_sync() {
    let _turn = beside_others();
    let dir = test_dir();
    let pid_file = dir.path().join("nats.pid");
    let nats = Nats::start_with(dir.path(), |conf| format!("{conf}\npid_file: \"{}\"\n", pid_file.display()));
    let block = nats.conf_dir.join("sluice-auth.conf");
    let (_, gateway_key) = nats.pki.nkey("gateway");
    let token = dir.path().join("admin-token");
    std::fs::write(&token, format!("{ADMIN}\n")).unwrap();
    let sync = |gateway: &str, key: &str, out: &std::path::Path, once: bool| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-gateway"));
        c.args(["--cluster", "test", "nats-auth-sync", "--gateway", gateway, "--gateway-public-key", key])
            .arg("--token-file")
            .arg(&token)
            .arg("--out")
            .arg(out)
            .arg("--pid-file")
            .arg(&pid_file)
            .args(["--every-ms", "200"])
            .env_remove("SLUICE_ADMIN_TOKEN");
        if once {
            c.arg("--once");
        }
        c
    };

    // Before the gateway runs: the block with the gateway alone.
    let first = dir.path().join("first.conf");
    let out = sync("http://127.0.0.1:1", &gateway_key, &first, true).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stays as it is"));
    assert_eq!(std::fs::read_to_string(&first).unwrap(), std::fs::read_to_string(&block).unwrap());

    // The gateway writes its own file elsewhere: this server follows the API.
    let own = dir.path().join("gateway-own-auth.conf");
    let gw = Gateway::start(&nats, dir.path(), &[("SLUICE_NATS_AUTH_FILE", own.to_str().unwrap())]);
    let api = gw.api();
    let mut follower = Proc {
        child: sync(&gw.url, &gateway_key, &block, false)
            .stdout(log_file(dir.path(), "sync"))
            .stderr(log_file(dir.path(), "sync"))
            .spawn()
            .unwrap(),
        name: "nats-auth-sync".into(),
    };
    let reloads = || {
        std::fs::read_to_string(dir.path().join("nats.log"))
            .unwrap_or_default()
            .matches("Reloaded server configuration")
            .count()
    };

    // A host registered through the API gets in, with no reload by hand.
    let (_, h1_key) = nats.pki.nkey("h1");
    let r = api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h1", "group": "default", "nkey": h1_key }));
    assert_eq!(r.status, 201, "{}", r.body);
    wait_for(20, "the block to let h1 in", || std::fs::read_to_string(&block).unwrap().contains(&h1_key).then_some(()));
    wait_for(20, "nats-server to reload", || (reloads() >= 1).then_some(()));
    let mut host = start_host_unregistered(&nats, dir.path(), "h1", &[]);
    wait_for(60, "h1 to be seen alive", || {
        let hosts = api.get(Some(ADMIN), "/v1/hosts").body;
        hosts.as_array().unwrap().iter().any(|h| h["host"] == "h1" && h["alive"] == true).then_some(())
    });
    host.term();

    // An answer for another gateway key is refused; the block stays.
    let before = std::fs::read_to_string(&block).unwrap();
    let (_, other_key) = nats.pki.nkey("h9");
    let out = sync(&gw.url, &other_key, &block, true).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing it"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&block).unwrap(), before);
    // Without the admin token the gateway tells nothing.
    assert_eq!(api.get(None, "/v1/nats-authorization").status, 401);

    // Removed: written out again, and the server reloads.
    let seen = reloads();
    assert_eq!(api.delete(Some(ADMIN), "/v1/hosts/h1").status, 204);
    wait_for(20, "the block to drop h1", || {
        (!std::fs::read_to_string(&block).unwrap().contains(&h1_key)).then_some(())
    });
    wait_for(20, "nats-server to reload", || (reloads() > seen).then_some(()));
    follower.kill9();
}
