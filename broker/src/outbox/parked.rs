//! The parked entries one outbox worker knows of: by approval id, by
//! deadline, and the sweep's round robin over them.
//!
//! Pure: no Redis; time is passed in (unix seconds from the service's clock).
//!
//! Invariants:
//! - An id is parked at most once; tracking it again replaces its entry and
//!   its deadline.
//! - A deadline wakes the loop only while its entry waits for a decision:
//!   [`ParkedIndex::decided`] drops it and keeps the entry (its send is under
//!   way or deferred), [`ParkedIndex::untrack`] drops both.
//! - The sweep reads again only what may have changed unseen: entries
//!   *watched* (a card not yet known shown, or a wake-up that announced a
//!   change without saying what: [`RECHECK`]), a slice at a time, and a
//!   small blind slice of every parked entry (a forged write wakes no one).
//!   An entry stops being watched when a read finds it shown, or when every
//!   surface whose card it waited for said so. So an idle outbox whose cards
//!   are all shown reads two records per sweep, whatever the number parked.
//! - Each round is a cursor (the last id visited, in id order), not a copy
//!   of the ids: a copy would hold about 70 bytes per parked entry for the
//!   whole round, hours long at 100,000 parked. An id parked during a round
//!   joins it when it sorts after the cursor.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use super::source::SourceId;

/// One parked entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Parked {
    pub source: SourceId,
    pub entry_id: EntryId,
    /// Unix seconds; 0 for none.
    pub expires_at: u64,
    /// Why the sweep reads its record again: a bit per surface whose card
    /// is not known shown (its place in the bridge's list of surfaces), and
    /// [`RECHECK`]. 0: nothing to look for.
    watch: u16,
}

/// A watch bit: something changed that only a read of the record tells (a
/// card a read found unshown, a moved deadline, the second read an
/// announcement asks for, a surface past the first fourteen).
pub(super) const RECHECK: u16 = 1 << 15;

/// A watch bit: a decider or an editor announced a change it was about to
/// make. The change may land just after a read, so the announcement holds
/// for two reads, a sweep apart.
pub(super) const ANNOUNCED: u16 = 1 << 14;

/// The surfaces' bits.
const SURFACES: u16 = !(RECHECK | ANNOUNCED);

/// The watch bit of the surface at `place` in the bridge's list of surfaces.
pub(super) fn surface_bit(place: usize) -> u16 {
    match place {
        0..14 => 1 << place,
        _ => RECHECK,
    }
}

/// A stream entry id, kept as its two numbers when it has the `ms-seq` form
/// every Redis stream id has: no allocation per parked entry (a string
/// would cost about 40 bytes more of each of 100,000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EntryId {
    Numbers(u64, u64),
    Other(Box<str>),
}

impl EntryId {
    pub fn new(id: String) -> EntryId {
        match super::parking::stream_id(&id) {
            // Only when it reads back the same ("01-0" would not).
            Some((ms, seq)) if format!("{ms}-{seq}") == id => EntryId::Numbers(ms, seq),
            _ => EntryId::Other(id.into_boxed_str()),
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryId::Numbers(ms, seq) => write!(f, "{ms}-{seq}"),
            EntryId::Other(id) => f.write_str(id),
        }
    }
}

/// An approval id as the index keeps it: every id the outbox derives is a
/// UUID in its canonical text, kept as its 16 bytes beside the entry (a
/// string would cost about 50 bytes more of each of 100,000). Any other
/// text is kept as it is. Keys sort as their ids' text within each kind,
/// UUIDs before any other; only the sweep's cursors rely on the order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Key {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Key {
    fn new(id: &str) -> Key {
        let Ok(uuid) = uuid::Uuid::try_parse(id) else {
            return Key::Other(id.into());
        };
        // Only when it reads back the same (upper case would not).
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        match uuid.hyphenated().encode_lower(&mut text) == id {
            true => Key::Uuid(uuid.into_bytes()),
            false => Key::Other(id.into()),
        }
    }

    fn id(&self) -> String {
        match self {
            Key::Uuid(bytes) => uuid::Uuid::from_bytes(*bytes).to_string(),
            Key::Other(id) => id.to_string(),
        }
    }
}

