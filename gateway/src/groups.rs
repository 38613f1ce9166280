//! The group controller: membership of each host group from heartbeats,
//! the group's demand, how many hosts it should have, and its versioned
//! flow-ownership table ([`sluice_group::OwnershipTable`]) on the bus.
//!
//! Every [`TICK`], for each group:
//!
//! - a member is **gone** when not heard from for `host-silence-ms`,
//!   **draining** when the operator drained it (it stays registered and
//!   heard, and owns no flows), else a candidate;
//! - the **demand** is an EWMA (time constant [`DEMAND_TAU`]) of the
//!   packets per second the group's hosts report processing each
//!   heartbeat, from their per-deployment packet meters;
//! - with a `target-load`, the controller **proposes** the fewest hosts
//!   whose declared capacities, loaded to the target, cover the demand,
//!   within `min-hosts..=max-hosts`; without one, every candidate is used
//!   (within `max-hosts`). Candidates beyond the proposal wait as
//!   **standby**; when the proposal grows, standbys become **active** at
//!   once, and when it shrinks, the last active hosts become standby after
//!   the proposal stayed lower for [`SCALE_DOWN_AFTER`] (no flapping; a
//!   lowered `max-hosts` applies at once);
//! - when the active hosts or their capacities change (or which hosts are
//!   up without owning slots, which may finish their flowlets), a new
//!   table version is built over them, weighted by capacity, and
//!   published.
//!
//! Right after the gateway starts it has not heard every host yet: for one
//! silence period it adopts the published table and changes nothing.
//!
//! The [`Controller`] holds only what a pass needs (the store, the bus,
//! the hosts heard from); the HTTP side of groups is `api::groups`.

use crate::model::{HostSeen, SeenHosts};
use crate::store::Store;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_control::Bus;
use sluice_group::{DEFAULT_SLOTS, MAX_MEMBERS, Member, OwnershipTable};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::ToSchema;

pub use crate::model::GroupSettings;

/// How often the controller looks at every group.
pub const TICK: Duration = Duration::from_millis(250);
/// How long a lower proposal must hold before active hosts stand by.
pub const SCALE_DOWN_AFTER: Duration = Duration::from_secs(10);
/// Time constant of the demand EWMA.
pub const DEMAND_TAU: Duration = Duration::from_secs(5);
/// Tables are published again this often (a wiped bucket is refilled).
const REPUBLISH_EVERY: Duration = Duration::from_secs(10);
/// Preference order per slot: owner and two next owners.
const DEPTH: usize = 3;

/// Where a member stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MemberState {
    /// In the ownership table.
    Active,
    /// Up, not in the table: taken when the group needs more capacity.
    Standby,
    /// Drained by the operator: up, owns no flows.
    Draining,
    /// Not heard from within the silence bound.
    Gone,
}

/// One member of a group.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MemberOut {
    /// Host id.
    pub host: String,
    /// Where it stands.
    pub state: MemberState,
    /// Marked drained by the operator.
    pub drained: bool,
    /// Declared capacity, packets per second (the gateway's default when
    /// the host declares none).
    pub capacity_pps: u64,
    /// Packets per second it reported processing.
    pub load_pps: u64,
    /// Its share of the table's slots (0-1).
    pub share: f64,
    /// Ms since its last heartbeat (none: never heard from).
    pub last_seen_ms_ago: Option<u64>,
    /// The table version it last reported reading.
    pub table_version: Option<u64>,
}

/// A group as the controller sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GroupOut {
    /// Group name.
    pub group: String,
    /// Version of the published ownership table (0: none yet).
    pub table_version: u64,
    /// When that table was made, ms since the epoch.
    pub table_made_ms: Option<u64>,
    /// Slots of the table.
    pub slots: usize,
    /// Hosts per slot's preference order.
    pub depth: usize,
    /// Slots whose owner changed with the latest version.
    pub moved_slots: usize,
    /// Demand: EWMA of the group's processed packets per second.
    pub demand_pps: u64,
    /// Packets per second the members reported, summed.
    pub load_pps: u64,
    /// Declared capacity of the active members, summed.
    pub capacity_pps: u64,
    /// Hosts in the table.
    pub active_hosts: usize,
    /// Hosts the controller proposes for the demand and settings (may be
    /// more than are up: add hosts to reach it).
    pub proposed_hosts: usize,
    /// The operator's settings.
    pub settings: GroupSettings,
    /// Every member, by host id.
    pub members: Vec<MemberOut>,
}

/// A member as one tick sees it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub host: String,
    pub alive: bool,
    pub drained: bool,
    pub capacity_pps: u64,
    pub load_pps: u64,
    pub last_seen_ms_ago: Option<u64>,
    pub table_version: Option<u64>,
}

