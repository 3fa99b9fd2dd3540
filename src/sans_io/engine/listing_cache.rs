//! One listing of the sink per filter, shared by every job that asks it
//! while it is in use.
//!
//! Relays that hold the same repos ask for the same events, so after a
//! restart the sink listed each repo's events once per relay holding it
//! (the chaos demo's restart listed twelve times its history). A relay's
//! packed filters name many repos, and no two relays pack the same ones,
//! so a filter is listed in parts, one per value of its widest tag
//! ([`parts`]): one repo or root each, the same for every relay. Jobs join
//! the listing of a part already asked or answered, keyed by its canonical
//! JSON, and the listing is dropped once no job needs it any more. This
//! is the one split of a job's filter: the own relay asks waiting parts of
//! one shape together and hands each its own events back by value
//! (`own_relay::list_batch`). The cache is the listings part of the
//! pipeline `nip77::Nip77` owns.
//!
//! A shared listing can be older than the job that uses it. What the sink
//! took since then is either an event this engine passed to it, or one the
//! own relay's live stream (the self-subscription) delivered: both are in
//! the engine's seen set, and the job drops seen ids from what it fetches
//! (`nip77`). Anything else only costs a duplicate fetch, never a
//! loss.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use nostr::prelude::{EventId, Filter, Timestamp};

use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::time::Time;

/// Ended jobs between two sweeps of the listings. Jobs are bounded (512
/// at once by default) and so are the listings they hold, so a sweep
/// costs a few hundred steps per ended job. Sweeping after every job was
/// quadratic; sweeping rarely let ended jobs' listings linger: at 5,000
/// relays (`demo --relays 5000`) sweeping when a quarter of the listings
/// had ended peaked at 148 MiB RSS, every 64 jobs at 117 MiB, both
/// converging in 28 s.
const SWEEP_EVERY: usize = 64;

/// A listing: what the sink holds for one part, shared by the jobs
/// using it.
pub(super) type Listed = Arc<[(EventId, Timestamp)]>;

/// A job's place waiting for a listing: relay, job id, filter index.
pub(super) type Waiter = (RelayId, u64, usize);

/// `filter` as filters of one value each of its widest tag: together
/// they match exactly what it matches (a tag's values are alternatives),
/// and each is what any relay's filter for that repo or root asks.
pub(super) fn parts(filter: &Filter) -> Vec<Filter> {
    let widest = filter
        .generic_tags
        .iter()
        .max_by_key(|(_, values)| values.len());
    let Some((tag, values)) = widest.filter(|(_, values)| values.len() > 1) else {
        return vec![filter.clone()];
    };
    values
        .iter()
        .map(|value| {
            let mut part = filter.clone();
            part.generic_tags
                .insert(*tag, BTreeSet::from([value.clone()]));
            part
        })
        .collect()
}

/// What a job asking for a filter's listing gets.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Join {
    /// The listing is there already.
    Ready(Listed),
    /// Ask the sink, with this request id.
    Ask(u64),
    /// Asked already: the answer comes to every waiter.
    Wait,
}

#[derive(Debug)]
struct Entry {
    request: u64,
    asked: Time,
    listed: Option<Listed>,
    waiting: Vec<Waiter>,
}

/// The listings in use, by filter JSON.
#[derive(Debug, Default)]
pub(super) struct ListingCache {
    entries: HashMap<String, Entry>,
    /// Open requests to the sink, to their filter's key.
    open: HashMap<u64, String>,
    next: u64,
    /// Jobs ended since the last [`ListingCache::release`]. A sweep visits
    /// every listing, so one per ended job was quadratic at scale: at 5,000
    /// relays the engine spent three quarters of its time in it.
    ended: usize,
}