/// One time per id (unix seconds), in time order, each taken out once due.
#[derive(Debug, Default)]
struct Timers {
    by_time: BTreeSet<(u64, Key)>,
    /// Each id's, to drop it without a scan.
    of: HashMap<Key, u64>,
}

impl Timers {
    fn set(&mut self, id: &str, at: u64) {
        self.forget(id);
        let key = Key::new(id);
        self.by_time.insert((at, key.clone()));
        self.of.insert(key, at);
    }

    fn forget(&mut self, id: &str) {
        let key = Key::new(id);
        if let Some(at) = self.of.remove(&key) {
            self.by_time.remove(&(at, key));
        }
    }

    fn first(&self) -> Option<u64> {
        self.by_time.first().map(|(t, _)| *t)
    }

    fn due(&mut self, now: f64, most: usize) -> Vec<String> {
        let due: Vec<(u64, Key)> = self
            .by_time
            .iter()
            .take_while(|(t, _)| (*t as f64) <= now)
            .take(most)
            .cloned()
            .collect();
        for (at, key) in &due {
            self.by_time.remove(&(*at, key.clone()));
            self.of.remove(key);
        }
        due.into_iter().map(|(_, key)| key.id()).collect()
    }
}

#[derive(Debug, Default)]
pub(super) struct ParkedIndex {
    /// In id order, for the sweep's cursor.
    parked: BTreeMap<Key, Parked>,
    deadlines: BTreeSet<(u64, Key)>,
    /// Reminders due, each once (`approval.remind_after`).
    reminders: Timers,
    /// The next escalation step due of each (`approval.escalate`).
    escalations: Timers,
    /// The last id the blind slice re-read this round (None: a round begins).
    swept_to: Option<Key>,
    /// How many entries are watched (their `watch` not 0).
    watching: usize,
    /// The last watched id the sweep re-read this round.
    watched_to: Option<Key>,
}

impl ParkedIndex {
    /// Tracks parked `id`, watched for `watch` (see [`Parked`]).
    pub fn track(
        &mut self,
        id: String,
        source: SourceId,
        entry_id: String,
        expires_at: u64,
        watch: u16,
    ) {
        // Tracked again (a moved deadline, a retry): its reminder stays, and
        // so does an announcement not yet read twice.
        let mut watch = watch;
        let id = Key::new(&id);
        if let Some(p) = self.parked.remove(&id) {
            self.deadlines.remove(&(p.expires_at, id.clone()));
            self.watching -= (p.watch != 0) as usize;
            watch |= p.watch & (RECHECK | ANNOUNCED);
        }
        if expires_at != 0 {
            self.deadlines.insert((expires_at, id.clone()));
        }
        let parked = Parked {
            source,
            entry_id: EntryId::new(entry_id),
            expires_at,
            watch,
        };
        self.watching += (watch != 0) as usize;
        self.parked.insert(id, parked);
    }

    pub fn untrack(&mut self, id: &str) {
        let key = Key::new(id);
        if let Some(p) = self.parked.remove(&key) {
            self.deadlines.remove(&(p.expires_at, key));
            self.watching -= (p.watch != 0) as usize;
        }
        self.reminders.forget(id);
        self.escalations.forget(id);
    }

    /// Reminds the approvers of parked `id` at `at` (once; a later call
    /// replaces it).
    pub fn remind(&mut self, id: &str, at: u64) {
        if self.contains(id) {
            self.reminders.set(id, at);
        }
    }

    /// At most `most` ids whose reminder is due at `now`, earliest first,
    /// taken out.
    pub fn due_reminders(&mut self, now: f64, most: usize) -> Vec<String> {
        self.reminders.due(now, most)
    }

    /// Takes parked `id`'s next escalation step at `at` (a later call
    /// replaces it).
    pub fn escalate(&mut self, id: &str, at: u64) {
        if self.contains(id) {
            self.escalations.set(id, at);
        }
    }

