//! A revision of a deployment made ready to run: its modules compiled
//! once (for every worker that runs it), each NF's limits resolved, and
//! its chain instantiated from that.

use crate::shared::Shared;
use sluice_control::{DeploymentSpec, NfPlacement};
use sluice_runtime::{Chain, FailurePolicy, NfLimits, NfSpec, Routes};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Module bytes by digest.
pub type Blobs = HashMap<String, Arc<Vec<u8>>>;

/// A deployment's chain, compiled: its NF specs and routes, and the state
/// its NFs share across the workers that run it (eventual tables, pools).
pub type Built = (Vec<NfSpec>, Vec<Routes>, Vec<Arc<sluice_state::Domain>>);

/// A revision of a deployment with its chain compiled (once, for every
/// worker that runs it), or why it could not be.
#[derive(Clone)]
pub struct Prepared {
    /// The revision.
    pub spec: DeploymentSpec,
    /// Its chain, or why not.
    pub built: Result<Built, String>,
    /// The trace of the change that asked for it (the host's work on it
    /// joins that trace), if one is recorded.
    pub trace: Option<opentelemetry::Context>,
}

impl Prepared {
    /// Compiles `spec`'s modules (from `blobs`).
    pub fn new(shared: &Shared, spec: DeploymentSpec, blobs: &Blobs) -> Self {
        let built = build(shared, &spec, blobs).map(|(specs, routes)| {
            let domains = specs.iter().map(|_| sluice_state::Domain::for_workers(shared.workers)).collect();
            (specs, routes, domains)
        });
        Prepared { spec, built, trace: None }
    }

    /// A revision that cannot run, and why.
    pub fn failed(spec: DeploymentSpec, reason: String) -> Self {
        Prepared { spec, built: Err(reason), trace: None }
    }
}

/// An NF's limits: the host's defaults, the deployment's own, then the
/// host's caps for NFs of its name (see `AgentConfig::nf_caps`).
fn limits_for(base: &NfLimits, caps: &BTreeMap<String, NfLimits>, nf: &NfPlacement) -> Result<NfLimits, String> {
    let mut l = base.clone();
    if let Some(ms) = nf.limits.deadline_ms {
        l.deadline = Duration::from_millis(ms);
    }
    if let Some(mb) = nf.limits.memory_mb {
        l.memory_bytes = mb.saturating_mul(1 << 20);
    }
    let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    if let Some(ms) = nf.limits.start_deadline_ms {
        l.start_deadline = Duration::from_millis(ms);
    }
    if let Some(f) = nf.limits.fuel {
        l.fuel_per_batch = (f > 0).then_some(f);
    }
    if let Some(n) = nf.limits.max_flows {
        l.max_flows = usize_of(n);
    }
    if let Some(n) = nf.limits.max_flow_state_bytes {
        l.max_flow_state_bytes = usize_of(n);
    }
    if let Some(mb) = nf.limits.state_budget_mb {
        l.state_budget_bytes = usize_of(mb.saturating_mul(1 << 20));
    }
    if let Some(n) = nf.limits.log_lines_per_second {
        l.log_lines_per_second = n;
    }
    match nf.limits.failure_policy.as_deref() {
        None => {}
        Some("fail-open") => l.failure_policy = FailurePolicy::FailOpen,
        Some("fail-closed") => l.failure_policy = FailurePolicy::FailClosed,
        Some(other) => {
            return Err(format!("NF '{}': failure policy '{other}' is not fail-open or fail-closed", nf.name));
        }
    }
    Ok(match caps.get(&nf.name) {
        Some(cap) => l.at_most(cap),
        None => l,
    })
}

