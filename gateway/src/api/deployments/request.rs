//! A deployment request and its checks: the request's types, its traffic
//! attachments against the group's ports and the chain, each NF's limits,
//! sizes, module references and routes, and a trial start of the chain
//! with its configs.

use crate::api::check_name;
use crate::auth::Tenant;
use crate::error::ApiError;
use crate::state::AppState;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use sluice_control::{ModuleRef, NfLimitsSpec, NfPlacement};
use sluice_runtime::{Chain, FailurePolicy, NfLimits, NfSpec, Routes, RuntimeError};
use sluice_traffic::Attachment;
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::ToSchema;

/// Limits of one NF; unset ones take the host's defaults. A value out of
/// its range is a 422 `invalid_limit` naming the NF and the field.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsIn {
    /// What a batch the NF failed (trap, deadline, error) becomes:
    /// `fail-open` forwards it, `fail-closed` (hosts' default) drops it.
    #[schema(pattern = "^fail-(open|closed)$")]
    pub failure_policy: Option<String>,
    /// CPU deadline per batch, ms (1-1000; hosts default to 10).
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub deadline_ms: Option<u64>,
    /// Linear memory cap per instance, MiB (1 to the hosts' memory slot,
    /// `max_memory_mb`, 256 by default; hosts default to 64).
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub memory_mb: Option<u64>,
    /// CPU deadline of starting an instance (instantiation and `init`),
    /// ms (1-30000; hosts default to 1000). Language runtimes restoring a
    /// snapshot (Python, JavaScript) need tens of milliseconds.
    #[schema(minimum = 1, maximum = 30000)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub start_deadline_ms: Option<u64>,
    /// Fuel (about one Wasm instruction) per batch call, 0 to 10^12; 0:
    /// unlimited. Counted only on hosts that compile fuel metering in.
    #[schema(minimum = 0, maximum = 1e12)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub fuel: Option<u64>,
    /// Most flows with state per worker (1-16777216 flows).
    #[schema(minimum = 1, maximum = 16_777_216)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub max_flows: Option<u64>,
    /// Largest state value of one flow, bytes (1-65536).
    #[schema(minimum = 1, maximum = 65_536)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub max_flow_state_bytes: Option<u64>,
    /// State budget, MiB (1 to the gateway's `max-state-budget-mb`, 1024
    /// by default; hosts default to 64): each instance's own tables and
    /// flow state, and once more the NF's shared tables on a host.
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub state_budget_mb: Option<u64>,
    /// Log lines per second per instance, lines/s (0-10000; hosts default
    /// to 50); more are dropped and counted.
    #[schema(minimum = 0, maximum = 10_000)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub log_lines_per_second: Option<u64>,
}

/// One NF of a chain.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NfIn {
    /// Name in the chain (default: the module's name).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: Option<String>,
    /// Module id or `name@version`.
    pub module: String,
    /// The NF's configuration: a string is passed verbatim, anything else as JSON.
    #[schema(value_type = Object)]
    pub config: Option<serde_json::Value>,
    /// NF that gets the forwarded packets (none: they leave the chain).
    pub next: Option<String>,
    /// Label → NF for labelled packets.
    #[serde(default)]
    pub labels: BTreeMap<u16, String>,
    /// Limits.
    #[serde(default)]
    pub limits: LimitsIn,
}

