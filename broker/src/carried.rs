//! What an ingest carried to the inbox, and the position per channel it saves
//! with each message (the platform's message ids or timestamps, ordered):
//! shared by every ingest that catches up on a channel's history after a
//! restart (Discord, Slack).
//!
//! Pure: no Redis, no platform.
//!
//! Invariants:
//! - A message is carried once per process: [`Carried::has`] answers for the
//!   last [`Carried::KEPT`] carried, which covers a catch-up racing live
//!   delivery of the same messages.
//! - A saved position only moves forward, and only past messages carried:
//!   while a channel is caught up, a live message there waits (in `live`)
//!   rather than moving the position past older ones not carried yet;
//!   [`Carried::caught_up`] lets it count.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::hash::Hash;

/// Carried messages and positions, by channel `C` and position `P`.
#[derive(Debug)]
pub struct Carried<C, P> {
    ids: HashSet<(C, P)>,
    order: VecDeque<(C, P)>,
    /// The position saved per channel: everything up to it was carried.
    last: BTreeMap<C, P>,
    /// Channels being caught up, and the newest live message heard there.
    catching: HashSet<C>,
    live: BTreeMap<C, P>,
}

impl<C, P> Default for Carried<C, P> {
    fn default() -> Self {
        Carried {
            ids: HashSet::new(),
            order: VecDeque::new(),
            last: BTreeMap::new(),
            catching: HashSet::new(),
            live: BTreeMap::new(),
        }
    }
}

impl<C: Ord + Hash + Clone, P: Ord + Hash + Clone> Carried<C, P> {
    /// How many carried messages are remembered.
    pub const KEPT: usize = 10_000;

    /// Whether message `at` of `channel` was carried (recently).
    pub fn has(&self, channel: &C, at: &P) -> bool {
        self.ids.contains(&(channel.clone(), at.clone()))
    }

    /// Notes message `at` of `channel` carried (live, or by catch-up).
    pub fn note(&mut self, channel: &C, at: &P, caught_up: bool) {
        let id = (channel.clone(), at.clone());
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        if self.order.len() > Self::KEPT {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        match self.moves(channel, caught_up) {
            true => bump(&mut self.last, channel, at),
            false => bump(&mut self.live, channel, at),
        }
    }

    /// The positions to save with message `at` of `channel`, carried.
    pub fn positions_after(&self, channel: &C, at: &P, caught_up: bool) -> BTreeMap<C, P> {
        let mut last = self.last.clone();
        if self.moves(channel, caught_up) {
            bump(&mut last, channel, at);
        }
        last
    }

    /// The positions to save now.
    pub fn positions(&self) -> &BTreeMap<C, P> {
        &self.last
    }

    /// Starts a catch-up from the positions saved before (`stored`): each
    /// listened channel with one is caught up from it; one without (a first
    /// start, a channel added) starts at `now`, so what comes after is
    /// caught up next time. Positions of channels no longer listened are
    /// dropped: one listened again later starts then, not weeks back.
    pub fn resume(&mut self, stored: &BTreeMap<C, P>, listened: &[C], now: &P) {
        for (channel, at) in stored.iter().filter(|(c, _)| listened.contains(c)) {
            bump(&mut self.last, channel, at);
        }
        for channel in listened {
            match stored.contains_key(channel) {
                true => {
                    self.catching.insert(channel.clone());
                }
                false => bump(&mut self.last, channel, now),
            }
        }
    }

    /// `channel` is not listened after all (a stored DM channel Discord says
    /// is not one): its position is dropped, as [`Carried::resume`] drops
    /// those of channels no longer listened.
    pub fn forget(&mut self, channel: &C) {
        self.last.remove(channel);
        self.catching.remove(channel);
        self.live.remove(channel);
    }

    /// `channel` is caught up (or given up on): live messages count again.
    pub fn caught_up(&mut self, channel: &C) {
        self.catching.remove(channel);
        if let Some(live) = self.live.remove(channel) {
            bump(&mut self.last, channel, &live);
        }
    }

    /// Whether carrying a message of `channel` moves its saved position.
    fn moves(&self, channel: &C, caught_up: bool) -> bool {
        caught_up || !self.catching.contains(channel)
    }
}

/// Moves `channel`'s position in `map` forward to `at` (never back).
fn bump<C: Ord + Clone, P: Ord + Clone>(map: &mut BTreeMap<C, P>, channel: &C, at: &P) {
    match map.get_mut(channel) {
        Some(was) if *was >= *at => {}
        Some(was) => *was = at.clone(),
        None => {
            map.insert(channel.clone(), at.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live message during a channel's catch-up waits; once caught up, the
    /// position takes it; positions never go back; a message is carried once.
    #[test]
    fn positions_move_only_past_what_was_carried() {
        let mut c: Carried<u64, u64> = Carried::default();
        c.resume(&BTreeMap::from([(1, 10), (3, 7)]), &[1, 2], &100);
        assert_eq!(
            c.positions(),
            &BTreeMap::from([(1, 10), (2, 100)]),
            "a channel no longer listened is dropped"
        );
        c.note(&1, &50, false);
        assert_eq!(c.positions()[&1], 10, "live, while caught up: waits");
        assert_eq!(c.positions_after(&1, &20, true)[&1], 20);
        c.note(&1, &20, true);
        assert!(c.has(&1, &20) && c.has(&1, &50) && !c.has(&2, &20));
        c.caught_up(&1);
        assert_eq!(c.positions()[&1], 50);
        c.note(&1, &30, true);
        assert_eq!(c.positions()[&1], 50, "never back");
    }
}
