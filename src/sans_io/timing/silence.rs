//! How long a query a relay left silent is given before it is asked again.
//!
//! nostr-rs-relay drops a query it aborts while a WAL checkpoint runs (and
//! one that waited over five seconds for a reader thread): no EVENT, no
//! EOSE, no CLOSED, no NOTICE. A query still silent when a later one on
//! the same connection was answered is a suspect; one still silent after
//! the grace is asked again. Both the remote relays' subscriptions
//! (`engine::unanswered`) and the own relay's listings
//! (`own_relay::list_query`) keep to this one schedule.

use std::time::Duration;

use super::time::Time;

/// The grace of the first round of suspects on a connection. Relays send
/// a stored event or EOSE within milliseconds of a query's start; ten
/// seconds leaves a slow, loaded relay room.
const FIRST_GRACE: Duration = Duration::from_secs(10);

/// Rounds after which the grace stops doubling: 10 s × 2³ = 80 s, under
/// the EOSE deadline (two minutes).
const MAX_DOUBLINGS: u8 = 3;

/// One connection's rounds of queries taken as unanswered: each doubles
/// the next grace, so a relay slow to start one query while it answers
/// others is not asked it again every ten seconds. A new connection
/// starts afresh.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SilenceGrace {
    rounds: u8,
    last_round: Option<Time>,
}

impl SilenceGrace {
    /// The grace a new suspect gets now.
    pub(crate) fn grace(&self) -> Duration {
        FIRST_GRACE * (1 << self.rounds.min(MAX_DOUBLINGS))
    }

    /// A suspect was taken as unanswered at `now`. Suspects armed
    /// together expire together, as one round.
    pub(crate) fn count(&mut self, now: Time) {
        if self.last_round != Some(now) {
            self.last_round = Some(now);
            self.rounds = self.rounds.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_doubles_the_grace_up_to_eighty_seconds() {
        let mut g = SilenceGrace::default();
        let t = Time::from_secs(1_000);
        assert_eq!(g.grace(), Duration::from_secs(10));
        g.count(t);
        g.count(t);
        assert_eq!(
            g.grace(),
            Duration::from_secs(20),
            "one round at one instant"
        );
        for s in 1..10 {
            g.count(t + Duration::from_secs(s));
        }
        assert_eq!(g.grace(), Duration::from_secs(80));
    }
}
