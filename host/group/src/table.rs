//! The flow-ownership table of a host group.
//!
//! A flow belongs to a *slot* (its symmetric 5-tuple hash scaled to the slot
//! count, so both directions of a connection share it), and each slot has a
//! preference order of hosts: its **owner**, then its **next owners**. The
//! owner column is a weighted Maglev table over the active members; the
//! next owner of a slot is the host that would own it in the table built
//! without its owner, and the one after that the owner without both. So
//! when an owner dies or is drained, the new table sends each of its slots
//! to exactly the host listed next, which is where its state was
//! replicated; slots of other hosts move only by Maglev's small
//! disruption.

use crate::maglev::{FREE, Permutation, is_prime, populate};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Slots of a table unless told otherwise: a prime well above 64 × the
/// largest group, as Maglev advises, and small enough that a table of
/// depth 3 is a 64 KiB NATS message.
pub const DEFAULT_SLOTS: usize = 16381;
/// The most slots a table may have.
pub const MAX_SLOTS: usize = 65521;
/// The most active members of one table (a member index is one byte).
pub const MAX_MEMBERS: usize = 254;
/// The most hosts a table lets finish their flowlets.
pub const MAX_FINISHING: usize = 1024;
/// The longest preference order per slot.
pub const MAX_DEPTH: usize = 3;
/// Groups larger than this get a preference order of at most 2 (owner and
/// one next owner): the third column costs a table per pair of members.
pub const DEPTH3_MAX_MEMBERS: usize = 64;
const NONE: u8 = u8::MAX;

/// Why a table cannot be built or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A member list or slot count the table cannot hold.
    #[error("ownership table of group '{group}': {reason}")]
    Invalid {
        /// The group.
        group: String,
        /// What is wrong.
        reason: String,
    },
}

/// An active member of a group and its weight (its declared capacity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Host id.
    pub host: String,
    /// Relative share of the slots (e.g. packets per second it can take).
    pub weight: u64,
}

/// A versioned flow-ownership table (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TableWire", into = "TableWire")]
pub struct OwnershipTable {
    group: String,
    version: u64,
    made_ms: u64,
    slots: usize,
    depth: usize,
    members: Vec<Member>,
    /// `slots × depth` member indices, slot-major; [`NONE`] where a slot
    /// has fewer preferences than `depth` (fewer members).
    prefs: Vec<u8>,
    /// Hosts that own no slots but are up (draining or standing by): they
    /// finish the flowlets they have.
    finishing: Vec<String>,
}

/// The published form: the preference matrix as base64.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableWire {
    group: String,
    version: u64,
    made_ms: u64,
    slots: usize,
    depth: usize,
    members: Vec<Member>,
    prefs: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    finishing: Vec<String>,
}

impl From<OwnershipTable> for TableWire {
    fn from(t: OwnershipTable) -> Self {
        TableWire {
            group: t.group,
            version: t.version,
            made_ms: t.made_ms,
            slots: t.slots,
            depth: t.depth,
            members: t.members,
            prefs: base64::engine::general_purpose::STANDARD.encode(&t.prefs),
            finishing: t.finishing,
        }
    }
}

impl TryFrom<TableWire> for OwnershipTable {
    type Error = TableError;
    fn try_from(w: TableWire) -> Result<Self, TableError> {
        let invalid = |reason: String| TableError::Invalid { group: w.group.clone(), reason };
        let prefs = base64::engine::general_purpose::STANDARD
            .decode(w.prefs.as_bytes())
            .map_err(|e| invalid(format!("preferences are not base64: {e}")))?;
        let t = OwnershipTable {
            group: w.group.clone(),
            version: w.version,
            made_ms: w.made_ms,
            slots: w.slots,
            depth: w.depth,
            members: w.members.clone(),
            prefs,
            finishing: w.finishing.clone(),
        };
        t.check().map_err(invalid)?;
        Ok(t)
    }
}

