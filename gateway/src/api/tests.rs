//! Unit tests of the HTTP API: attachments and limits as requests give
//! them, and what the OpenAPI document says.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
use super::*;
use axum::http::StatusCode;
use sluice_control::{ModuleRef, NfLimitsSpec, NfPlacement};
use sluice_traffic::Attachment;

fn attach(json: serde_json::Value) -> Result<Vec<Attachment>, ApiError> {
    let req: DeploymentIn = serde_json::from_value(serde_json::json!({ "module": "m@1", "attach": json }))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    parse_attachments(&req.attach.unwrap_or_default())
}

#[test]
fn attachments_come_as_text_or_objects() {
    let got = attach(serde_json::json!([
        "port=0,vlan=100,dst=10.1.0.0/16,out=1",
        { "port": 1, "vlan": 0, "dst": "2001:db8::/32" },
        { "port": 1 },
        { "port": 2, "dst": "203.0.113.1/32", "out": 0, "side": "outside" }
    ]))
    .unwrap();
    let text: Vec<String> = got.iter().map(Attachment::to_string).collect();
    assert_eq!(
        text,
        [
            "port=0,vlan=100,dst=10.1.0.0/16,out=1",
            "port=1,vlan=0,dst=2001:db8::/32",
            "port=1",
            "port=2,dst=203.0.113.1/32,out=0,side=outside"
        ]
    );
    // Each mistake is named.
    for (bad, says) in [
        (serde_json::json!(["port=0,vlan=4095"]), "VLAN 4095"),
        (serde_json::json!(["vlan=1"]), "no port="),
        (serde_json::json!([{ "port": 0, "dst": "10.0.0.1/8" }]), "write 10.0.0.0/8"),
        (serde_json::json!([{ "port": 0, "dst": "ten" }]), "dst 'ten'"),
        (serde_json::json!([{ "port": 0, "colour": "red" }]), "unknown field `colour`"),
        (serde_json::json!([7]), "give a string"),
        (serde_json::json!([{ "port": 0, "side": "up" }]), "give inside or outside"),
    ] {
        let e = attach(bad.clone()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains(says), "{bad}: {}", e.message);
    }
    let many: Vec<String> = (0..17).map(|v| format!("port=0,vlan={}", v + 1)).collect();
    assert!(attach(serde_json::json!(many)).unwrap_err().message.contains("at most 16"));
}

#[test]
fn the_bill_is_documented_as_json_and_as_csv() {
    use utoipa::OpenApi;
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let content = &doc["paths"]["/v1/bill"]["get"]["responses"]["200"]["content"];
    assert!(content["application/json"]["schema"].to_string().contains("BillOut"), "{content}");
    assert!(content["text/csv"].is_object(), "{content}");
}

#[test]
fn the_openapi_document_shows_both_attachment_forms() {
    use utoipa::OpenApi;
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let forms = schemas["AttachmentIn"]["oneOf"].to_string();
    assert!(forms.contains("\"string\"") && forms.contains("AttachmentObject"), "{forms}");
    assert!(schemas["DeploymentIn"]["properties"]["attach"].to_string().contains("AttachmentIn"));
    assert!(schemas["DeploymentOut"]["required"].to_string().contains("attachments"));
    assert!(schemas["AttachmentObject"]["properties"]["dst"].is_object());
}

#[test]
fn every_limit_reaches_the_spec_and_each_bound_is_a_422_naming_nf_and_field() {
    let l: LimitsIn = serde_json::from_value(serde_json::json!({
        "failure_policy": "fail-open", "deadline_ms": 1000, "memory_mb": 256, "start_deadline_ms": 30000,
        "fuel": 1_000_000_000_000u64, "max_flows": 16_777_216, "max_flow_state_bytes": 65536,
        "state_budget_mb": 1024, "log_lines_per_second": 0
    }))
    .unwrap();
    let spec = limits_spec(l, "fw", &(256, String::new()), 1024).unwrap();
    assert_eq!(
        spec,
        NfLimitsSpec {
            failure_policy: Some("fail-open".into()),
            deadline_ms: Some(1000),
            memory_mb: Some(256),
            start_deadline_ms: Some(30_000),
            fuel: Some(1_000_000_000_000),
            max_flows: Some(16_777_216),
            max_flow_state_bytes: Some(65_536),
            state_budget_mb: Some(1024),
            log_lines_per_second: Some(0),
        }
    );
    assert_eq!(limits_spec(LimitsIn::default(), "fw", &(256, String::new()), 1024).unwrap(), NfLimitsSpec::default());
    for (field, bad, says) in [
        ("failure_policy", serde_json::json!("fail-maybe"), "fail-open or fail-closed"),
        ("deadline_ms", serde_json::json!(0), "1-1000, not 0"),
        ("deadline_ms", serde_json::json!(1001), "1-1000, not 1001"),
        ("memory_mb", serde_json::json!(257), "1-256"),
        ("start_deadline_ms", serde_json::json!(0), "1-30000, not 0"),
        ("start_deadline_ms", serde_json::json!(30_001), "1-30000"),
        ("fuel", serde_json::json!(1_000_000_000_001u64), "0-1000000000000 (0: unlimited)"),
        ("max_flows", serde_json::json!(0), "1-16777216"),
        ("max_flows", serde_json::json!(16_777_217), "1-16777216"),
        ("max_flow_state_bytes", serde_json::json!(0), "1-65536"),
        ("max_flow_state_bytes", serde_json::json!(65_537), "1-65536"),
        ("state_budget_mb", serde_json::json!(0), "1-1024"),
        ("state_budget_mb", serde_json::json!(1025), "max-state-budget-mb"),
        ("log_lines_per_second", serde_json::json!(10_001), "0-10000"),
        ("log_lines_per_second", serde_json::json!(5_000_000_000u64), "0-10000"),
    ] {
        let l: LimitsIn = serde_json::from_value(serde_json::json!({ field: bad })).unwrap();
        let e = limits_spec(l, "fw", &(256, String::new()), 1024).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_limit"), "{field}={bad}");
        assert!(e.message.starts_with(&format!("NF 'fw': {field}")), "{field}={bad}: {}", e.message);
        assert!(e.message.contains(says), "{field}={bad}: {}", e.message);
    }
    // The gateway's own bound on state budgets applies.
    let l = LimitsIn { state_budget_mb: Some(100), ..LimitsIn::default() };
    assert!(limits_spec(l, "fw", &(256, String::new()), 64).unwrap_err().message.contains("1-64"));
    // Unknown limits are refused by name.
    let e = serde_json::from_value::<LimitsIn>(serde_json::json!({ "stack_mb": 1 })).unwrap_err();
    assert!(e.to_string().contains("unknown field `stack_mb`"), "{e}");
}

