//! Turns between lanes: what waits for room to send is handed out round robin
//! across lanes, in arrival order within each.
//!
//! The notify side puts each approval card in the lane of the agent (and
//! bridge) that asked, and everything else in one shared lane, so an agent
//! that queued a thousand cards delays the others' by at most one card per
//! turn, never by its whole queue.
//!
//! Invariants:
//! - Within a lane, order is arrival order.
//! - A lane that becomes non-empty takes its turn after every lane already
//!   waiting; a lane that was served goes to the back while it still holds
//!   items. So each waiting lane is served once per round.
//! - The one exception to both: an item put back ([`Lanes::push_front`]),
//!   handed out and not started, goes first in its lane and its lane first.

use std::collections::{HashMap, VecDeque};

/// Items waiting in named lanes, handed out one lane at a time.
#[derive(Debug)]
pub(super) struct Lanes<T> {
    lanes: HashMap<String, VecDeque<T>>,
    /// Non-empty lanes, in the order of their next turn.
    turns: VecDeque<String>,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Lanes {
            lanes: HashMap::new(),
            turns: VecDeque::new(),
        }
    }
}

impl<T> Lanes<T> {
    /// Adds `item` at the back of `lane`.
    pub(super) fn push(&mut self, lane: &str, item: T) {
        // A lane held only while non-empty: one found has its turn already
        // (and its name needs no copy, which every push made before).
        if let Some(queue) = self.lanes.get_mut(lane) {
            return queue.push_back(item);
        }
        self.lanes.insert(lane.to_string(), VecDeque::from([item]));
        self.turns.push_back(lane.to_string());
    }

    /// The item [`Self::pop`] would hand out next.
    pub(super) fn peek(&self) -> Option<&T> {
        let lane = self.turns.front()?;
        self.lanes.get(lane)?.front()
    }

    /// Puts `item` back at the front of `lane`, and that lane first in turn:
    /// what was handed out and could not go yet goes next.
    pub(super) fn push_front(&mut self, lane: &str, item: T) {
        let queue = self.lanes.entry(lane.to_string()).or_default();
        queue.push_front(item);
        self.turns.retain(|l| l != lane);
        self.turns.push_front(lane.to_string());
    }

    /// The first item of the lane whose turn it is.
    pub(super) fn pop(&mut self) -> Option<T> {
        let lane = self.turns.pop_front()?;
        let queue = self.lanes.get_mut(&lane)?;
        let item = queue.pop_front();
        if queue.is_empty() {
            self.lanes.remove(&lane);
        } else {
            self.turns.push_back(lane);
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::Lanes;

    fn drain(l: &mut Lanes<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| l.pop()).collect()
    }

    /// A flood in one lane delays another lane's item by one turn, not by the
    /// flood; each lane keeps its own order.
    #[test]
    fn a_flood_waits_its_turn() {
        let mut l = Lanes::default();
        for item in ["a1", "a2", "a3", "a4"] {
            l.push("ann", item);
        }
        l.push("bob", "b1");
        l.push("", "plain");
        l.push("bob", "b2");
        assert_eq!(drain(&mut l), ["a1", "b1", "plain", "a2", "b2", "a3", "a4"]);
        assert_eq!(l.pop(), None);
    }

    /// What is put back goes first, before the lane whose turn it was.
    #[test]
    fn what_is_put_back_goes_next() {
        let mut l = Lanes::default();
        l.push("ann", "a1");
        l.push("", "p2");
        l.push("", "p3");
        assert_eq!(l.peek(), Some(&"a1"));
        assert_eq!(l.pop(), Some("a1"));
        assert_eq!(l.pop(), Some("p2"));
        l.push("ann", "a2");
        l.push_front("", "p2");
        assert_eq!(l.peek(), Some(&"p2"));
        assert_eq!(drain(&mut l), ["p2", "a2", "p3"]);
    }

    /// A lane that empties and fills again queues behind those waiting.
    #[test]
    fn a_lane_that_returns_takes_the_next_free_turn() {
        let mut l = Lanes::default();
        l.push("ann", "a1");
        l.push("bob", "b1");
        assert_eq!(l.pop(), Some("a1"));
        l.push("ann", "a2");
        l.push("cid", "c1");
        assert_eq!(drain(&mut l), ["b1", "a2", "c1"]);
        assert_eq!(l.pop(), None);
    }
}
