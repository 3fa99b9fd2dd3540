//! Relay health: when to try a relay again after it failed us.
//!
//! Backoff doubles per consecutive failure (`base * 2^(failures-1)`, capped)
//! with a little jitter so thousands of relays that failed together do not
//! retry together. A relay failing continuously for `dead_after` is dead and
//! tried once per `dead_retry`. `rate-limited:` gets its own fixed cooldown;
//! it says "slow down", not "broken".

use std::time::Duration;

use rand::Rng;

use crate::sans_io::timing::time::Time;

/// Health as reported in status and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// No failure since the last success.
    Healthy,
    /// Failing, retried with backoff.
    Degraded,
    /// Failing for longer than `dead_after`; retried once per `dead_retry`.
    Dead,
    /// Told us to slow down; cooling down.
    RateLimited,
}

/// Backoff constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BackoffPolicy {
    /// First backoff.
    pub base: Duration,
    /// Longest backoff.
    pub max: Duration,
    /// Continuous failure after which a relay is dead.
    pub dead_after: Duration,
    /// Retry period of a dead relay.
    pub dead_retry: Duration,
    /// Cooldown after `rate-limited:`.
    pub rate_limit_cooldown: Duration,
}

/// Failures or refusals a saved history may claim at most.
pub(crate) const MAX_SAVED_COUNT: u32 = 64;

/// A [`HealthTracker`]'s history in engine time, for saving and restoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SavedHealth {
    /// Failures since the last success.
    pub failures: u32,
    /// Refusals of historic work in a row.
    pub refusals: u32,
    /// Start of the failure streak.
    pub failing_since: Option<Time>,
    /// End of a rate-limit cooldown.
    pub rate_limited_until: Option<Time>,
}

/// Failure history of one relay: nothing held for one with none, as
/// nearly every connected relay is. The relay table holds a tracker per
/// relay for the process's life, and an inline history made every entry
/// 32 bytes larger.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthTracker(Option<Box<Streak>>);

/// A relay's failures, refusals and cooldown; never [`CLEAN`] inside a
/// [`HealthTracker`] (that is no box).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Streak {
    failures: u32,
    failing_since: Option<Time>,
    rate_limited_until: Option<Time>,
    /// Consecutive refusals of historic work (`restricted:`, `error:`,
    /// `auth-required:`). Kept apart from `failures` because the relay may
    /// well serve other subscriptions (an EOSE there is a success), and a
    /// refusal streak must still back off instead of retrying every `base`.
    refusals: u32,
}

/// No failure, refusal or cooldown.
const CLEAN: Streak = Streak {
    failures: 0,
    failing_since: None,
    rate_limited_until: None,
    refusals: 0,
};

impl HealthTracker {
    /// A tracker holding `streak`: nothing if it is clean.
    fn holding(streak: Streak) -> Self {
        HealthTracker((streak != CLEAN).then(|| Box::new(streak)))
    }

    /// The history, clean if there is none.
    fn streak(&self) -> &Streak {
        self.0.as_deref().unwrap_or(&CLEAN)
    }

    /// Changes the history by `change`, and lets it go once clean.
    fn change<R>(&mut self, change: impl FnOnce(&mut Streak) -> R) -> R {
        let streak = self.0.get_or_insert_default();
        let out = change(streak);
        if **streak == CLEAN {
            self.0 = None;
        }
        out
    }

    /// The relay served us: forget past failures (a refusal streak ends
    /// only when refused work gets through, see `record_progress`).
    pub(crate) fn record_success(&mut self) {
        if self.0.is_some() {
            self.change(|s| {
                *s = Streak {
                    refusals: s.refusals,
                    ..Streak::default()
                }
            });
        }
    }

    /// Historic work was served to the end: refusals are over.
    pub(crate) fn record_progress(&mut self) {
        if self.0.is_some() {
            self.change(|s| s.refusals = 0);
        }
    }

    /// The relay refused historic work at `now`; returns when to try it
    /// again: the backoff doubles per refusal in a row, plus `penalty`.
    pub(crate) fn record_refusal(
        &mut self,
        now: Time,
        policy: &BackoffPolicy,
        penalty: u32,
        rng: &mut impl Rng,
    ) -> Time {
        let refusals = self.change(|s| {
            s.refusals = s.refusals.saturating_add(1);
            s.refusals
        });
        now + backoff(refusals, penalty, policy, rng)
    }