impl OwnershipTable {
    /// Builds version `version` of `group`'s table over `members` (active
    /// hosts, any order; the table lists them sorted by id) with `slots`
    /// slots (prime) and a preference order of `depth` hosts per slot
    /// (1-3; at most 2 above [`DEPTH3_MAX_MEMBERS`] members, and never more
    /// than there are members). No members: a table that owns nothing.
    pub fn build(
        group: &str,
        version: u64,
        made_ms: u64,
        members: &[Member],
        slots: usize,
        depth: usize,
    ) -> Result<Self, TableError> {
        let invalid = |reason: String| TableError::Invalid { group: group.to_string(), reason };
        if !(2..=MAX_SLOTS).contains(&slots) || !is_prime(slots) {
            return Err(invalid(format!("{slots} slots: use a prime from 2 to {MAX_SLOTS}")));
        }
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(invalid(format!("a preference order of {depth}: use 1 to {MAX_DEPTH}")));
        }
        if members.len() > MAX_MEMBERS {
            return Err(invalid(format!("{} members: at most {MAX_MEMBERS} hosts may be active", members.len())));
        }
        let mut members = members.to_vec();
        members.sort_by(|a, b| a.host.cmp(&b.host));
        if let Some(w) = members.windows(2).find(|w| w.first().map(|m| &m.host) == w.get(1).map(|m| &m.host)) {
            let host = w.first().map(|m| m.host.clone()).unwrap_or_default();
            return Err(invalid(format!("host '{host}' is listed twice")));
        }
        if let Some(m) = members.iter().find(|m| m.weight == 0) {
            return Err(invalid(format!("host '{}' has weight 0; leave it out instead", m.host)));
        }
        let n = members.len();
        let depth = depth.min(n.max(1)).min(if n > DEPTH3_MAX_MEMBERS { 2 } else { MAX_DEPTH });
        let mut prefs = vec![NONE; slots * depth];
        if n > 0 {
            let perms: Vec<Permutation> = members.iter().map(|m| Permutation::of(&m.host, slots)).collect();
            let weights: Vec<u64> = members.iter().map(|m| m.weight).collect();
            let all: Vec<u16> = (0..n as u16).collect();
            let without = |gone: &[u16]| -> Option<Vec<u16>> {
                let rest: Vec<u16> = all.iter().copied().filter(|i| !gone.contains(i)).collect();
                populate(&perms, &weights, &rest, slots)
            };
            let owners = without(&[]).ok_or_else(|| invalid("no member has a weight".into()))?;
            let mut second: HashMap<u16, Vec<u16>> = HashMap::new();
            let mut third: HashMap<(u16, u16), Vec<u16>> = HashMap::new();
            for (slot, &o) in owners.iter().enumerate() {
                let mut row = [NONE; MAX_DEPTH];
                if let Some(r) = row.get_mut(0) {
                    *r = o as u8;
                }
                if depth >= 2 {
                    let t = second.entry(o).or_insert_with(|| without(&[o]).unwrap_or_default());
                    let b = t.get(slot).copied().unwrap_or(FREE);
                    if b != FREE {
                        if let Some(r) = row.get_mut(1) {
                            *r = b as u8;
                        }
                        if depth >= 3 {
                            let key = (o.min(b), o.max(b));
                            let t = third.entry(key).or_insert_with(|| without(&[o, b]).unwrap_or_default());
                            if let (Some(&c), Some(r)) = (t.get(slot), row.get_mut(2))
                                && c != FREE
                            {
                                *r = c as u8;
                            }
                        }
                    }
                }
                if let Some(dst) = prefs.get_mut(slot * depth..(slot + 1) * depth) {
                    for (d, s) in dst.iter_mut().zip(row.iter()) {
                        *d = *s;
                    }
                }
            }
        }
        Ok(OwnershipTable {
            group: group.to_string(),
            version,
            made_ms,
            slots,
            depth,
            members,
            prefs,
            finishing: Vec::new(),
        })
    }

    /// The table with `hosts` (up, owning no slots) allowed to finish
    /// their flowlets; members and duplicates are left out, and at most
    /// [`MAX_FINISHING`] are kept.
    pub fn with_finishing(mut self, hosts: &[String]) -> Self {
        let mut f: Vec<String> =
            hosts.iter().filter(|h| !self.members.iter().any(|m| &m.host == *h)).cloned().collect();
        f.sort();
        f.dedup();
        f.truncate(MAX_FINISHING);
        self.finishing = f;
        self
    }

    /// Hosts that own no slots but finish the flowlets they have
    /// (draining or standing by).
    pub fn finishing(&self) -> &[String] {
        &self.finishing
    }

    fn check(&self) -> Result<(), String> {
        if !(2..=MAX_SLOTS).contains(&self.slots) || !(1..=MAX_DEPTH).contains(&self.depth) {
            return Err(format!("{} slots of depth {}", self.slots, self.depth));
        }
        if self.members.len() > MAX_MEMBERS || self.finishing.len() > MAX_FINISHING {
            return Err(format!("{} members, {} finishing", self.members.len(), self.finishing.len()));
        }
        if self.members.iter().map(|m| &m.host).chain(&self.finishing).any(|h| h.len() > 64) {
            return Err("a host id longer than 64 bytes".into());
        }
        if self.prefs.len() != self.slots * self.depth {
            return Err(format!("{} preferences for {} slots of depth {}", self.prefs.len(), self.slots, self.depth));
        }
        let n = self.members.len();
        for row in self.prefs.chunks(self.depth) {
            let mut seen = [false; MAX_MEMBERS];
            let mut ended = n == 0;
            for &p in row {
                if p == NONE {
                    ended = true;
                    continue;
                }
                let fresh = seen.get_mut(usize::from(p)).filter(|_| usize::from(p) < n && !ended);
                match fresh {
                    Some(s) if !*s => *s = true,
                    _ => return Err("a slot names a member twice, out of range, or after a gap".into()),
                }
            }
            if n > 0 && row.first() == Some(&NONE) {
                return Err("a slot has no owner".into());
            }
        }
        Ok(())
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The version (grows by one with each change of the group's table).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// When it was made (ms since the epoch).
    pub fn made_ms(&self) -> u64 {
        self.made_ms
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Hosts per preference order.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The active members, sorted by host id.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The slot of a flow, from its symmetric hash
    /// (`sluice_wire::FlowKey::symmetric_hash`).
    pub fn slot_of(&self, flow_hash: u64) -> usize {
        ((u128::from(flow_hash) * self.slots as u128) >> 64) as usize
    }

    /// The hosts of `slot` in preference order: owner first.
    pub fn preferences(&self, slot: usize) -> impl Iterator<Item = &str> + '_ {
        let row = self.prefs.get(slot * self.depth..(slot + 1) * self.depth).unwrap_or(&[]);
        row.iter()
            .take_while(|&&p| p != NONE)
            .filter_map(|&p| self.members.get(usize::from(p)).map(|m| m.host.as_str()))
    }

    /// The owner of `slot` (none in a table without members).
    pub fn owner_of_slot(&self, slot: usize) -> Option<&str> {
        self.preferences(slot).next()
    }

    /// The owner of a flow.
    pub fn owner(&self, flow_hash: u64) -> Option<&str> {
        self.owner_of_slot(self.slot_of(flow_hash))
    }

    /// Each member's share of the slots it owns (0 to 1), by host id.
    pub fn shares(&self) -> Vec<(String, f64)> {
        let mut count = vec![0usize; self.members.len()];
        for row in self.prefs.chunks(self.depth) {
            if let Some(c) = row.first().and_then(|&p| count.get_mut(usize::from(p))) {
                *c += 1;
            }
        }
        self.members.iter().zip(count).map(|(m, c)| (m.host.clone(), c as f64 / self.slots as f64)).collect()
    }

    /// How many slots have another owner here than in `older` (a table of
    /// the same slot count; all of them otherwise).
    pub fn moved_from(&self, older: &OwnershipTable) -> usize {
        if older.slots != self.slots {
            return self.slots;
        }
        (0..self.slots).filter(|&s| self.owner_of_slot(s) != older.owner_of_slot(s)).count()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn members(names: &[&str]) -> Vec<Member> {
        names.iter().map(|h| Member { host: h.to_string(), weight: 1000 }).collect()
    }

    fn table(names: &[&str], version: u64) -> OwnershipTable {
        OwnershipTable::build("edge", version, 0, &members(names), DEFAULT_SLOTS, 3).unwrap()
    }

    #[test]
    fn every_slot_has_distinct_preferences_and_shares_are_even() {
        let t = table(&["h1", "h2", "h3", "h4"], 1);
        for s in 0..t.slots() {
            let p: Vec<&str> = t.preferences(s).collect();
            assert_eq!(p.len(), 3);
            assert!(p[0] != p[1] && p[1] != p[2] && p[0] != p[2], "{p:?}");
        }
        for (h, share) in t.shares() {
            assert!((share - 0.25).abs() < 0.01, "{h}: {share}");
        }
    }

    #[test]
    fn a_lost_owner_s_slots_go_to_their_next_owner_and_little_else_moves() {
        let before = table(&["h1", "h2", "h3", "h4"], 1);
        let after = table(&["h1", "h3", "h4"], 2);
        let mut others_moved = 0;
        for s in 0..before.slots() {
            let p: Vec<&str> = before.preferences(s).collect();
            if p[0] == "h2" {
                assert_eq!(after.owner_of_slot(s), Some(p[1]), "slot {s}");
                // And the one after is the next owner in the new table.
                assert_eq!(after.preferences(s).nth(1), Some(p[2]), "slot {s}");
            } else if after.owner_of_slot(s) != Some(p[0]) {
                others_moved += 1;
            }
        }
        assert!(others_moved as f64 / before.slots() as f64 <= 0.03, "{others_moved} moved");
    }

    #[test]
    fn a_new_member_takes_about_its_share() {
        let before = table(&["h1", "h2", "h3"], 1);
        let after = table(&["h1", "h2", "h3", "h4"], 2);
        let moved = after.moved_from(&before) as f64 / after.slots() as f64;
        assert!((0.24..=0.28).contains(&moved), "{moved}");
    }

    #[test]
    fn weights_set_shares() {
        let m = vec![Member { host: "big".into(), weight: 3000 }, Member { host: "small".into(), weight: 1000 }];
        let t = OwnershipTable::build("g", 1, 0, &m, DEFAULT_SLOTS, 2).unwrap();
        let s: HashMap<_, _> = t.shares().into_iter().collect();
        assert!((s["big"] - 0.75).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn bad_inputs_are_refused() {
        let m = members(&["a", "a"]);
        assert!(OwnershipTable::build("g", 1, 0, &m, DEFAULT_SLOTS, 2).unwrap_err().to_string().contains("twice"));
        assert!(OwnershipTable::build("g", 1, 0, &members(&["a"]), 16383, 2).is_err());
        assert!(OwnershipTable::build("g", 1, 0, &members(&["a"]), DEFAULT_SLOTS, 4).is_err());
        let zero = vec![Member { host: "z".into(), weight: 0 }];
        assert!(OwnershipTable::build("g", 1, 0, &zero, DEFAULT_SLOTS, 2).is_err());
        let many: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("h{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(OwnershipTable::build("g", 1, 0, &members(&many), DEFAULT_SLOTS, 2).is_err());
    }

    #[test]
    fn an_empty_table_owns_nothing_and_small_groups_get_shorter_orders() {
        let t = OwnershipTable::build("g", 1, 0, &[], 13, 3).unwrap();
        assert_eq!(t.owner(42), None);
        let t = OwnershipTable::build("g", 1, 0, &members(&["a", "b"]), 13, 3).unwrap();
        assert_eq!(t.depth(), 2);
        assert!((0..13).all(|s| t.preferences(s).count() == 2));
    }

    #[test]
    fn the_published_form_round_trips_and_is_checked() {
        let t = table(&["h1", "h2", "h3"], 7);
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.len() < 70_000, "{}", json.len());
        let back: OwnershipTable = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["depth"] = 2.into();
        assert!(serde_json::from_value::<OwnershipTable>(v).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["members"] = serde_json::json!([{ "host": "h1", "weight": 1 }]);
        assert!(serde_json::from_value::<OwnershipTable>(v).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn any_group_covers_every_slot(n in 1usize..9, gone in 0usize..9, hash in proptest::num::u64::ANY) {
            let names: Vec<String> = (0..n).map(|i| format!("host-{i}")).collect();
            let m: Vec<Member> = names.iter().map(|h| Member { host: h.clone(), weight: 1 + (h.len() as u64 % 3) }).collect();
            let t = OwnershipTable::build("g", 1, 0, &m, 1021, 3).unwrap();
            proptest::prop_assert!((0..t.slots()).all(|s| t.owner_of_slot(s).is_some()));
            proptest::prop_assert!(t.owner(hash).is_some());
            // Losing a member moves its slots to their next owners.
            if n > 1 {
                let gone = &names[gone % n];
                let rest: Vec<Member> = m.iter().filter(|x| &x.host != gone).cloned().collect();
                let u = OwnershipTable::build("g", 2, 0, &rest, 1021, 3).unwrap();
                for s in 0..t.slots() {
                    let p: Vec<&str> = t.preferences(s).collect();
                    if p[0] == gone.as_str() {
                        proptest::prop_assert_eq!(u.owner_of_slot(s), Some(p[1]));
                    }
                }
            }
        }
    }
}