/// A deployment request: one module, or a chain in `nfs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploymentIn {
    /// Name, unique per tenant (ignored by updates).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: Option<String>,
    /// Host group (default `default`).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub group: Option<String>,
    /// A single module (id or `name@version`) instead of `nfs`.
    pub module: Option<String>,
    /// Its configuration (with `module`).
    #[schema(value_type = Object)]
    pub config: Option<serde_json::Value>,
    /// Its limits (with `module`).
    pub limits: Option<LimitsIn>,
    /// A chain, in order; every route must go forward. Without `next`, an
    /// NF's packets go to the NF after it (the last one's leave).
    #[schema(min_items = 1, max_items = 16)]
    pub nfs: Option<Vec<NfIn>>,
    /// Which traffic of the group's hosts is this deployment's: at most 16
    /// attachments, each the text form `port=0,vlan=100,dst=10.1.0.0/16,out=1`
    /// or the same as an object. Required in a group whose operator exposes
    /// ports (`port` and `out` must be among them, and no two deployments
    /// of the group, of any tenant, may overlap: 409 `attachment_overlap`);
    /// refused in a development group (no exposed ports), whose
    /// deployments see every packet of a host's capture. An update without
    /// it keeps the deployment's attachments; `[]` removes them.
    #[schema(max_items = 16)]
    pub attach: Option<Vec<AttachmentIn>>,
    /// What the NFs see of fragmented IP datagrams: `follow` (default: the
    /// first fragment runs the NFs, the later ones follow its verdict and
    /// rewrites; nothing is buffered) or `reassemble` (the host holds the
    /// fragments until the datagram is whole, within bounded buffers per
    /// deployment and per source, runs the NFs on the whole datagram and
    /// cuts it again as it came). An update without it keeps the
    /// deployment's choice.
    #[schema(value_type = Option<String>, pattern = "^(follow|reassemble)$", example = "reassemble")]
    pub fragments: Option<sluice_runtime::fragments::FragmentMode>,
    /// What a host's death may lose of the flows' state, in a group whose
    /// hosts replicate it: `periodic` (default: changed state goes to each
    /// flow's next owner every replication interval; a kill loses the last
    /// interval's changes, and no packet waits) or `replicated` (output
    /// commit: a packet whose processing changed its flow's state leaves
    /// only once the next owner holds the change, about a round trip
    /// between the hosts later, so a kill loses no state a packet out of
    /// the host depended on; packets that changed nothing pass at once).
    /// An update without it keeps the deployment's choice.
    #[schema(value_type = Option<String>, pattern = "^(periodic|replicated)$", example = "replicated")]
    pub durability: Option<sluice_control::Durability>,
}

/// A traffic attachment as a request gives it: the text form or an object.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum AttachmentIn {
    /// `port=0,vlan=100,dst=10.1.0.0/16,out=1`: `port` is required, the
    /// others narrow it (`vlan`, `dst`) or name the egress port (`out`).
    #[schema(example = "port=0,vlan=100,dst=10.1.0.0/16")]
    Text(String),
    /// The same as an object.
    Object(AttachmentObject),
}

/// A traffic attachment as an object.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachmentObject {
    /// Ingress port (DPDK port id), one the host group exposes.
    #[serde(deserialize_with = "crate::whole::required")]
    #[schema(maximum = 65535)]
    pub port: u16,
    /// 802.1Q VLAN id of the outer tag: 1-4094 for that VLAN, 0 for
    /// untagged frames only; none: any.
    #[serde(default, deserialize_with = "crate::whole::optional")]
    #[schema(maximum = 4094)]
    pub vlan: Option<u16>,
    /// Destination prefix, IPv4 or IPv6, host bits clear; none: any packet.
    #[serde(default)]
    #[schema(example = "10.1.0.0/16")]
    pub dst: Option<String>,
    /// Egress port (one the group exposes) of forwarded packets the NF
    /// sends nowhere else; none: the host's default.
    #[serde(default, deserialize_with = "crate::whole::optional")]
    #[schema(maximum = 65535)]
    pub out: Option<u16>,
    /// `outside`: packets of this attachment are replies (e.g. to a NAT's
    /// public address) and run a linear chain last NF first; `inside`
    /// (the default): connections are opened from here.
    #[serde(default)]
    #[schema(pattern = "^(inside|outside)$", example = "outside")]
    pub side: Option<String>,
}

impl<'de> Deserialize<'de> for AttachmentIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let shown = |v: &serde_json::Value| v.to_string().chars().take(200).collect::<String>();
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(AttachmentIn::Text(s)),
            v @ serde_json::Value::Object(_) => {
                serde_json::from_value(v.clone()).map(AttachmentIn::Object).map_err(|e| {
                    D::Error::custom(format!(
                        "attachment {}: {e} (an object has port and optionally vlan, dst, out, side)",
                        shown(&v)
                    ))
                })
            }
            other => Err(D::Error::custom(format!(
                "attachment {}: give a string such as \"port=0,vlan=100\" or an object such as {{\"port\": 0, \"vlan\": 100}}",
                shown(&other)
            ))),
        }
    }
}

impl AttachmentIn {
    /// The attachment, checked (VLAN range, canonical prefix).
    fn parse(&self) -> Result<Attachment, String> {
        match self {
            AttachmentIn::Text(t) => t.parse::<Attachment>().map_err(|e| e.to_string()),
            AttachmentIn::Object(o) => {
                let dst = o
                    .dst
                    .as_deref()
                    .map(|d| {
                        d.parse::<ipnet::IpNet>()
                            .map_err(|e| format!("attachment: dst '{d}': {e} (give a prefix such as 10.1.0.0/16)"))
                    })
                    .transpose()?;
                let side = match o.side.as_deref() {
                    Some(v) => v.parse().map_err(|e| format!("attachment: {e}"))?,
                    None => sluice_traffic::Side::Inside,
                };
                let a = Attachment { port: o.port, vlan: o.vlan, dst, out: o.out, side };
                a.validate().map_err(|e| e.to_string())?;
                Ok(a)
            }
        }
    }
}