/// What the controller keeps per group between ticks.
#[derive(Debug, Default)]
struct GroupRun {
    table: Option<Arc<OwnershipTable>>,
    /// Whether `table` is on the bus.
    published: bool,
    published_at: Option<Instant>,
    moved_slots: usize,
    demand: f64,
    demand_at: Option<Instant>,
    low_since: Option<Instant>,
    proposed: usize,
    members: Vec<Seen>,
    settings: GroupSettings,
    /// Whether the published table was looked for (after a restart).
    adopted: bool,
}

/// The controller's state, shared with the API.
#[derive(Debug)]
pub struct Groups {
    started: Instant,
    runs: Mutex<HashMap<String, GroupRun>>,
}

impl Default for Groups {
    fn default() -> Self {
        Groups { started: Instant::now(), runs: Mutex::default() }
    }
}

/// The decision of one tick for one group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// Hosts to make the table of (sorted by id), with their weights.
    pub active: Vec<Member>,
    /// Proposed host count.
    pub proposed: usize,
    /// When the proposal first fell below the active count.
    pub low_since: Option<Instant>,
}

/// Decides the active hosts of a group: pure, for tests.
pub(crate) fn plan(
    members: &[Seen],
    current: &BTreeSet<String>,
    settings: &GroupSettings,
    demand_pps: f64,
    low_since: Option<Instant>,
    now: Instant,
) -> Plan {
    // Candidates: active ones first (kept), then standbys, each by id.
    let mut candidates: Vec<&Seen> = members.iter().filter(|m| m.alive && !m.drained).collect();
    candidates.sort_by(|a, b| (!current.contains(&a.host), &a.host).cmp(&(!current.contains(&b.host), &b.host)));
    let min = settings.min_hosts as usize;
    let max = settings.max_hosts.map_or(MAX_MEMBERS, |m| m as usize).min(MAX_MEMBERS);
    let proposed = match settings.target_load {
        None => candidates.len(),
        Some(target) => {
            let need = demand_pps / target;
            let mut have = 0.0;
            let mut k = 0usize;
            for c in &candidates {
                if k > 0 && have >= need {
                    break;
                }
                have += c.capacity_pps as f64;
                k += 1;
            }
            // Short of capacity: as many more as the average host covers.
            if have < need {
                let avg = if k > 0 { have / k as f64 } else { 0.0 };
                if avg > 0.0 {
                    k += ((need - have) / avg).ceil() as usize;
                }
            }
            k.max(1)
        }
    }
    .clamp(min.min(max), max);
    let up = candidates.len();
    let kept_active = candidates.iter().filter(|c| current.contains(&c.host)).count();
    let mut want = proposed.min(up);
    let mut low = None;
    // A cap applies at once; a lower demand only once it has held.
    let floor = kept_active.min(max);
    if want < floor {
        let since = low_since.unwrap_or(now);
        if now.duration_since(since) < SCALE_DOWN_AFTER {
            want = floor;
            low = Some(since);
        }
    }
    let mut active: Vec<Member> =
        candidates.iter().take(want).map(|c| Member { host: c.host.clone(), weight: c.capacity_pps.max(1) }).collect();
    active.sort_by(|a, b| a.host.cmp(&b.host));
    Plan { active, proposed, low_since: low }
}

impl Groups {
    fn runs(&self) -> parking_lot::MutexGuard<'_, HashMap<String, GroupRun>> {
        self.runs.lock()
    }

    /// The published table of `group`, if any.
    pub fn table(&self, group: &str) -> Option<Arc<OwnershipTable>> {
        self.runs().get(group).and_then(|r| r.table.clone())
    }

    /// Every group the controller knows, by name.
    pub fn list(&self) -> Vec<GroupOut> {
        let runs = self.runs();
        let mut out: Vec<GroupOut> = runs.iter().map(|(g, r)| view(g, r)).collect();
        out.sort_by(|a, b| a.group.cmp(&b.group));
        out
    }
}