impl ListingCache {
    /// `waiter` needs the listing of the filter whose JSON is `key`. A
    /// request unanswered for `stale_after` is asked again (the sink may
    /// have lost it with its connection).
    pub(super) fn join(
        &mut self,
        key: String,
        waiter: Waiter,
        now: Time,
        stale_after: Duration,
    ) -> Join {
        if let Some(e) = self.entries.get_mut(&key) {
            match &e.listed {
                // In use by another job: the same window.
                Some(listed) if Arc::strong_count(listed) > 1 => {
                    return Join::Ready(listed.clone());
                }
                // No one uses it any more: too old to trust, asked again.
                Some(_) => {}
                None if now < e.asked + stale_after => {
                    e.waiting.push(waiter);
                    return Join::Wait;
                }
                None => {}
            }
        }
        let request = self.next;
        self.next += 1;
        let waiting = match self.entries.remove(&key) {
            Some(old) => {
                self.open.remove(&old.request);
                old.waiting
            }
            None => Vec::new(),
        };
        let mut entry = Entry {
            request,
            asked: now,
            listed: None,
            waiting,
        };
        entry.waiting.push(waiter);
        self.open.insert(request, key.clone());
        self.entries.insert(key, entry);
        Join::Ask(request)
    }

    /// The sink answered `request`: the listing and who waited for it
    /// (empty for a request no longer open).
    pub(super) fn answered(
        &mut self,
        request: u64,
        listed: Vec<(EventId, Timestamp)>,
    ) -> (Listed, Vec<Waiter>) {
        let listed: Listed = listed.into();
        let Some(entry) = self
            .open
            .remove(&request)
            .and_then(|key| self.entries.get_mut(&key))
        else {
            return (listed, Vec::new());
        };
        entry.listed = Some(listed.clone());
        (listed, std::mem::take(&mut entry.waiting))
    }

    /// The sink will not answer `request`: who waited for it. The entry
    /// goes, so the next job asking its filter asks again.
    pub(super) fn refused(&mut self, request: u64) -> Vec<Waiter> {
        let Some(key) = self.open.remove(&request) else {
            return Vec::new();
        };
        self.entries
            .remove(&key)
            .map(|e| e.waiting)
            .unwrap_or_default()
    }

    /// The sink cannot list: every waiter of every request, which will
    /// never be answered.
    pub(super) fn unanswerable(&mut self) -> Vec<Waiter> {
        self.open.clear();
        let entries = std::mem::take(&mut self.entries);
        entries.into_values().flat_map(|e| e.waiting).collect()
    }

    /// `n` jobs ended: their listings are released by a later sweep.
    pub(super) fn jobs_ended(&mut self, n: usize) {
        self.ended += n;
    }

    /// [`ListingCache::release`] once every [`SWEEP_EVERY`] ended jobs.
    /// What ended jobs held is freed a little later, never kept without
    /// bound; a stale waiter is harmless meanwhile, as job ids are never
    /// reused.
    pub(super) fn release_due(&mut self, gone: impl FnMut(&Waiter) -> bool) {
        if self.ended >= SWEEP_EVERY {
            self.release(gone);
        }
    }

    /// Forgets the waiters `gone` names (jobs that ended), then every
    /// listing no one needs any more: answered ones no job holds, and
    /// asked ones no job waits for.
    pub(super) fn release(&mut self, mut gone: impl FnMut(&Waiter) -> bool) {
        self.ended = 0;
        let open = &mut self.open;
        self.entries.retain(|_, e| {
            e.waiting.retain(|w| !gone(w));
            let used = match &e.listed {
                Some(listed) => Arc::strong_count(listed) > 1,
                None => !e.waiting.is_empty(),
            };
            if !used {
                open.remove(&e.request);
            }
            used
        });
    }