/// The most traffic attachments of one deployment. Every host of the
/// group matches each packet against the attachments of all its
/// deployments, and they travel with the deployment to every host: a
/// short list per deployment keeps both small. A prefix that covers
/// several (`dst=10.0.0.0/8`) counts once.
pub const MAX_ATTACHMENTS: usize = 16;

/// The attachments a request gives, each checked.
pub(crate) fn parse_attachments(list: &[AttachmentIn]) -> Result<Vec<Attachment>, ApiError> {
    if list.len() > MAX_ATTACHMENTS {
        return Err(ApiError::bad_request(format!(
            "{} attachments given; a deployment may have at most {MAX_ATTACHMENTS} (one prefix such as dst=10.0.0.0/8 can cover several)",
            list.len()
        )));
    }
    list.iter()
        .enumerate()
        .map(|(i, a)| a.parse().map_err(|e| ApiError::bad_request(format!("attach[{i}]: {e}"))))
        .collect()
}

/// Checks attachments against the ports `group` exposes: required (on
/// exposed ports only) where it exposes some, refused where it exposes
/// none. Overlaps with other deployments are the store's to check.
pub(crate) fn check_group_attachments(
    config: &crate::config::GatewayConfig,
    group: &str,
    attachments: &[Attachment],
) -> Result<(), ApiError> {
    let exposed = config.exposed_ports(group);
    let list = exposed.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    if exposed.is_empty() {
        if attachments.is_empty() {
            return Ok(());
        }
        return Err(ApiError::unprocessable(
            "no_ports_exposed",
            format!(
                "host group '{group}' exposes no ports: it is a development group, whose deployments take no \
                 attachments and see every packet of a host's capture; deploy without attachments (an update \
                 keeps the old ones unless given \"attach\": []), or to a group whose ports the operator exposes"
            ),
        ));
    }
    if attachments.is_empty() {
        return Err(ApiError::unprocessable(
            "attachment_required",
            format!(
                "host group '{group}' shares its ports between tenants: give --attach port=…[,vlan=…][,dst=…] \
                 (API: \"attach\": [\"port=0,vlan=100\"]) to say which of its traffic is this deployment's \
                 (exposed ports: {list})"
            ),
        ));
    }
    sluice_traffic::outside_ports(attachments)
        .map_err(|reason| ApiError::unprocessable("attachment_side", format!("attachments: {reason}")))?;
    for a in attachments {
        for port in std::iter::once(a.port).chain(a.out) {
            if !exposed.contains(&port) {
                return Err(ApiError::unprocessable(
                    "port_not_exposed",
                    format!("attachment '{a}': port {port} is not exposed in host group '{group}' (exposed: {list})"),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses outside attachments for a chain that is not linear: only a
/// linear chain has a reverse order for replies to run.
pub(crate) fn check_reverse(attachments: &[Attachment], nfs: &[NfPlacement]) -> Result<(), ApiError> {
    if attachments.iter().all(|a| a.side.is_inside()) {
        return Ok(());
    }
    let linear = nfs
        .iter()
        .enumerate()
        .all(|(i, n)| n.labels.is_empty() && n.next.as_deref() == nfs.get(i + 1).map(|m| m.name.as_str()));
    if linear {
        return Ok(());
    }
    Err(ApiError::unprocessable(
        "attachment_side",
        "an outside attachment runs the chain in reverse, and only a linear chain (no labels, each NF's next \
         the one after it) has a reverse: attach replies to a deployment of their own, or make the chain linear",
    ))
}

fn config_text(v: Option<serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(other) => other.to_string(),
    }
}

/// The most memory one NF of a deployment in `group` may ask for, MiB, and
/// what sets it (for the error): the gateway's own pool slot, or the
/// smallest slot a live host of the group reports in its heartbeats.
fn memory_ceiling(st: &AppState, group: &str) -> (u64, String) {
    let mut ceiling =
        (st.runtime.config().max_memory_bytes >> 20, " (the hosts' memory slot per instance)".to_string());
    let silence = st.silence();
    for h in st.hosts() {
        let hb = &h.heartbeat;
        if hb.group == group && h.alive(silence) && hb.memory_slot_mb > 0 && hb.memory_slot_mb < ceiling.0 {
            ceiling = (
                hb.memory_slot_mb,
                format!(
                    " (the smallest memory slot of host group '{group}': host '{}' has {} MiB)",
                    hb.host, hb.memory_slot_mb
                ),
            );
        }
    }
    ceiling
}

pub(crate) fn limits_spec(
    l: LimitsIn,
    nf: &str,
    memory: &(u64, String),
    max_state_mb: u64,
) -> Result<NfLimitsSpec, ApiError> {
    let invalid = |message: String| ApiError::unprocessable("invalid_limit", message);
    if let Some(p) = &l.failure_policy
        && p != "fail-open"
        && p != "fail-closed"
    {
        return Err(invalid(format!("NF '{nf}': failure_policy '{p}' must be fail-open or fail-closed")));
    }
    let check = |field: &str, v: Option<u64>, lo: u64, hi: u64, what: &str| match v {
        Some(v) if !(lo..=hi).contains(&v) => {
            Err(invalid(format!("NF '{nf}': {field} must be {lo}-{hi}{what}, not {v}")))
        }
        _ => Ok(()),
    };
    check("deadline_ms", l.deadline_ms, 1, 1000, "")?;
    check("memory_mb", l.memory_mb, 1, memory.0, &memory.1)?;
    check("start_deadline_ms", l.start_deadline_ms, 1, 30_000, "")?;
    check("fuel", l.fuel, 0, 1_000_000_000_000, " (0: unlimited)")?;
    check("max_flows", l.max_flows, 1, 1 << 24, "")?;
    check("max_flow_state_bytes", l.max_flow_state_bytes, 1, 65_536, "")?;
    check("state_budget_mb", l.state_budget_mb, 1, max_state_mb, " (the gateway's max-state-budget-mb)")?;
    check("log_lines_per_second", l.log_lines_per_second, 0, 10_000, "")?;
    let log_lines_per_second = l
        .log_lines_per_second
        .map(u32::try_from)
        .transpose()
        .map_err(|_| invalid(format!("NF '{nf}': log_lines_per_second must be 0-10000")))?;
    Ok(NfLimitsSpec {
        failure_policy: l.failure_policy,
        deadline_ms: l.deadline_ms,
        memory_mb: l.memory_mb,
        start_deadline_ms: l.start_deadline_ms,
        fuel: l.fuel,
        max_flows: l.max_flows,
        max_flow_state_bytes: l.max_flow_state_bytes,
        state_budget_mb: l.state_budget_mb,
        log_lines_per_second,
    })
}

/// Resolves a request into the chain hosts will run, checking every module
/// reference, name and route, and starting every NF once with its config
/// (so a config the NF rejects is refused here, not on the hosts).
pub(crate) async fn resolve(
    st: &AppState,
    tenant: &Tenant,
    req: &DeploymentIn,
    group: &str,
) -> Result<(Vec<NfPlacement>, Vec<String>), ApiError> {
    let memory = memory_ceiling(st, group);
    let nfs_in: Vec<NfIn> = match (&req.module, &req.nfs) {
        (Some(m), None) => vec![NfIn {
            name: None,
            module: m.clone(),
            config: req.config.clone(),
            next: None,
            labels: BTreeMap::new(),
            limits: req.limits.clone().unwrap_or_default(),
        }],
        (None, Some(n)) if !n.is_empty() => {
            if req.config.is_some() || req.limits.is_some() {
                return Err(ApiError::bad_request("with 'nfs', give config and limits per NF"));
            }
            n.clone()
        }
        (None, _) => return Err(ApiError::bad_request("give 'module' (one NF) or a non-empty 'nfs' (a chain)")),
        (Some(_), Some(_)) => return Err(ApiError::bad_request("give either 'module' or 'nfs', not both")),
    };
    if nfs_in.len() > 16 {
        return Err(ApiError::bad_request("a chain may have at most 16 NFs"));
    }
    for nf in &nfs_in {
        let size = nf.config.as_ref().map_or(0, |c| match c {
            serde_json::Value::String(s) => s.len(),
            other => other.to_string().len(),
        });
        if size > MAX_CONFIG_BYTES {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "config_too_large",
                format!(
                    "the config of NF '{}' is {size} bytes; an NF's config may be at most {MAX_CONFIG_BYTES} bytes (keep large data in state or a module)",
                    nf.name.as_deref().unwrap_or(&nf.module)
                ),
            ));
        }
    }
    let mut placements = Vec::new();
    let mut module_ids = Vec::new();
    for nf in &nfs_in {
        let m = st.store.module(&tenant.id, &nf.module)?.ok_or_else(|| ApiError::not_found("module", &nf.module))?;
        let name = nf.name.clone().unwrap_or_else(|| m.name.clone());
        check_name("NF name", &name)?;
        if placements.iter().any(|p: &NfPlacement| p.name == name) {
            return Err(ApiError::bad_request(format!("two NFs are named '{name}'; give each a distinct 'name'")));
        }
        module_ids.push(m.id.clone());
        placements.push(NfPlacement {
            name: name.clone(),
            module: ModuleRef {
                id: m.id,
                name: m.name,
                version: m.version,
                digest: m.digest,
                size: u64::try_from(m.size).unwrap_or(0),
            },
            config: config_text(nf.config.clone()),
            next: nf.next.clone(),
            labels: nf.labels.clone(),
            limits: limits_spec(nf.limits.clone(), &name, &memory, st.config.max_state_budget_mb)?,
        });
    }
    // Without explicit routes, a chain is linear.
    if nfs_in.iter().all(|n| n.next.is_none() && n.labels.is_empty()) {
        let names: Vec<String> = placements.iter().map(|p| p.name.clone()).collect();
        for (p, next) in placements.iter_mut().zip(names.iter().skip(1)) {
            p.next = Some(next.clone());
        }
    }
    let index = |to: &str| {
        placements
            .iter()
            .position(|p| p.name == to)
            .ok_or_else(|| ApiError::bad_request(format!("a route names NF '{to}', which is not in the chain")))
    };
    let mut routes = Vec::new();
    for p in &placements {
        let mut labels = Vec::new();
        for (l, to) in &p.labels {
            labels.push((*l, index(to)?));
        }
        routes.push(Routes { next: p.next.as_deref().map(index).transpose()?, labels });
    }
    let names: Vec<&str> = placements.iter().map(|p| p.name.as_str()).collect();
    sluice_runtime::check_routes(&names, &routes).map_err(ApiError::bad_request)?;
    let size = serde_json::to_vec(&placements).map_err(ApiError::internal)?.len();
    if size > MAX_DEPLOYMENT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "deployment_too_large",
            format!("the chain encodes to {size} bytes; a deployment may be at most {MAX_DEPLOYMENT_BYTES} bytes"),
        ));
    }
    trial_start(st, &placements, routes).await?;
    Ok((placements, module_ids))
}