    /// The relay failed at `now`; returns when to try it again. `penalty`
    /// adds doublings to the backoff for a relay that misbehaved (see
    /// `conduct`); zero for an honest failure.
    pub(crate) fn record_failure(
        &mut self,
        now: Time,
        policy: &BackoffPolicy,
        penalty: u32,
        rng: &mut impl Rng,
    ) -> Time {
        self.count_failure(now, policy)
            .unwrap_or_else(|| now + backoff(self.failures(), penalty, policy, rng))
    }

    /// As [`HealthTracker::record_failure`] without penalty or jitter, for
    /// a lone connection (the own relay): jitter spreads a herd of relays
    /// that failed together, and one connection is no herd, so its retry
    /// schedule stays exact.
    pub(crate) fn record_failure_exact(&mut self, now: Time, policy: &BackoffPolicy) -> Time {
        self.count_failure(now, policy)
            .unwrap_or_else(|| now + exact_backoff(self.failures(), 0, policy))
    }

    /// Counts a failure at `now`; the retry time if that makes the relay
    /// dead (failing for `dead_after`), else `None` for a backoff.
    fn count_failure(&mut self, now: Time, policy: &BackoffPolicy) -> Option<Time> {
        self.change(|s| {
            s.failures = s.failures.saturating_add(1);
            let since = *s.failing_since.get_or_insert(now);
            (now.since(since) >= policy.dead_after).then(|| now + policy.dead_retry)
        })
    }

    /// The relay said `rate-limited:` at `now`; returns when to try again.
    pub(crate) fn record_rate_limit(&mut self, now: Time, policy: &BackoffPolicy) -> Time {
        let until = now + policy.rate_limit_cooldown;
        self.change(|s| s.rate_limited_until = Some(until));
        until
    }

    /// The history worth keeping across a restart.
    pub(crate) fn saved(&self) -> SavedHealth {
        let s = self.streak();
        SavedHealth {
            failures: s.failures,
            refusals: s.refusals,
            failing_since: s.failing_since,
            rate_limited_until: s.rate_limited_until,
        }
    }

    /// A history saved by an earlier process, as far as it is believable
    /// at `now`: counts capped (past [`MAX_SAVED_COUNT`] the backoff is at
    /// its ceiling anyway), a failure streak cannot start in the future,
    /// and no cooldown lasts longer than the policy's.
    pub(crate) fn restored(saved: SavedHealth, now: Time, policy: &BackoffPolicy) -> Self {
        HealthTracker::holding(Streak {
            failures: saved.failures.min(MAX_SAVED_COUNT),
            refusals: saved.refusals.min(MAX_SAVED_COUNT),
            failing_since: saved
                .failing_since
                .map(|t| t.min(now))
                .filter(|_| saved.failures > 0),
            rate_limited_until: saved
                .rate_limited_until
                .map(|t| t.min(now + policy.rate_limit_cooldown))
                .filter(|&t| t > now),
        })
    }

    /// Consecutive failures since the last success.
    pub(crate) fn failures(&self) -> u32 {
        self.streak().failures
    }

    /// Health at `now`.
    pub(crate) fn health(&self, now: Time, policy: &BackoffPolicy) -> Health {
        let s = self.streak();
        if s.rate_limited_until.is_some_and(|until| now < until) {
            Health::RateLimited
        } else if s
            .failing_since
            .is_some_and(|since| now.since(since) >= policy.dead_after)
        {
            Health::Dead
        } else if s.failures > 0 || s.refusals > 0 {
            Health::Degraded
        } else {
            Health::Healthy
        }
    }
}

/// The wait after the `nth` failure (or refusal) in a row: `base` doubled
/// per earlier one and per `penalty` step, capped at `max`, plus up to 10 %
/// jitter so relays that failed together do not retry together.
fn backoff(nth: u32, penalty: u32, policy: &BackoffPolicy, rng: &mut impl Rng) -> Duration {
    let wait = exact_backoff(nth, penalty, policy);
    let jitter_ms = rng.gen_range(0..=wait.as_millis() as u64 / 10);
    wait + Duration::from_millis(jitter_ms)
}