    /// Gives back the room a burst of listings left.
    pub(super) fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
        self.open.shrink_to_fit();
    }

    /// Listings kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nostr::prelude::{Kind, SingleLetterTag};

    const T: Time = Time::from_secs(1_000);
    const STALE: Duration = Duration::from_secs(60);

    fn w(relay: u32, job: u64) -> Waiter {
        (RelayId(relay), job, 0)
    }

    fn item(n: u8) -> (EventId, Timestamp) {
        (
            EventId::from_byte_array([n; 32]),
            Timestamp::from_secs(n as u64),
        )
    }

    #[test]
    fn two_jobs_asking_one_filter_share_one_listing_until_both_are_done() {
        let mut c = ListingCache::default();
        let key = || r#"{"kinds":[1621]}"#.to_owned();
        assert_eq!(c.join(key(), w(1, 1), T, STALE), Join::Ask(0));
        assert_eq!(c.join(key(), w(2, 7), T, STALE), Join::Wait);
        let (held, waiters) = c.answered(0, vec![item(1)]);
        assert_eq!(waiters, [w(1, 1), w(2, 7)]);
        let (a, b) = (held.clone(), held.clone());
        drop(held);
        // A third job in the same window gets it without asking.
        let Join::Ready(third) = c.join(key(), w(3, 2), T, STALE) else {
            panic!("shared");
        };
        assert_eq!(&*third, &[item(1)]);
        drop((a, b));
        c.release(|_| false);
        assert_eq!(c.len(), 1, "the third job still holds it");
        drop(third);
        c.release(|_| false);
        assert_eq!(c.len(), 0, "dropped once the last user is done");
        assert_eq!(c.join(key(), w(4, 1), T, STALE), Join::Ask(1));
    }

    #[test]
    fn a_refused_listing_hands_back_its_waiters_and_is_asked_again_next_time() {
        let mut c = ListingCache::default();
        let key = || r#"{"kinds":[1621]}"#.to_owned();
        assert_eq!(c.join(key(), w(1, 1), T, STALE), Join::Ask(0));
        assert_eq!(c.join(key(), w(2, 7), T, STALE), Join::Wait);
        assert_eq!(c.refused(0), [w(1, 1), w(2, 7)]);
        assert!(c.refused(0).is_empty(), "answered once");
        assert_eq!(
            c.join(key(), w(3, 2), T, STALE),
            Join::Ask(1),
            "not waited on"
        );
        let (_, waiters) = c.answered(0, vec![item(1)]);
        assert!(
            waiters.is_empty(),
            "a late answer to the refused request is no one's"
        );
    }

    #[test]
    fn listings_of_ended_jobs_are_swept_every_64_ended_jobs_not_every_one() {
        let mut c = ListingCache::default();
        for job in 0..SWEEP_EVERY as u64 {
            let key = format!(r#"{{"ids":["{job}"]}}"#);
            let Join::Ask(request) = c.join(key, w(1, job), T, STALE) else {
                panic!("a new filter is asked");
            };
            drop(c.answered(request, vec![item(1)]));
        }
        for ended in 1..SWEEP_EVERY {
            c.jobs_ended(1);
            c.release_due(|_| true);
            assert_eq!(c.len(), SWEEP_EVERY, "kept after {ended} ended jobs");
        }
        c.jobs_ended(1);
        c.release_due(|_| true);
        assert_eq!(c.len(), 0, "swept at the 64th");
        c.jobs_ended(1);
        c.release_due(|_| panic!("no sweep right after one"));
    }

    #[test]
    fn a_filter_is_listed_in_parts_of_one_value_of_its_widest_tag() {
        let a = SingleLetterTag::LOWERCASE_A;
        let filter = Filter::new()
            .kind(Kind::from_u16(1621))
            .custom_tags(a, ["x", "y", "z"])
            .hashtag("t");
        let parts = parts(&filter);
        assert_eq!(parts.len(), 3);
        for (part, value) in parts.iter().zip(["x", "y", "z"]) {
            let want = Filter::new()
                .kind(Kind::from_u16(1621))
                .custom_tag(a, value)
                .hashtag("t");
            assert_eq!(part.as_json(), want.as_json());
        }
        let single = Filter::new().custom_tag(a, "x");
        assert_eq!(super::parts(&single), [single]);
    }

    #[test]
    fn ended_jobs_and_stale_requests_are_not_waited_for() {
        let mut c = ListingCache::default();
        let key = || "f".to_owned();
        assert_eq!(c.join(key(), w(1, 1), T, STALE), Join::Ask(0));
        c.release(|waiter| waiter.0 == RelayId(1));
        assert_eq!(c.len(), 0, "no one waits: dropped");
        let (_, waiters) = c.answered(0, vec![]);
        assert!(waiters.is_empty(), "a late answer reaches no one");
        assert_eq!(c.join(key(), w(2, 1), T, STALE), Join::Ask(1));
        // Unanswered too long: asked again, the first waiter kept.
        assert_eq!(c.join(key(), w(3, 1), T + STALE, STALE), Join::Ask(2));
        let (_, waiters) = c.answered(1, vec![]);
        assert!(waiters.is_empty(), "the stale request is no longer open");
        let (_, waiters) = c.answered(2, vec![]);
        assert_eq!(waiters, [w(2, 1), w(3, 1)]);
    }
}
