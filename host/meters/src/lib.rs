//! What an NF did, counted: one set of counters from the host's instance
//! to the tenant's bill.
//!
//! [`Meters`] is the only definition of the counters. An instance counts
//! into one on every `process` call; a worker's chain, a host's workers, a
//! meter window ([`Meters::since`]), a meter record on the bus, the
//! agent's journal, the gateway's rows and its usage answers are all
//! `Meters`, summed with [`Meters::add`]. The list of counters is written
//! once, in the [`meters!`] invocation below: the struct's fields, their
//! JSON names, the gateway's SQL columns ([`Meters::COLUMNS`]) and the
//! conversions to and from a row of numbers ([`Meters::values`],
//! [`Meters::from_values`]) all come from it, so adding a counter is one
//! line here and one migration.
//!
//! Nothing is sampled: the sums equal what the host processed.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Declares [`Meters`] from its counters (summed over time: a window's
/// value is the difference of two readings) and gauges (a level at the
/// reading: a window's value is the latest). A counter marked `: work`
/// counts work that makes a meter record (see [`Meters::is_empty`]).
macro_rules! meters {
    (
        counters { $( $(#[$cattr:meta])* $counter:ident $(: $work:ident)?, )* }
        gauges { $( $(#[$gattr:meta])* $gauge:ident, )* }
    ) => {
        /// The meters of one NF: of one instance, of a chain stage summed
        /// over workers, of a meter window, or of a usage row summed over
        /// windows and hosts.
        ///
        /// Every field reads 0 when absent from JSON, so a record written
        /// before a counter existed reads as "none counted".
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub struct Meters {
            $( $(#[$cattr])* #[serde(default)] pub $counter: u64, )*
            $( $(#[$gattr])* #[serde(default)] pub $gauge: u64, )*
            /// Traps by cause (`deadline exceeded`, `out of memory`, ...);
            /// sums to `traps`.
            #[serde(default)]
            pub trap_causes: BTreeMap<String, u64>,
        }

        impl Meters {
            /// The names of the counters and then the gauges, in the order
            /// of [`values`](Self::values): the JSON field names, and the
            /// gateway's SQL column names.
            pub const COLUMNS: &'static [&'static str] =
                &[ $( stringify!($counter), )* $( stringify!($gauge), )* ];

            /// The first [`COUNTERS`](Self::COUNTERS) of
            /// [`COLUMNS`](Self::COLUMNS): the counters, which sum over
            /// time.
            pub const COUNTER_COLUMNS: &'static [&'static str] = &[ $( stringify!($counter), )* ];

            /// How many of [`COLUMNS`](Self::COLUMNS) are counters (the
            /// rest are gauges).
            pub const COUNTERS: usize = Self::COUNTER_COLUMNS.len();

            /// Adds another set of meters of the same time (another
            /// worker's or host's): counters, gauges (the state held on
            /// several workers or hosts is their sum) and traps by cause.
            /// Saturates. For a later window, see
            /// [`add_later`](Self::add_later).
            pub fn add(&mut self, o: &Meters) {
                $( self.$counter = self.$counter.saturating_add(o.$counter); )*
                $( self.$gauge = self.$gauge.saturating_add(o.$gauge); )*
                for (cause, n) in &o.trap_causes {
                    let c = self.trap_causes.entry(cause.clone()).or_default();
                    *c = c.saturating_add(*n);
                }
            }

            /// Adds a later window of the same NF: counters and traps by
            /// cause sum, the gauges become the later window's (the state
            /// held now, not a sum over time). Saturates.
            pub fn add_later(&mut self, later: &Meters) {
                $( self.$counter = self.$counter.saturating_add(later.$counter); )*
                $( self.$gauge = later.$gauge; )*
                for (cause, n) in &later.trap_causes {
                    let c = self.trap_causes.entry(cause.clone()).or_default();
                    *c = c.saturating_add(*n);
                }
            }

            /// What was counted since `base` (an earlier reading of these
            /// meters): every counter's difference, traps by cause
            /// included; the gauges as they are now.
            pub fn since(&self, base: &Meters) -> Meters {
                Meters {
                    $( $counter: self.$counter.saturating_sub(base.$counter), )*
                    $( $gauge: self.$gauge, )*
                    trap_causes: self.trap_causes_since(base),
                }
            }

            /// Whether a window did no work that makes a meter record: none
            /// of the counters marked `: work` in the list (calls, packets,
            /// guest time, state and table operations, traps, errors,
            /// events, state held over time) moved. (An instance created,
            /// its tables declared or log lines dropped while no packet came
            /// make none.)
            pub fn is_empty(&self) -> bool {
                true $( $( && { let _ = stringify!($work); self.$counter == 0 } )? )*
            }

            /// The counters and gauges in the order of
            /// [`COLUMNS`](Self::COLUMNS).
            pub fn values(&self) -> Vec<u64> {
                vec![ $( self.$counter, )* $( self.$gauge, )* ]
            }

            /// Meters from numbers in the order of [`COLUMNS`](Self::COLUMNS)
            /// (missing ones read 0, extra ones are ignored), no traps by
            /// cause.
            pub fn from_values(values: &[u64]) -> Meters {
                let mut it = values.iter().copied();
                Meters {
                    $( $counter: it.next().unwrap_or(0), )*
                    $( $gauge: it.next().unwrap_or(0), )*
                    trap_causes: BTreeMap::new(),
                }
            }
        }
    };
}

meters! {
    counters {
        /// `process` calls (one per batch).
        invocations: work,
        /// Packets handed to the NF.
        packets: work,
        /// Bytes handed to the NF (captured bytes).
        bytes: work,
        /// Nanoseconds spent inside the guest (wall time of the calls on a
        /// dedicated worker thread).
        cpu_ns: work,
        /// Traps (panic, deadline, out of memory, stack overflow, ...).
        traps: work,
        /// Batches the NF refused with `err(...)` or answered malformed.
        errors: work,
        /// Of `packets`: those of batches the NF failed, which got its
        /// failure policy (forwarded under fail-open, dropped under
        /// fail-closed). (Run reports of hosts from before read
        /// `policy_packets`.)
        #[serde(alias = "policy_packets")]
        policy: work,
        /// Of `packets`: those the NF forwarded (to a port or the next NF)
        /// or labelled.
        forwarded: work,
        /// Of `packets`: those the NF dropped.
        dropped: work,
        /// Of the forwarded packets: those the NF rewrote.
        rewritten: work,
        /// Per-flow state lookups and updates the host did for the NF.
        /// (Meter records of hosts from before `table_ops` was recorded
        /// count the table operations here too.)
        state_ops: work,
        /// Per-flow state sets refused (value too large, or table full).
        state_rejected,
        /// Calls into the `state` import (`sluice:nf@0.2.0` tables).
        table_calls,
        /// Keys and resources those calls read or wrote.
        table_ops: work,
        /// State calls that returned an error to the NF.
        table_errors,
        /// Table items refused for capacity, memory budget, size or an
        /// exhausted pool.
        table_rejected,
        /// Table entries removed for idleness.
        table_expired,
        /// Events emitted.
        events: work,
        /// Log lines dropped by the rate limit.
        log_dropped,
        /// Instances created (1 + re-creations after traps).
        instantiations,
        /// State held over time: bytes of the NF's tables and per-flow
        /// state (keys + values + a fixed per-entry overhead) times the
        /// milliseconds they were held, sampled once per batch or
        /// heartbeat by the host's agent (0 in an instance's own meters).
        /// Divide by 3.6e15 for GB-hours.
        state_byte_ms: work,
        /// Packets that passed under the NF's flow offload entries: decided
        /// by the host without a call (not in `packets`).
        offloaded_packets: work,
        /// Their bytes on the wire.
        offloaded_bytes: work,
        /// Returns of ended offload entries dropped because the NF kept
        /// more than 65,536 untaken.
        offload_returns_dropped,
    }
    gauges {
        /// Bytes of table state held at the latest batch, charged against
        /// the NF's state budget. (Meter records of hosts from before the
        /// split read `state_bytes`: all the state held.)
        #[serde(alias = "state_bytes")]
        table_bytes,
        /// Bytes of per-flow state held at the latest batch, charged
        /// against the same state budget as the tables.
        flow_state_bytes,
    }
}

impl Meters {
    /// Counts one trap of this cause.
    pub fn count_trap(&mut self, cause: impl std::fmt::Display) {
        self.traps = self.traps.saturating_add(1);
        let c = self.trap_causes.entry(cause.to_string()).or_default();
        *c = c.saturating_add(1);
    }

    /// Bytes of state held (tables and per-flow state) at the latest
    /// reading.
    pub fn state_bytes(&self) -> u64 {
        self.table_bytes.saturating_add(self.flow_state_bytes)
    }

    /// State operations of both kinds: per-flow state and tables.
    pub fn all_state_ops(&self) -> u64 {
        self.state_ops.saturating_add(self.table_ops)
    }

    /// State items refused, of both kinds.
    pub fn all_state_rejected(&self) -> u64 {
        self.state_rejected.saturating_add(self.table_rejected)
    }

    /// Traps by cause since `base` (an earlier reading of these meters).
    pub fn trap_causes_since(&self, base: &Meters) -> BTreeMap<String, u64> {
        self.trap_causes
            .iter()
            .filter_map(|(k, v)| {
                let d = v.saturating_sub(base.trap_causes.get(k).copied().unwrap_or(0));
                (d > 0).then(|| (k.clone(), d))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_meters() -> impl Strategy<Value = Meters> {
        (proptest::collection::vec(0u64..1 << 40, Meters::COLUMNS.len()), 0u64..5).prop_map(|(v, traps)| {
            let mut m = Meters::from_values(&v);
            m.traps = 0;
            m.trap_causes.clear();
            for _ in 0..traps {
                m.count_trap("deadline exceeded");
            }
            m
        })
    }

    #[test]
    fn columns_name_every_counter_and_gauge_once() {
        let json = serde_json::to_value(Meters::default()).unwrap();
        let fields: Vec<&str> =
            json.as_object().unwrap().keys().map(String::as_str).filter(|k| *k != "trap_causes").collect();
        let mut cols = Meters::COLUMNS.to_vec();
        cols.sort_unstable();
        let mut fields = fields;
        fields.sort_unstable();
        assert_eq!(cols, fields);
        assert!(Meters::COUNTERS < Meters::COLUMNS.len());
    }

    #[test]
    fn old_names_still_read() {
        let m: Meters = serde_json::from_str(r#"{"packets": 3, "policy_packets": 2, "state_bytes": 9}"#).unwrap();
        assert_eq!((m.packets, m.policy, m.table_bytes, m.invocations), (3, 2, 9, 0));
    }

    #[test]
    fn an_instance_that_only_started_makes_no_record() {
        let started = Meters { instantiations: 1, table_calls: 2, log_dropped: 3, ..Default::default() };
        assert!(started.is_empty());
        assert!(!Meters { state_byte_ms: 1, ..Default::default() }.is_empty());
        assert!(!Meters { table_ops: 1, ..Default::default() }.is_empty());
    }

    #[test]
    fn every_counter_but_the_bookkeeping_ones_makes_a_record() {
        let bookkeeping = [
            "state_rejected",
            "table_calls",
            "table_errors",
            "table_rejected",
            "table_expired",
            "log_dropped",
            "instantiations",
            "offload_returns_dropped",
        ];
        for (i, name) in Meters::COUNTER_COLUMNS.iter().enumerate() {
            let mut values = vec![0; Meters::COLUMNS.len()];
            values[i] = 1;
            assert_eq!(Meters::from_values(&values).is_empty(), bookkeeping.contains(name), "{name}");
        }
        // Gauges are levels, not work.
        let gauges = vec![1; Meters::COLUMNS.len()];
        assert!(
            Meters::from_values(&[&vec![0; Meters::COUNTERS][..], &gauges[Meters::COUNTERS..]].concat()).is_empty()
        );
    }

    proptest! {
        #[test]
        fn values_round_trip(m in arb_meters()) {
            let mut back = Meters::from_values(&m.values());
            back.trap_causes = m.trap_causes.clone();
            prop_assert_eq!(back, m);
        }

        #[test]
        fn a_window_added_to_its_base_gives_the_reading(base in arb_meters(), d in arb_meters()) {
            let mut now = base.clone();
            now.add(&d);
            let mut w = now.since(&base);
            // Gauges are levels, not sums: the window reports the latest.
            w.table_bytes = d.table_bytes;
            w.flow_state_bytes = d.flow_state_bytes;
            prop_assert_eq!(w, d);
        }

        #[test]
        fn a_later_window_sums_counters_and_keeps_its_gauges(a in arb_meters(), b in arb_meters()) {
            let mut t = a.clone();
            t.add_later(&b);
            let mut sum = a.clone();
            sum.add(&b);
            prop_assert_eq!(t.packets, sum.packets);
            prop_assert_eq!(t.trap_causes, sum.trap_causes);
            prop_assert_eq!((t.table_bytes, t.flow_state_bytes), (b.table_bytes, b.flow_state_bytes));
        }

        #[test]
        fn json_round_trips(m in arb_meters()) {
            let back: Meters = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
            prop_assert_eq!(back, m);
        }
    }
}