    /// At most `most` ids whose next escalation step is due at `now`,
    /// earliest first, taken out.
    pub fn due_escalations(&mut self, now: f64, most: usize) -> Vec<String> {
        self.escalations.due(now, most)
    }

    /// Changes what parked `id` is watched for (nothing if not parked).
    fn rewatch(&mut self, id: &str, change: impl FnOnce(u16) -> u16) {
        if let Some(p) = self.parked.get_mut(&Key::new(id)) {
            let before = p.watch != 0;
            p.watch = change(p.watch);
            match (before, p.watch != 0) {
                (false, true) => self.watching += 1,
                (true, false) => self.watching -= 1,
                _ => {}
            }
        }
    }

    /// Watches `id` for the cards of `bits` (new cards written).
    pub fn watch(&mut self, id: &str, bits: u16) {
        self.rewatch(id, |w| w | bits);
    }

    /// A change to `id` was announced: read at the next two sweeps.
    pub fn announce(&mut self, id: &str) {
        self.rewatch(id, |w| w | ANNOUNCED | RECHECK);
    }

    /// The surfaces of `bits` said they showed `id`'s card (a read that
    /// is due stays due).
    pub fn shown(&mut self, id: &str, bits: u16) {
        self.rewatch(id, |w| w & !(bits & SURFACES));
    }

    /// A read of `id`'s record found it pending and every card shown
    /// (`shown`), or not: then it is read again at the next sweeps. An
    /// announcement's first read is always followed by a second.
    pub fn read_back(&mut self, id: &str, shown: bool) {
        self.rewatch(id, |w| match (w & ANNOUNCED != 0, shown) {
            (true, _) => (w & !ANNOUNCED) | RECHECK,
            (false, true) => 0,
            (false, false) => w | RECHECK,
        });
    }

    /// How many parked entries are watched.
    #[cfg(test)]
    pub fn watching(&self) -> usize {
        self.watching
    }

    /// Nothing to watch for any more (the record was read decided).
    pub fn unwatch(&mut self, id: &str) {
        self.rewatch(id, |_| 0);
    }

    /// Decided: its deadline no longer wakes the loop, nor does a card
    /// still unshown matter; the entry stays.
    pub fn decided(&mut self, id: &str) {
        let key = Key::new(id);
        if let Some(p) = self.parked.get(&key) {
            self.deadlines.remove(&(p.expires_at, key));
        }
        self.rewatch(id, |_| 0);
        self.reminders.forget(id);
        self.escalations.forget(id);
    }

    pub fn get(&self, id: &str) -> Option<&Parked> {
        self.parked.get(&Key::new(id))
    }