fn view(group: &str, r: &GroupRun) -> GroupOut {
    let shares: HashMap<String, f64> = r.table.as_ref().map(|t| t.shares().into_iter().collect()).unwrap_or_default();
    let active: BTreeSet<&str> =
        r.table.as_ref().map(|t| t.members().iter().map(|m| m.host.as_str()).collect()).unwrap_or_default();
    let members: Vec<MemberOut> = r
        .members
        .iter()
        .map(|m| MemberOut {
            host: m.host.clone(),
            state: if !m.alive {
                MemberState::Gone
            } else if m.drained {
                MemberState::Draining
            } else if active.contains(m.host.as_str()) {
                MemberState::Active
            } else {
                MemberState::Standby
            },
            drained: m.drained,
            capacity_pps: m.capacity_pps,
            load_pps: m.load_pps,
            share: shares.get(&m.host).copied().unwrap_or(0.0),
            last_seen_ms_ago: m.last_seen_ms_ago,
            table_version: m.table_version,
        })
        .collect();
    GroupOut {
        group: group.to_string(),
        table_version: r.table.as_ref().map_or(0, |t| t.version()),
        table_made_ms: r.table.as_ref().map(|t| t.made_ms()),
        slots: r.table.as_ref().map_or(0, |t| t.slots()),
        depth: r.table.as_ref().map_or(0, |t| t.depth()),
        moved_slots: r.moved_slots,
        demand_pps: r.demand.max(0.0) as u64,
        load_pps: r.members.iter().filter(|m| m.alive).map(|m| m.load_pps).sum(),
        capacity_pps: r.table.as_ref().map_or(0, |t| t.members().iter().map(|m| m.weight).sum()),
        active_hosts: active.len(),
        proposed_hosts: r.proposed,
        settings: r.settings,
        members,
    }
}

/// What the group controller works with, and nothing more: the store
/// (registered hosts, drain marks, settings, table versions), the bus its
/// tables go on, the hosts heard from, and its own state between ticks.
#[derive(Clone)]
pub struct Controller {
    /// Metadata.
    pub store: Arc<Store>,
    /// Where ownership tables are published (and read back after a restart).
    pub bus: Arc<dyn Bus>,
    /// The hosts heard from, as heartbeats arrive.
    pub hosts: SeenHosts,
    /// The controller's state between ticks, which the API shows.
    pub groups: Arc<Groups>,
    /// How long a host may stay silent before it is gone (`host-silence-ms`).
    pub silence: Duration,
    /// The capacity of a host that declares none, packets per second.
    pub default_capacity_pps: u64,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("silence", &self.silence).finish_non_exhaustive()
    }
}

impl Controller {
    /// The members of every group as heard now: registered hosts (a group's
    /// members are the hosts registered to it) and, on a bus without
    /// registration (`sluice dev`), the hosts heard from.
    fn members_now(&self) -> Result<BTreeMap<String, Vec<Seen>>, String> {
        let silence = self.silence;
        let default_capacity = self.default_capacity_pps;
        let registered = self.store.registered_hosts().map_err(|e| e.to_string())?;
        let drained = self.store.drained_hosts().map_err(|e| e.to_string())?;
        let heard: HashMap<String, HostSeen> =
            self.hosts.read().values().map(|h| (h.heartbeat.host.clone(), h.clone())).collect();
        let seen = |host: &str, h: Option<&HostSeen>| Seen {
            host: host.to_string(),
            alive: h.is_some_and(|h| h.alive(silence)),
            drained: drained.contains(host),
            capacity_pps: h.map(|h| h.heartbeat.capacity_pps).filter(|c| *c > 0).unwrap_or(default_capacity),
            load_pps: h.map_or(0, |h| h.heartbeat.load_pps),
            last_seen_ms_ago: h.map(|h| u64::try_from(h.at.elapsed().as_millis()).unwrap_or(u64::MAX)),
            table_version: h.and_then(|h| h.heartbeat.table_version),
        };
        let mut groups: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
        for r in registered.iter().filter(|r| !r.dispatcher) {
            groups.entry(r.group.clone()).or_default().push(seen(&r.id, heard.get(&r.id)));
        }
        if registered.iter().all(|r| r.dispatcher) {
            for (host, h) in &heard {
                groups.entry(h.heartbeat.group.clone()).or_default().push(seen(host, Some(h)));
            }
        }
        for v in groups.values_mut() {
            v.sort_by(|a, b| a.host.cmp(&b.host));
        }
        Ok(groups)
    }