async fn trial_start(st: &AppState, placements: &[NfPlacement], routes: Vec<Routes>) -> Result<(), ApiError> {
    let mut blobs = Vec::new();
    for p in placements {
        let bytes = tokio::fs::read(st.blob_path(&p.module.digest))
            .await
            .map_err(|e| ApiError::internal(format!("module blob {} is missing: {e}", p.module.digest)))?;
        blobs.push(bytes);
    }
    let runtime = st.runtime.clone();
    let placements = placements.to_vec();
    let _compile = st.compiles.clone().acquire_owned().await.map_err(ApiError::internal)?;
    tokio::task::spawn_blocking(move || -> Result<(), ApiError> {
        let mut specs = Vec::new();
        for (p, bytes) in placements.iter().zip(&blobs) {
            let module = runtime
                .load(&p.name, bytes)
                .map_err(|e| ApiError::unprocessable("invalid_component", e.to_string()))?;
            let mut limits = NfLimits { deadline: Duration::from_secs(1), ..NfLimits::default() };
            // Told at deploy time when its own start deadline is too short.
            if let Some(ms) = p.limits.start_deadline_ms {
                limits.start_deadline = Duration::from_millis(ms);
            }
            if p.limits.failure_policy.as_deref() == Some("fail-open") {
                limits.failure_policy = FailurePolicy::FailOpen;
            }
            if let Some(mb) = p.limits.memory_mb {
                limits.memory_bytes = mb << 20;
            }
            specs.push(NfSpec { module, config: p.config.as_bytes().to_vec().into(), limits, owner: None });
        }
        match Chain::with_routes(&runtime, &specs, routes) {
            Ok(_) => Ok(()),
            Err(e @ RuntimeError::ConfigRejected { .. }) => {
                Err(ApiError::unprocessable("config_rejected", e.to_string()))
            }
            Err(e) => Err(ApiError::unprocessable("start_failed", e.to_string())),
        }
    })
    .await
    .map_err(ApiError::internal)?
}

/// The most bytes of one NF's config: it travels to every host of the
/// group with the deployment, and is handed to `init` whole.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// The most bytes of a deployment's encoded chain (one NATS message,
/// under any server's `max_payload`, 1 MiB by default).
pub const MAX_DEPLOYMENT_BYTES: usize = 512 * 1024;
