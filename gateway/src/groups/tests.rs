//! Unit tests of the group controller: its plans, and its passes over a
//! store and an in-process bus.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
use super::*;
use crate::model::HostSeen;
use crate::store::{HostRow, Store};
use sluice_control::{Bus, Heartbeat, LocalBus};

fn seen(host: &str, capacity: u64) -> Seen {
    Seen {
        host: host.into(),
        alive: true,
        drained: false,
        capacity_pps: capacity,
        load_pps: 0,
        last_seen_ms_ago: Some(0),
        table_version: None,
    }
}

fn hosts(p: &Plan) -> Vec<&str> {
    p.active.iter().map(|m| m.host.as_str()).collect()
}

#[test]
fn without_a_target_every_live_undrained_host_is_active() {
    let mut m = vec![seen("h1", 100), seen("h2", 100), seen("h3", 100)];
    m[1].alive = false;
    m[2].drained = true;
    let p = plan(&m, &BTreeSet::new(), &GroupSettings::default(), 0.0, None, Instant::now());
    assert_eq!(hosts(&p), ["h1"]);
    let s = GroupSettings { max_hosts: Some(1), ..Default::default() };
    let m = vec![seen("h1", 100), seen("h2", 100)];
    assert_eq!(plan(&m, &BTreeSet::new(), &s, 0.0, None, Instant::now()).active.len(), 1);
}

#[test]
fn the_proposal_covers_demand_at_the_target_load() {
    let m = vec![seen("h1", 1000), seen("h2", 1000), seen("h3", 1000), seen("h4", 1000)];
    let s = GroupSettings { min_hosts: 1, max_hosts: None, target_load: Some(0.5) };
    let now = Instant::now();
    let p = plan(&m, &BTreeSet::new(), &s, 1200.0, None, now);
    assert_eq!((p.proposed, hosts(&p)), (3, vec!["h1", "h2", "h3"]));
    // More than is up: proposed beyond, all active.
    let p = plan(&m, &BTreeSet::new(), &s, 3000.0, None, now);
    assert_eq!((p.proposed, p.active.len()), (6, 4));
}

#[test]
fn scaling_down_waits_and_keeps_the_hosts_already_active() {
    let m = vec![seen("h1", 1000), seen("h2", 1000), seen("h3", 1000)];
    let s = GroupSettings { min_hosts: 1, max_hosts: None, target_load: Some(1.0) };
    let current: BTreeSet<String> = ["h2", "h3"].iter().map(|s| s.to_string()).collect();
    let t0 = Instant::now();
    let p = plan(&m, &current, &s, 100.0, None, t0);
    assert_eq!((p.proposed, hosts(&p)), (1, vec!["h2", "h3"]));
    let since = p.low_since.unwrap();
    let p = plan(&m, &current, &s, 100.0, Some(since), t0 + SCALE_DOWN_AFTER);
    assert_eq!(hosts(&p), ["h2"]);
    assert_eq!(p.low_since, None);
    // A cap does not wait.
    let s = GroupSettings { min_hosts: 1, max_hosts: Some(1), target_load: None };
    assert_eq!(hosts(&plan(&m, &current, &s, 0.0, None, t0)), ["h2"]);
}

#[test]
fn settings_are_bounded() {
    assert!(GroupSettings { min_hosts: 0, ..Default::default() }.check().is_err());
    assert!(GroupSettings { min_hosts: 3, max_hosts: Some(2), target_load: None }.check().is_err());
    assert!(GroupSettings { min_hosts: 1, max_hosts: None, target_load: Some(1.5) }.check().is_err());
    assert!(GroupSettings { min_hosts: 1, max_hosts: None, target_load: Some(f64::NAN) }.check().is_err());
    assert!(GroupSettings { min_hosts: 2, max_hosts: Some(4), target_load: Some(0.7) }.check().is_ok());
}

// ---------------------------------------------------------------- passes over a store and the in-process bus

/// The silence bound of these tests.
const SILENCE: Duration = Duration::from_secs(2);

/// A controller over a fresh database with `hosts` registered in group
/// `edge`, and the in-process bus its tables go on. It started a silence
/// period ago: it has heard every live host and may change tables.
fn controller(dir: &tempfile::TempDir, hosts: &[&str]) -> (Controller, Arc<LocalBus>) {
    let store = Arc::new(Store::open(&dir.path().join("gateway.db")).unwrap());
    let bus = Arc::new(LocalBus::new());
    let c = Controller {
        store,
        bus: bus.clone(),
        hosts: SeenHosts::default(),
        groups: Arc::new(Groups { started: Instant::now().checked_sub(SILENCE).unwrap(), runs: Mutex::default() }),
        silence: SILENCE,
        default_capacity_pps: 1000,
    };
    for h in hosts {
        register(&c, h);
    }
    (c, bus)
}

fn register(c: &Controller, host: &str) {
    let row = HostRow {
        id: host.into(),
        group: "edge".into(),
        nkey: None,
        created_ms: 0,
        dispatcher: false,
        max_pps: None,
        max_bps: None,
    };
    assert!(c.store.add_host(&row).unwrap());
}