/// The wait after the `nth` failure in a row before jitter: `base` doubled
/// per earlier one and per `penalty` step, capped at `max`.
fn exact_backoff(nth: u32, penalty: u32, policy: &BackoffPolicy) -> Duration {
    let exp = nth.saturating_sub(1).saturating_add(penalty).min(31);
    policy.base.saturating_mul(1u32 << exp).min(policy.max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_secs(5),
            max: Duration::from_secs(3600),
            dead_after: Duration::from_secs(24 * 3600),
            dead_retry: Duration::from_secs(24 * 3600),
            rate_limit_cooldown: Duration::from_secs(65),
        }
    }

    /// A relay with no failure holds no history: the relay table keeps a
    /// tracker per relay, and nearly all of them are clean.
    #[test]
    fn a_clean_tracker_holds_nothing() {
        assert_eq!(std::mem::size_of::<HealthTracker>(), 8);
        let (p, t0) = (policy(), Time::from_secs(1_000));
        let mut h = HealthTracker::default();
        h.record_rate_limit(t0, &p);
        assert!(h.0.is_some());
        h.record_success();
        assert!(h.0.is_none(), "a success forgets it");
        h.record_refusal(t0, &p, 0, &mut SmallRng::seed_from_u64(1));
        h.record_success();
        assert!(h.0.is_some(), "a success does not end a refusal streak");
        h.record_progress();
        assert!(h.0.is_none(), "a streak ended leaves nothing");
    }

    #[test]
    fn backoff_doubles_caps_and_dies() {
        let p = policy();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut h = HealthTracker::default();
        let t0 = Time::from_secs(1_000_000);
        let mut expected = 5u64;
        for _ in 0..12 {
            let retry = h.record_failure(t0, &p, 0, &mut rng);
            let wait = retry.since(t0).as_millis() as u64;
            let base = expected.min(3600) * 1000;
            assert!(
                wait >= base && wait <= base + base / 10,
                "wait {wait} base {base}"
            );
            expected *= 2;
        }
        assert_eq!(h.health(t0, &p), Health::Degraded);
        let later = t0 + Duration::from_secs(24 * 3600);
        assert_eq!(
            h.record_failure(later, &p, 0, &mut rng),
            later + p.dead_retry
        );
        assert_eq!(h.health(later, &p), Health::Dead);
        h.record_success();
        assert_eq!(h.health(later, &p), Health::Healthy);
        assert_eq!(h.failures(), 0);
    }

    #[test]
    fn exact_backoff_has_no_jitter_and_success_resets_it() {
        let p = policy();
        let mut h = HealthTracker::default();
        let t0 = Time::from_secs(1_000);
        let waits: Vec<u64> = (0..3)
            .map(|_| h.record_failure_exact(t0, &p).since(t0).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20]);
        h.record_success();
        assert_eq!(h.record_failure_exact(t0, &p), t0 + Duration::from_secs(5));
    }

    #[test]
    fn restored_history_is_clamped_and_keeps_a_dead_relay_dead() {
        let p = policy();
        let mut rng = SmallRng::seed_from_u64(1);
        let t0 = Time::from_secs(1_000_000);
        let mut h = HealthTracker::default();
        h.record_failure(t0, &p, 0, &mut rng);
        let later = t0 + p.dead_after;
        h.record_failure(later, &p, 0, &mut rng);
        let back = HealthTracker::restored(h.saved(), later, &p);
        assert_eq!(back.health(later, &p), Health::Dead);
        let hostile = SavedHealth {
            failures: u32::MAX,
            refusals: u32::MAX,
            failing_since: Some(t0 + Duration::from_secs(999_999)),
            rate_limited_until: Some(Time::from_millis(u64::MAX)),
        };
        let h = HealthTracker::restored(hostile, t0, &p);
        assert_eq!(h.failures(), MAX_SAVED_COUNT);
        assert_eq!(h.health(t0 + p.rate_limit_cooldown, &p), Health::Degraded);
        assert_eq!(h.saved().failing_since, Some(t0));
    }

    #[test]
    fn rate_limit_is_a_cooldown() {
        let p = policy();
        let mut h = HealthTracker::default();
        let t0 = Time::from_secs(10);
        assert_eq!(h.record_rate_limit(t0, &p), t0 + Duration::from_secs(65));
        assert_eq!(
            h.health(t0 + Duration::from_secs(64), &p),
            Health::RateLimited
        );
        assert_eq!(h.health(t0 + Duration::from_secs(65), &p), Health::Healthy);
    }
}