    /// One pass over every group.
    pub async fn step(&self) -> Result<(), String> {
        let c = self.clone();
        let (mut groups, settings) = tokio::task::spawn_blocking(move || {
            let m = c.members_now()?;
            let s = c.store.group_settings().map_err(|e| e.to_string())?;
            Ok::<_, String>((m, s))
        })
        .await
        .map_err(|e| e.to_string())??;
        // Groups with settings, and groups with a table whose hosts were all
        // removed (they get an empty table, not a stale one).
        for g in settings.keys() {
            groups.entry(g.clone()).or_default();
        }
        let known: Vec<String> = self.groups.runs().keys().cloned().collect();
        for g in known {
            groups.entry(g).or_default();
        }
        let now = Instant::now();
        let settled = self.groups.started.elapsed() >= self.silence;
        for (group, members) in groups {
            let settings = settings.get(&group).copied().unwrap_or_default();
            // After a restart, the published table is the starting point.
            let adopt = !self.groups.runs().get(&group).is_some_and(|r| r.adopted);
            let adopted = if adopt {
                match self.bus.ownership(&group).await {
                    Ok(t) => Some(t.map(Arc::new)),
                    Err(e) => {
                        // Not knowing the published table, building one could
                        // go back on its version: try again next pass.
                        tracing::warn!(group, "reading the published ownership table: {e}; trying again");
                        continue;
                    }
                }
            } else {
                None
            };
            let (build, republish) = {
                let mut runs = self.groups.runs();
                let run = runs.entry(group.clone()).or_default();
                if let Some(adopted) = adopted {
                    run.adopted = true;
                    if let Some(t) = adopted {
                        tracing::info!(group, version = t.version(), "adopted the published ownership table");
                        run.table = Some(t);
                        run.published = true;
                        run.published_at = Some(now);
                    }
                }
                // Demand: EWMA of the reported load.
                let load: u64 = members.iter().filter(|m| m.alive).map(|m| m.load_pps).sum();
                let alpha = match run.demand_at {
                    Some(at) => 1.0 - (-now.duration_since(at).as_secs_f64() / DEMAND_TAU.as_secs_f64()).exp(),
                    None => 1.0,
                };
                run.demand += alpha * (load as f64 - run.demand);
                run.demand_at = Some(now);
                let current: BTreeSet<String> = run
                    .table
                    .as_ref()
                    .map(|t| t.members().iter().map(|m| m.host.clone()).collect())
                    .unwrap_or_default();
                let p = plan(&members, &current, &settings, run.demand, run.low_since, now);
                run.proposed = p.proposed;
                run.low_since = p.low_since;
                run.members = members;
                run.settings = settings;
                // Up but owning no slots: they finish their flowlets.
                let finishing: Vec<String> = run
                    .members
                    .iter()
                    .filter(|m| m.alive && !p.active.iter().any(|a| a.host == m.host))
                    .map(|m| m.host.clone())
                    .collect();
                let changed = run
                    .table
                    .as_ref()
                    .is_none_or(|t| t.members() != p.active.as_slice() || t.finishing() != finishing.as_slice());
                let build = (changed && settled).then_some((p.active, finishing));
                let republish = run.table.clone().filter(|_| {
                    !run.published || run.published_at.is_none_or(|at| now.duration_since(at) >= REPUBLISH_EVERY)
                });
                (build, republish)
            };
            if let Some((active, finishing)) = build {
                self.publish_new(&group, active, finishing).await?;
            } else if let Some(t) = republish {
                let ok = self.bus.set_ownership(&t).await;
                let mut runs = self.groups.runs();
                if let Some(run) = runs.get_mut(&group) {
                    run.published = ok.is_ok();
                    run.published_at = Some(now);
                }
                ok.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Builds and publishes the next version of `group`'s table.
    async fn publish_new(&self, group: &str, active: Vec<Member>, finishing: Vec<String>) -> Result<(), String> {
        let previous = self.groups.table(group);
        let store = self.store.clone();
        let g = group.to_string();
        let after = previous.as_ref().map_or(0, |t| t.version());
        let table = tokio::task::spawn_blocking(move || {
            let version = store.next_table_version(&g, after).map_err(|e| e.to_string())?;
            OwnershipTable::build(&g, version, sluice_control::now_ms(), &active, DEFAULT_SLOTS, DEPTH)
                .map(|t| t.with_finishing(&finishing))
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        let moved = previous.as_ref().map_or(table.slots(), |p| table.moved_from(p));
        let hosts: Vec<&str> = table.members().iter().map(|m| m.host.as_str()).collect();
        tracing::info!(group, version = table.version(), ?hosts, moved_slots = moved, "new flow-ownership table");
        let result = self.bus.set_ownership(&table).await;
        let mut runs = self.groups.runs();
        if let Some(run) = runs.get_mut(group) {
            run.table = Some(Arc::new(table));
            run.moved_slots = moved;
            run.published = result.is_ok();
            run.published_at = Some(Instant::now());
        }
        result.map_err(|e| format!("publishing group {group}'s ownership table: {e}"))
    }
}

/// Runs the controller forever, a pass every [`TICK`].
pub async fn control(controller: Controller) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = controller.step().await {
            tracing::warn!("group controller: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
