//! Traffic attachments at the API, over a real gateway and nats-server: a
//! group whose operator exposes ports requires them, on those ports only,
//! and refuses a claim that overlaps another deployment's (naming it only
//! to its own tenant); a development group refuses them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::{Value, json};

/// Creates a tenant that may deploy to `default` and `edge`; returns its key.
fn tenant(api: &Api, name: &str) -> String {
    let r = api.post(Some(ADMIN), "/v1/tenants", &json!({ "name": name, "groups": ["default", "edge"] }));
    assert_eq!(r.status, 201, "{}", r.body);
    let key = r.body["api_key"].as_str().unwrap().to_string();
    let up = api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap());
    assert_eq!(up.status, 201, "{}", up.body);
    key
}

fn deploy(api: &Api, key: &str, name: &str, group: &str, attach: Option<Value>) -> Resp {
    let mut body = json!({ "name": name, "group": group, "module": "counter@1" });
    if let Some(a) = attach {
        body["attach"] = a;
    }
    api.post(Some(key), "/v1/deployments", &body)
}

fn refused(r: &Resp, status: u16, code: &str) -> String {
    assert_eq!((r.status, r.body["error"].as_str()), (status, Some(code)), "{}", r.body);
    r.body["message"].as_str().unwrap().to_string()
}

#[test]
fn attachments_are_checked_at_the_api() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, "[groups.edge]\nports = [0, 1]\n").unwrap();
    let gw = Gateway::start(&nats, dir.path(), &[("SLUICE_GATEWAY_CONFIG", config.to_str().unwrap())]);
    let api = gw.api();
    let a = tenant(&api, "acme");
    let b = tenant(&api, "globex");

    // A claims VLAN 100 on port 0.
    let r = deploy(&api, &a, "acme-web", "edge", Some(json!(["port=0,vlan=100"])));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["attachments"], json!(["port=0,vlan=100"]));
    let got = api.get(Some(&a), "/v1/deployments/acme-web");
    assert_eq!(got.body["attachments"], json!(["port=0,vlan=100"]), "{}", got.body);

    // B may not take part of it, and is not told whose it is.
    let r = deploy(&api, &b, "globex-web", "edge", Some(json!(["port=0,vlan=100,dst=10.0.0.0/8"])));
    let m = refused(&r, 409, "attachment_overlap");
    assert!(m.contains("another tenant's deployment") && !m.contains("acme"), "{m}");
    // A's own second claim on it is refused, naming the first (the object form).
    let r = deploy(&api, &a, "acme-api", "edge", Some(json!([{ "port": 0, "vlan": 100, "dst": "10.1.0.0/16" }])));
    let m = refused(&r, 409, "attachment_overlap");
    assert!(m.contains("'acme-web'") && m.contains("'port=0,vlan=100'"), "{m}");

    // Only exposed ports; a shared group needs an attachment; a
    // development group takes none.
    let m = refused(&deploy(&api, &b, "globex-web", "edge", Some(json!(["port=2"]))), 422, "port_not_exposed");
    assert!(m.contains("port 2 is not exposed in host group 'edge' (exposed: 0, 1)"), "{m}");
    let m = refused(&deploy(&api, &b, "globex-web", "edge", Some(json!(["port=0,out=5"]))), 422, "port_not_exposed");
    assert!(m.contains("port 5"), "{m}");
    let m = refused(&deploy(&api, &b, "globex-web", "edge", None), 422, "attachment_required");
    assert!(m.contains("host group 'edge' shares its ports between tenants") && m.contains("--attach port="), "{m}");
    let m = refused(&deploy(&api, &b, "globex-web", "default", Some(json!(["port=0"]))), 422, "no_ports_exposed");
    assert!(m.contains("development group"), "{m}");
    // Malformed ones say what is wrong.
    let m = refused(&deploy(&api, &b, "globex-web", "edge", Some(json!(["port=0,vlan=5000"]))), 400, "bad_request");
    assert!(m.contains("VLAN 5000"), "{m}");

    // Disjoint traffic is B's to take.
    let r = deploy(&api, &b, "globex-web", "edge", Some(json!(["port=0,vlan=200"])));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(api.get(Some(&b), "/v1/deployments").body[0]["attachments"], json!(["port=0,vlan=200"]));

    // An update without `attach` keeps the attachments; one that claims
    // B's traffic is refused; moving to the development group needs `[]`,
    // and frees the traffic for B.
    let r = api.put(Some(&a), "/v1/deployments/acme-web", &json!({ "module": "counter@1" }));
    assert_eq!((r.status, &r.body["attachments"]), (200, &json!(["port=0,vlan=100"])), "{}", r.body);
    let r = api.put(Some(&a), "/v1/deployments/acme-web", &json!({ "module": "counter@1", "attach": ["port=0"] }));
    let m = refused(&r, 409, "attachment_overlap");
    assert!(!m.contains("globex"), "{m}");
    let r = api.put(Some(&a), "/v1/deployments/acme-web", &json!({ "module": "counter@1", "group": "default" }));
    refused(&r, 422, "no_ports_exposed");
    let r = api.put(
        Some(&a),
        "/v1/deployments/acme-web",
        &json!({ "module": "counter@1", "group": "default", "attach": [] }),
    );
    assert_eq!((r.status, &r.body["attachments"]), (200, &json!([])), "{}", r.body);
    let r = api.put(
        Some(&b),
        "/v1/deployments/globex-web",
        &json!({ "module": "counter@1", "attach": ["port=0,vlan=200", "port=0,vlan=100"] }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}