#[test]
fn the_openapi_document_gives_each_limit_its_range() {
    use utoipa::OpenApi;
    let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
    let p = &doc["components"]["schemas"]["LimitsIn"]["properties"];
    for (field, min, max) in [
        ("deadline_ms", 1.0, Some(1000.0)),
        ("start_deadline_ms", 1.0, Some(30_000.0)),
        ("fuel", 0.0, Some(1e12)),
        ("max_flows", 1.0, Some(16_777_216.0)),
        ("max_flow_state_bytes", 1.0, Some(65_536.0)),
        ("log_lines_per_second", 0.0, Some(10_000.0)),
        ("memory_mb", 1.0, None),
        ("state_budget_mb", 1.0, None),
    ] {
        assert_eq!(p[field]["minimum"].as_f64(), Some(min), "{field}: {}", p[field]);
        assert_eq!(p[field]["maximum"].as_f64(), max, "{field}: {}", p[field]);
        assert!(p[field]["description"].as_str().is_some_and(|d| d.contains('(')), "{field}: {}", p[field]);
    }
    let schemas = &doc["components"]["schemas"];
    // A usage row is the meters (a reference) and its own fields.
    let row = &schemas["UsageRow"]["allOf"];
    assert_eq!(row[0]["$ref"], "#/components/schemas/Meters", "{row}");
    for field in ["state_gb_hours", "state_bytes"] {
        assert!(row[1]["properties"][field]["description"].is_string(), "{field}: {row}");
    }
    for field in ["state_byte_ms", "packets", "policy", "table_ops"] {
        assert!(schemas["Meters"]["properties"][field]["description"].is_string(), "{field}: {}", schemas["Meters"]);
    }
}

#[test]
fn attachments_must_fit_the_groups_ports() {
    let config: crate::config::GatewayConfig =
        toml::from_str("admin-token = 'secret-token'\n[groups.edge]\nports = [0, 1]\n").unwrap();
    let a = |t: &str| vec![t.parse::<Attachment>().unwrap()];
    check_group_attachments(&config, "edge", &a("port=0,vlan=100,out=1")).unwrap();
    check_group_attachments(&config, "default", &[]).unwrap();
    for (group, list, code, says) in [
        ("edge", vec![], "attachment_required", "shares its ports between tenants"),
        ("edge", a("port=3"), "port_not_exposed", "port 3 is not exposed in host group 'edge' (exposed: 0, 1)"),
        ("edge", a("port=0,out=2"), "port_not_exposed", "port 2 is not exposed"),
        ("default", a("port=0"), "no_ports_exposed", "development group"),
        (
            "edge",
            [a("port=1,out=0"), a("port=1,dst=203.0.113.1/32,out=0,side=outside")].concat(),
            "attachment_side",
            "port 1 is attached both inside and outside",
        ),
    ] {
        let e = check_group_attachments(&config, group, &list).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, code));
        assert!(e.message.contains(says), "{}", e.message);
    }
}

#[test]
fn only_a_linear_chain_takes_an_outside_attachment() {
    let place = |name: &str, next: Option<&str>, labels: &[(u16, &str)]| NfPlacement {
        name: name.into(),
        module: ModuleRef { id: "m".into(), name: name.into(), version: "1".into(), digest: "d".into(), size: 1 },
        config: String::new(),
        next: next.map(Into::into),
        labels: labels.iter().map(|(l, t)| (*l, t.to_string())).collect(),
        limits: NfLimitsSpec::default(),
    };
    let a = |t: &str| t.parse::<Attachment>().unwrap();
    let outside = [a("port=0,out=1"), a("port=1,out=0,side=outside")];
    let linear = [place("fw", Some("nat"), &[]), place("nat", None, &[])];
    check_reverse(&outside, &linear).unwrap();
    let branching = [place("fw", Some("nat"), &[(1, "nat")]), place("nat", None, &[])];
    let e = check_reverse(&outside, &branching).unwrap_err();
    assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "attachment_side"));
    check_reverse(&outside[..1], &branching).unwrap();
}

#[test]
fn every_name_in_the_openapi_document_follows_the_one_rule() {
    use utoipa::OpenApi;
    let doc = serde_json::to_string(&crate::ApiDoc::openapi()).unwrap();
    let patterns: std::collections::BTreeSet<&str> =
        doc.split("\"pattern\":\"").skip(1).filter_map(|rest| rest.split('"').next()).collect();
    let names: Vec<&&str> = patterns.iter().filter(|p| p.contains("A-Za-z0-9_-")).collect();
    assert!(!names.is_empty(), "{patterns:?}");
    for p in names {
        assert_eq!(*p, sluice_traffic::NAME_PATTERN, "{patterns:?}");
    }
}
