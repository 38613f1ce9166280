//! What a worker has written to keys of a single-writer table that
//! another worker owns, until the owner publishes them: counter deltas
//! ([`Deltas`]) and byte values ([`Put`]), and what a reader sees of a key
//! with them on top ([`Seen`]).

use super::{Change, UNSENT, Value};
use crate::entry::add_delta;
use std::fmt::Debug;

/// What a worker has written to a key another worker owns, until the
/// owner publishes it: writes handed over are tagged with the take of the
/// owner's inbox that applies them; the last may not be handed over yet.
pub(crate) trait Writes: Debug + Default + Send + Sync + 'static {
    /// Whether the last write is not handed over yet.
    fn unsent(&self) -> bool;

    /// What a reader sees of a key whose published value is `base` (as of
    /// take `published`) with these writes on top: `None` when removed or
    /// absent.
    fn seen<'a>(&'a self, base: Option<&'a Value>, published: u64) -> Option<Seen<'a>>;

    /// Hands the unsent write over in take `take`: the change the owner
    /// applies.
    fn hand_over(&mut self, take: u64) -> Change;

    /// Forgets the writes published by take `published`; whether any are
    /// left.
    fn forget(&mut self, published: u64) -> bool;
}

/// A counter's deltas: those handed over by take (take 0: a free slot) and
/// the one not handed over yet. Every hand-over between two takes of the
/// owner adds to one delta, and an owner publishes a take before it takes
/// the next, so at most two takes of a key are unpublished at a time.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    flight: [(u64, i64); 2],
    unsent: Option<i64>,
}

impl Deltas {
    pub(super) fn add(&mut self, d: i64) {
        self.unsent = Some(self.unsent.unwrap_or(0).saturating_add(d));
    }

    /// `base` plus the deltas not published by take `published`.
    pub(super) fn sum(&self, base: u64, published: u64) -> u64 {
        let flight = self.flight.iter().filter(|(take, _)| *take > published).map(|(_, d)| *d);
        flight.chain(self.unsent).fold(base, add_delta)
    }
}

impl Writes for Deltas {
    fn unsent(&self) -> bool {
        self.unsent.is_some()
    }

    fn seen<'a>(&'a self, base: Option<&'a Value>, published: u64) -> Option<Seen<'a>> {
        if self.unsent.is_none() && self.flight.iter().all(|(take, _)| *take <= published) {
            return base.map(Seen::of);
        }
        Some(Seen::Counter(self.sum(base.map_or(0, Value::counter), published)))
    }

    fn hand_over(&mut self, take: u64) -> Change {
        let d = self.unsent.take().unwrap_or(0);
        // The slot of this take, else a free one, else the older one (two
        // takes in flight is the most there can be).
        let slot = match self.flight.iter().position(|(t, _)| *t == take) {
            Some(i) => i,
            None => self
                .flight
                .iter()
                .position(|(t, _)| *t == 0)
                .unwrap_or_else(|| usize::from(self.flight.first().map(|f| f.0) > self.flight.get(1).map(|f| f.0))),
        };
        if let Some(f) = self.flight.get_mut(slot) {
            *f = if f.0 == take { (take, f.1.saturating_add(d)) } else { (take, d) };
        }
        Change::Add(d)
    }

    fn forget(&mut self, published: u64) -> bool {
        for f in &mut self.flight {
            if f.0 <= published {
                *f = (0, 0);
            }
        }
        self.unsent.is_some() || self.flight.iter().any(|(take, _)| *take != 0)
    }
}

/// A byte key's last value written (`None`: removed) and its take
/// ([`UNSENT`] until it is handed over).
#[derive(Debug, Default)]
pub(crate) struct Put {
    pub(super) value: Option<Box<[u8]>>,
    pub(super) take: u64,
}

impl Writes for Put {
    fn unsent(&self) -> bool {
        self.take == UNSENT
    }

    fn seen<'a>(&'a self, base: Option<&'a Value>, published: u64) -> Option<Seen<'a>> {
        if self.take > published { self.value.as_deref().map(Seen::Bytes) } else { base.map(Seen::of) }
    }

    fn hand_over(&mut self, take: u64) -> Change {
        self.take = take;
        Change::Put(self.value.as_deref().map(<[u8]>::to_vec).unwrap_or_default())
    }

    fn forget(&mut self, published: u64) -> bool {
        self.take > published
    }
}

/// A value as a scan sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Seen<'a> {
    Counter(u64),
    Bytes(&'a [u8]),
}

impl<'a> Seen<'a> {
    pub(super) fn of(v: &'a Value) -> Self {
        match v {
            Value::Counter(c) => Seen::Counter(*c),
            Value::Bytes(b) => Seen::Bytes(b),
        }
    }
}