    /// Every id tracked, in id order.
    pub fn ids(&self) -> impl Iterator<Item = String> + '_ {
        self.parked.keys().map(Key::id)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.parked.contains_key(&Key::new(id))
    }

    pub fn len(&self) -> usize {
        self.parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// The earliest deadline still waiting for a decision, reminder or
    /// escalation step.
    pub fn next_deadline(&self) -> Option<u64> {
        let deadline = self.deadlines.first().map(|(t, _)| *t);
        deadline
            .into_iter()
            .chain(self.reminders.first())
            .chain(self.escalations.first())
            .min()
    }

    /// Ids whose deadline is at or before `now`, earliest first (not removed:
    /// settling them decides).
    pub fn due(&self, now: f64) -> Vec<String> {
        self.deadlines
            .iter()
            .take_while(|(t, _)| (*t as f64) <= now)
            .map(|(_, key)| key.id())
            .collect()
    }

    /// The sweep's next slice of at most `n` watched ids, round robin (the
    /// round wraps around within the slice); none when none is watched.
    pub fn watched_slice(&mut self, n: usize) -> Vec<String> {
        if self.watching == 0 {
            self.watched_to = None;
            return Vec::new();
        }
        let after = self.watched_to.take();
        let from = match &after {
            Some(id) => Bound::Excluded(id.clone()),
            None => Bound::Unbounded,
        };
        let watched = |(key, p): (&Key, &Parked)| (p.watch != 0).then(|| key.clone());
        let mut slice: Vec<Key> = self
            .parked
            .range::<Key, _>((from, Bound::Unbounded))
            .filter_map(watched)
            .take(n)
            .collect();
        if let Some(after) = after.filter(|_| slice.len() < n) {
            let head = self
                .parked
                .range::<Key, _>((Bound::Unbounded, Bound::Included(after)))
                .filter_map(watched)
                .take(n - slice.len());
            slice.extend(head);
        }
        self.watched_to = match slice.len() < n {
            true => None,
            false => slice.last().cloned(),
        };
        slice.iter().map(Key::id).collect()
    }

    /// The blind slice: the next `n` ids still parked, watched or not; a new
    /// round begins when the last one ended.
    pub fn blind_slice(&mut self, n: usize) -> Vec<String> {
        let from = |after: &Option<Key>| match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        let read = |from: Bound<Key>| -> Vec<Key> {
            self.parked
                .range::<Key, _>((from, Bound::Unbounded))
                .take(n)
                .map(|(key, _)| key.clone())
                .collect()
        };
        let mut slice = read(from(&self.swept_to));
        if slice.is_empty() && self.swept_to.is_some() {
            // Everything after the cursor went meanwhile: a new round now.
            slice = read(Bound::Unbounded);
        }
        // A short slice ends the round; the next begins from the first id.
        self.swept_to = match slice.len() < n {
            true => None,
            false => slice.last().cloned(),
        };
        slice.iter().map(Key::id).collect()
    }

    /// Whether anything is parked from `source`.
    pub fn any_from(&self, source: SourceId) -> bool {
        self.parked.values().any(|p| p.source == source)
    }

    /// The entry ids parked from `source` that sort before `oldest`, the
    /// oldest entry its stream still holds (all of them when it holds
    /// none): trimmed away. Compared in place, so a sweep allocates only
    /// for what it finds gone.
    pub fn entries_before(&self, source: SourceId, oldest: Option<(u64, u64)>) -> Vec<String> {
        let gone = |p: &&Parked| {
            p.source == source
                && match (&p.entry_id, oldest) {
                    (_, None) => true,
                    (EntryId::Numbers(ms, seq), Some(oldest)) => (*ms, *seq) < oldest,
                    (EntryId::Other(_), Some(_)) => false,
                }
        };
        let gone = self.parked.values().filter(gone);
        gone.map(|p| p.entry_id.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::source::Sources;
    use super::*;

    fn source() -> SourceId {
        let config = crate::config::Config::parse(
            "[redis]\nurl = \"redis://127.0.0.1:1\"\n[bridges.b]\ntype = \"console\"\n",
        )
        .unwrap();
        Sources::new(&config, "b").ids().next().unwrap()
    }

    /// An approval id is kept as 16 bytes only when it reads back the same,
    /// and keys sort as their ids' text does.
    #[test]
    fn keys_keep_ids_exactly_and_in_their_order() {
        // A digit against a letter: `9` < `a`, as 9 < 10.
        let low = "09c2f242-1677-8dcb-8053-51c2f136d2ec";
        let high = "0a86e8e9-f17a-8695-8c85-6612f136d2ec";
        assert!(matches!(Key::new(low), Key::Uuid(_)));
        for other in [
            "0BC2F242-1677-8DCB-8053-51C2F136D2EC",
            "0bc2f24216778dcb805351c2f136d2ec",
            "b",
        ] {
            assert!(matches!(Key::new(other), Key::Other(_)), "{other}");
            assert_eq!(Key::new(other).id(), other);
        }
        assert_eq!(Key::new(low).id(), low);
        assert!(Key::new(low) < Key::new(high));
        let mut p = ParkedIndex::default();
        p.track(high.into(), source(), "1-0".into(), 0, 0);
        p.track(low.into(), source(), "2-0".into(), 0, 0);
        assert!(p.contains(low) && !p.contains(&low.to_uppercase()));
        assert_eq!(p.blind_slice(2), [low, high]);
    }

    /// Deadlines come due in order as the clock passes them; a decided entry
    /// stays parked but no longer wakes anything; untracking drops both.
    #[test]
    fn deadlines_come_due_and_decided_ones_stop_waking() {
        let (mut p, src) = (ParkedIndex::default(), source());
        p.track("b".into(), src, "1-2".into(), 200, 0);
        p.track("a".into(), src, "1-1".into(), 100, 0);
        p.track("never".into(), src, "1-3".into(), 0, 0);
        assert_eq!(p.next_deadline(), Some(100));
        assert!(p.due(99.9).is_empty());
        assert_eq!(p.due(200.0), ["a", "b"]);
        p.decided("a");
        assert_eq!((p.next_deadline(), p.contains("a")), (Some(200), true));
        p.untrack("b");
        assert_eq!((p.next_deadline(), p.len()), (None, 2));
        p.track("never".into(), src, "1-3".into(), 300, 0);
        assert_eq!(
            p.due(1e9),
            ["never"],
            "tracking again replaces the deadline"
        );
    }

    /// A reminder wakes the loop before a later deadline, comes due once,
    /// outlives a moved deadline, and goes with a decision or an untrack.
    #[test]
    fn reminders_come_due_once() {
        let (mut p, src) = (ParkedIndex::default(), source());
        p.track("a".into(), src, "1-1".into(), 100, 0);
        p.track("b".into(), src, "1-2".into(), 100, 0);
        p.remind("a", 40);
        p.remind("b", 50);
        p.remind("nobody", 10);
        assert_eq!(p.next_deadline(), Some(40));
        p.track("a".into(), src, "1-1".into(), 200, 0);
        assert_eq!(p.due_reminders(45.0, 10), ["a"]);
        assert!(p.due_reminders(45.0, 10).is_empty(), "once");
        p.decided("b");
        assert!(p.due_reminders(1e9, 10).is_empty());
        p.remind("a", 60);
        p.track("c".into(), src, "1-3".into(), 0, 0);
        p.remind("c", 70);
        assert_eq!(p.due_reminders(1e9, 1), ["a"], "a turn's worth at a time");
        p.untrack("c");
        assert_eq!(
            (p.due_reminders(1e9, 10).len(), p.next_deadline()),
            (0, Some(200)),
            "c's reminder went with it; a's deadline stays"
        );
    }

    /// A stream id is kept as numbers and reads back as it was written;
    /// anything else is kept as written.
    #[test]
    fn entry_ids_read_back_as_written() {
        for id in [
            "1796534997471-0",
            "0-1",
            "18446744073709551615-7",
            "01-0",
            "x",
        ] {
            assert_eq!(EntryId::new(id.to_string()).to_string(), id);
        }
        assert!(matches!(EntryId::new("5-3".into()), EntryId::Numbers(5, 3)));
        assert!(matches!(EntryId::new("01-0".into()), EntryId::Other(_)));
    }

    /// A round of sweeps visits each parked id once, in slices, and skips the
    /// ids untracked meanwhile; then a new round begins.
    #[test]
    fn a_sweep_round_visits_each_id_once_in_slices() {
        let (mut p, src) = (ParkedIndex::default(), source());
        for n in 0..10 {
            p.track(format!("id{n}"), src, format!("1-{n}"), 0, 0);
        }
        let mut seen = p.blind_slice(4);
        assert_eq!(seen.len(), 4);
        let later = (0..10)
            .map(|n| format!("id{n}"))
            .find(|id| !seen.contains(id))
            .unwrap();
        p.untrack(&later);
        seen.extend(p.blind_slice(4));
        seen.extend(p.blind_slice(4));
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!((seen.len(), unique.len()), (9, 9), "{seen:?}");
        assert!(
            !seen.contains(&later),
            "an id untracked before its turn is skipped"
        );
        assert_eq!(
            p.blind_slice(100).len(),
            9,
            "a new round: every id still parked"
        );
        assert_eq!(p.entries_before(src, None).len(), 9);
        // A round whose last ids went before their turn starts again at once.
        let first = p.blind_slice(4);
        for n in 0..10 {
            let id = format!("id{n}");
            if !first.contains(&id) && id != later {
                p.untrack(&id);
            }
        }
        assert_eq!(p.blind_slice(4), first, "never an empty slice");
    }

    /// Only watched entries are read again, a slice at a time and round
    /// robin; a card shown or a read that finds every card shown ends the
    /// watch, a read that does not keeps it.
    #[test]
    fn watched_entries_are_read_until_known_shown() {
        let (mut p, src) = (ParkedIndex::default(), source());
        let (desk, hall) = (surface_bit(0), surface_bit(1));
        for n in 0..6 {
            let watch = if n % 2 == 0 { desk | hall } else { 0 };
            p.track(format!("id{n}"), src, format!("1-{n}"), 0, watch);
        }
        assert_eq!(p.watching(), 3);
        assert_eq!(p.watched_slice(2), ["id0", "id2"]);
        assert_eq!(p.watched_slice(2), ["id4", "id0"], "round robin, wrapping");
        p.shown("id0", desk);
        assert_eq!(p.watching(), 3, "hall's card is not known shown yet");
        p.shown("id0", hall);
        p.read_back("id2", true);
        p.read_back("id4", false);
        p.shown("id4", desk | hall);
        assert_eq!(p.watching(), 1, "a read that found it unshown keeps it");
        assert_eq!(p.watched_slice(64), ["id4"]);
        p.untrack("id4");
        p.watch("id1", RECHECK);
        p.watch("gone", RECHECK);
        assert_eq!(
            (p.watching(), p.watched_slice(64)),
            (1, vec!["id1".to_string()])
        );
        p.track("id1".into(), src, "1-1".into(), 0, 0);
        assert_eq!(p.watching(), 1, "tracked again, a read still due");
        p.read_back("id1", true);
        assert!(p.watched_slice(64).is_empty());
        assert_eq!(surface_bit(20), RECHECK);
        p.track("id3".into(), src, "1-3".into(), 0, desk | RECHECK);
        p.shown("id3", desk | RECHECK);
        assert_eq!(p.watching(), 1, "a shown card never ends a read due");
        p.decided("id3");
        assert_eq!(p.watching(), 0, "a decision ends every watch");
    }

    /// An announced change is read twice, a sweep apart, whatever the first
    /// read found (the change may land just after it), even across a card
    /// shown or the entry tracked again; a decision ends every watch.
    #[test]
    fn an_announcement_holds_for_two_reads() {
        let (mut p, src) = (ParkedIndex::default(), source());
        p.track("a".into(), src, "1-1".into(), 0, 0);
        p.announce("a");
        p.shown("a", surface_bit(0) | RECHECK | ANNOUNCED);
        p.track("a".into(), src, "1-1".into(), 0, 0);
        p.read_back("a", true);
        assert_eq!(p.watched_slice(64), ["a"], "read again");
        p.read_back("a", true);
        assert!(p.watched_slice(64).is_empty());
        p.announce("a");
        p.decided("a");
        assert!(p.watched_slice(64).is_empty());
    }

    /// An entry sorts before the stream's oldest by its numbers; with the
    /// stream empty every one is gone.
    #[test]
    fn entries_trimmed_away_are_found_in_place() {
        let (mut p, src) = (ParkedIndex::default(), source());
        for (id, entry) in [("a", "5-1"), ("b", "7-0"), ("c", "x")] {
            p.track(id.into(), src, entry.into(), 0, 0);
        }
        assert_eq!(p.entries_before(src, Some((7, 0))), ["5-1"]);
        assert_eq!(
            p.entries_before(src, Some((9, 9))).len(),
            2,
            "x is kept as written"
        );
        assert_eq!(p.entries_before(src, None).len(), 3);
        assert!(p.any_from(src));
    }
}