/// `host`'s heartbeat, arrived `ago`.
fn heard(c: &Controller, host: &str, ago: Duration) {
    let heartbeat = Heartbeat {
        host: host.into(),
        group: "edge".into(),
        boot: "b".into(),
        started_ms: 0,
        sent_ms: 0,
        interval_ms: 100,
        version: "test".into(),
        deployments: Vec::new(),
        capacity_pps: 1000,
        load_pps: 0,
        table_version: None,
        memory_slot_mb: 0,
    };
    let at = Instant::now().checked_sub(ago).unwrap();
    c.hosts.write().insert(host.into(), HostSeen { heartbeat, at });
}

/// A pass, then the table on the bus, which is the one the controller keeps.
async fn pass(c: &Controller, bus: &LocalBus) -> OwnershipTable {
    c.step().await.unwrap();
    let t = bus.ownership("edge").await.unwrap().unwrap();
    assert_eq!(c.groups.table("edge").as_deref(), Some(&t));
    t
}

fn active(t: &OwnershipTable) -> Vec<&str> {
    t.members().iter().map(|m| m.host.as_str()).collect()
}

fn state_of(c: &Controller, host: &str) -> MemberState {
    let g = c.groups.list().into_iter().find(|g| g.group == "edge").unwrap();
    g.members.iter().find(|m| m.host == host).unwrap().state
}

/// Every slot the lost host owned in `before` is owned in `after` by its
/// next owner in `before`; returns the share of the other slots that moved.
fn check_handover(before: &OwnershipTable, after: &OwnershipTable, lost: &str) -> f64 {
    let mut others_moved = 0;
    for s in 0..before.slots() {
        let prefs: Vec<&str> = before.preferences(s).collect();
        if prefs[0] == lost {
            assert_eq!(after.owner_of_slot(s), Some(prefs[1]), "slot {s} of {lost} went elsewhere than its next owner");
        } else if after.owner_of_slot(s) != Some(prefs[0]) {
            others_moved += 1;
        }
    }
    others_moved as f64 / before.slots() as f64
}

#[tokio::test]
async fn a_host_silent_past_the_bound_leaves_its_groups_table() {
    let dir = tempfile::tempdir().unwrap();
    let (c, bus) = controller(&dir, &["h1", "h2", "h3"]);
    for h in ["h1", "h2", "h3"] {
        heard(&c, h, Duration::ZERO);
    }
    let t1 = pass(&c, &bus).await;
    assert_eq!(active(&t1), ["h1", "h2", "h3"]);
    // Nothing changed: no new version.
    assert_eq!(pass(&c, &bus).await.version(), t1.version());

    // Heard from within the bound: still a member.
    heard(&c, "h2", SILENCE / 2);
    assert_eq!(pass(&c, &bus).await.version(), t1.version());
    assert_eq!(state_of(&c, "h2"), MemberState::Active);

    // h2's last heartbeat is older than the silence bound: it is gone, and
    // its slots go to their next owners in a new version on the bus.
    heard(&c, "h2", SILENCE + Duration::from_millis(100));
    let t2 = pass(&c, &bus).await;
    assert!(t2.version() > t1.version());
    assert_eq!(active(&t2), ["h1", "h3"]);
    assert!(t2.finishing().is_empty(), "a gone host finishes nothing");
    assert!(check_handover(&t1, &t2, "h2") < 0.03);
    assert_eq!(state_of(&c, "h2"), MemberState::Gone);
    assert_eq!(state_of(&c, "h1"), MemberState::Active);
}

#[tokio::test]
async fn a_new_live_host_joins_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let (c, bus) = controller(&dir, &["h1", "h2"]);
    heard(&c, "h1", Duration::ZERO);
    heard(&c, "h2", Duration::ZERO);
    let t1 = pass(&c, &bus).await;
    assert_eq!(active(&t1), ["h1", "h2"]);

    // Registered but not heard from yet: not a member of the table.
    register(&c, "h3");
    assert_eq!(pass(&c, &bus).await.version(), t1.version());
    assert_eq!(state_of(&c, "h3"), MemberState::Gone);
    // A host that heartbeats without being registered is not a member.
    heard(&c, "stranger", Duration::ZERO);
    assert_eq!(pass(&c, &bus).await.version(), t1.version());

    // Its first heartbeat: it joins, with its share of the slots.
    heard(&c, "h3", Duration::ZERO);
    let t2 = pass(&c, &bus).await;
    assert!(t2.version() > t1.version());
    assert_eq!(active(&t2), ["h1", "h2", "h3"]);
    let share = t2.shares().into_iter().find(|(h, _)| h == "h3").unwrap().1;
    assert!((share - 1.0 / 3.0).abs() < 0.01, "h3 owns {share}");
    assert_eq!(state_of(&c, "h3"), MemberState::Active);
}

#[tokio::test]
async fn a_host_that_comes_back_is_added_again() {
    let dir = tempfile::tempdir().unwrap();
    let (c, bus) = controller(&dir, &["h1", "h2", "h3"]);
    for h in ["h1", "h2", "h3"] {
        heard(&c, h, Duration::ZERO);
    }
    let t1 = pass(&c, &bus).await;
    heard(&c, "h3", SILENCE * 2);
    let t2 = pass(&c, &bus).await;
    assert_eq!(active(&t2), ["h1", "h2"]);

    // Heard again: back in a new version, which is the first table again.
    heard(&c, "h3", Duration::ZERO);
    let t3 = pass(&c, &bus).await;
    assert!(t3.version() > t2.version());
    assert_eq!(t3.members(), t1.members());
    assert_eq!(t3.moved_from(&t1), 0, "the same members give the same table");
    assert_eq!(state_of(&c, "h3"), MemberState::Active);
}