/// The NF specs and routes of a deployment, with modules compiled.
pub fn build(shared: &Shared, spec: &DeploymentSpec, blobs: &Blobs) -> Result<(Vec<NfSpec>, Vec<Routes>), String> {
    let index: HashMap<&str, usize> = spec.nfs.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    if index.len() != spec.nfs.len() {
        return Err("two NFs of the chain have the same name".into());
    }
    let route = |from: &str, to: &str| {
        index.get(to).copied().ok_or_else(|| format!("NF '{from}' routes to '{to}', which is not in the chain"))
    };
    let mut specs = Vec::new();
    let mut routes = Vec::new();
    for nf in &spec.nfs {
        let bytes =
            blobs.get(&nf.module.digest).ok_or_else(|| format!("module {} was not fetched", nf.module.digest))?;
        let module = shared.runtime.load(&nf.name, bytes).map_err(|e| e.to_string())?;
        specs.push(NfSpec {
            module,
            config: nf.config.as_bytes().to_vec().into(),
            limits: {
                let mut l = limits_for(&shared.limits, &shared.nf_caps, nf)?;
                if shared.live {
                    l.deadline = l.deadline.min(shared.limits.deadline);
                    // Starts run off the workers, but the agent waits for
                    // them: a start may not take longer than the host's.
                    l.start_deadline = l.start_deadline.min(shared.limits.start_deadline);
                }
                l
            },
            owner: Some(Arc::new(sluice_runtime::NfOwner {
                tenant: spec.tenant.clone(),
                deployment: spec.id.clone(),
                version: nf.module.version.clone(),
            })),
        });
        let mut labels = Vec::new();
        for (l, to) in &nf.labels {
            labels.push((*l, route(&nf.name, to)?));
        }
        routes.push(Routes { next: nf.next.as_deref().map(|to| route(&nf.name, to)).transpose()?, labels });
    }
    Ok((specs, routes))
}

/// Compiles a revision's modules off the async threads.
pub(crate) async fn prepare(shared: &Shared, spec: &DeploymentSpec, blobs: Blobs) -> Prepared {
    let (s, spec2) = (shared.clone(), spec.clone());
    let span = if tracing::Span::current().is_disabled() {
        tracing::Span::none()
    } else {
        tracing::info_span!("compile", nfs = spec.nfs.len())
    };
    match tokio::task::spawn_blocking(move || span.in_scope(|| Prepared::new(&s, spec2, &blobs))).await {
        Ok(p) => p,
        Err(e) => Prepared::failed(spec.clone(), format!("compiling the chain failed: {e}")),
    }
}

/// The chain of a prepared revision: its NFs instantiated and started,
/// running in reverse for packets of its outside attachments, seeing
/// fragmented IP as the deployment chose.
pub(crate) fn chain_of(shared: &Shared, built: &Result<Built, String>, spec: &DeploymentSpec) -> Result<Chain, String> {
    match built {
        Ok((specs, routes, domains)) => new_chain(shared, specs, routes.clone(), domains, spec),
        Err(e) => Err(e.clone()),
    }
}

pub(crate) fn new_chain(
    shared: &Shared,
    specs: &[NfSpec],
    routes: Vec<Routes>,
    domains: &[Arc<sluice_state::Domain>],
    spec: &DeploymentSpec,
) -> Result<Chain, String> {
    let mut chain = Chain::with_domains(&shared.runtime, specs, routes, domains).map_err(|e| e.to_string())?;
    apply_sides(&mut chain, spec)?;
    Ok(chain)
}

/// Sets what a deployment's spec says about its chain's traffic beyond
/// its NFs: the outside ports of its attachments, and its fragment mode.
pub(crate) fn apply_sides(chain: &mut Chain, spec: &DeploymentSpec) -> Result<(), String> {
    let outside = sluice_engine::outside_ports(&spec.attachments)?;
    chain.set_outside(&outside).map_err(|e| e.to_string())?;
    chain.set_fragment_mode(spec.fragments);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_caps_bound_what_a_deployment_asks_for() {
        let base = NfLimits::default();
        let cap = NfLimits { memory_bytes: 8 << 20, deadline: Duration::from_millis(5), ..base.clone() };
        let caps: BTreeMap<String, NfLimits> = [("fw".to_string(), cap)].into();
        let mut nf: NfPlacement = serde_json::from_value(serde_json::json!({
            "name": "fw", "module": { "id": "m", "name": "firewall", "version": "1", "digest": "x", "size": 1 }, "config": ""
        }))
        .unwrap();
        nf.limits.memory_mb = Some(128);
        nf.limits.deadline_ms = Some(100);
        let l = limits_for(&base, &caps, &nf).unwrap();
        assert_eq!(l.memory_bytes, 8 << 20);
        assert_eq!(l.deadline, Duration::from_millis(5));
        nf.name = "other".into();
        let l = limits_for(&base, &caps, &nf).unwrap();
        assert_eq!(l.memory_bytes, 128 << 20);
        assert_eq!(l.deadline, Duration::from_millis(100));
    }
}
