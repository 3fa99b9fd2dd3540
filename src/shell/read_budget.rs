//! How many frames the loop reads from one relay connection: per second,
//! and per turn of the loop.
//!
//! Each frame costs a JSON parse and usually a signature check (about
//! 50 µs). Every frame counts, whatever its kind (text, binary, ping,
//! pong, a fragment), and large ones count once more per 4 KiB
//! (`WsReader::cost`), so a relay streaming binary frames or pings is
//! read no faster than one streaming events. Over TLS a read costs at
//! least what its records cost (one per record, or per 4 KiB of them,
//! `TlsStream::wire_cost`): a relay sending one byte per record, or
//! session tickets without end, pays for the decrypting, not for the
//! little plaintext it yields. A relay that floods events as fast as it can would otherwise get
//! as much CPU as the loop has, and a burst from one relay would delay every
//! other relay's frames behind it. Past its allowance the shell simply stops
//! reading that socket until the next window: TCP flow control pushes back
//! on the relay, its unread data stays in the kernel's bounded buffers, not
//! in ours, and nothing is dropped. Honest history syncs run at thousands of
//! frames per second well within the default.
//!
//! Within a second, one connection also reads at most [`READ_BUDGET`]
//! frames per turn of the loop before every other ready socket has had its
//! turn, so a busy relay delays the rest by one budget, not one backlog.
//!
//! Signature checks across all remote relays share one more allowance per
//! second, [`GLOBAL_FRAMES_PER_SEC`]: many relays each within their own
//! rate must not add up to more CPU than the loop has. It is shared fairly
//! by the turns: no relay reads more than [`READ_BUDGET`] of it before
//! every other ready relay had its turn. A relay that finds it spent waits
//! like a throttled one, for the next window, its bytes in the kernel:
//! nothing is dropped. The own relay is not counted against it.

use std::time::Duration;

use crate::sans_io::timing::time::Time;
use crate::shell::ws::{WsConnection, WsEvent};

/// Length of one counting window.
const WINDOW: Duration = Duration::from_secs(1);

/// Frames read from one connection in the current one-second window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadRate {
    per_window: u32,
    window_start: Time,
    used: u32,
}

impl ReadRate {
    /// A budget of `per_second` frames per second, starting at `now`.
    pub(crate) fn new(per_second: u32, now: Time) -> Self {
        ReadRate {
            per_window: per_second.max(1),
            window_start: now,
            used: 0,
        }
    }

    /// Frames that may still be read at `now`.
    pub(crate) fn allowance(&mut self, now: Time) -> usize {
        if now >= self.window_start + WINDOW {
            self.window_start = now;
            self.used = 0;
        }
        self.per_window.saturating_sub(self.used) as usize
    }

    /// `frames` were read.
    pub(crate) fn spend(&mut self, frames: usize) {
        self.used = self
            .used
            .saturating_add(u32::try_from(frames).unwrap_or(u32::MAX));
    }

    /// When the allowance refills.
    pub(crate) fn refill_at(&self) -> Time {
        self.window_start + WINDOW
    }
}

/// Frames all remote relays together may read per second: about one
/// core of signature checks at 50 µs each. Events only go as fast as the
/// own relay takes them (reads pause while the outbox is full), so this
/// bounds what floods and forgeries can cost, not honest history; at half
/// a core it held a first sync below the pace of a LocalRelay own relay.
pub(crate) const GLOBAL_FRAMES_PER_SEC: u32 = 20_000;

/// Frames one connection may read per turn before the others get theirs.
pub(crate) const READ_BUDGET: usize = 64;

/// How a relay read ended.
pub(crate) enum ReadEnd {
    /// Nothing more waiting.
    Done,
    /// The turn's budget ran out; more may be waiting.
    More,
    /// The per-second allowance ran out; read again at this time.
    Throttled(Time),
}

/// One turn of reads from a relay connection into `buf` (the loop's one
/// read buffer), within the turn budget and (unless `trusted`, the own
/// relay) the connection's and all relays' per-second allowances.
pub(crate) fn read_relay(
    ws: &mut WsConnection,
    rate: &mut ReadRate,
    global: &mut ReadRate,
    trusted: bool,
    now: Time,
    out: &mut Vec<WsEvent>,
    buf: &mut [u8],
) -> ReadEnd {
    if trusted {
        return match ws.on_ready(out, READ_BUDGET, now, buf) {
            true => ReadEnd::More,
            false => ReadEnd::Done,
        };
    }
    let allowance = rate
        .allowance(now)
        .min(global.allowance(now))
        .min(READ_BUDGET);
    if allowance == 0 {
        return ReadEnd::Throttled(refill_at(rate, global, now));
    }
    let more = ws.on_ready(out, allowance, now, buf);
    rate.spend(ws.spent());
    global.spend(ws.spent());
    match (more, rate.allowance(now).min(global.allowance(now)) > 0) {
        (false, _) => ReadEnd::Done,
        (true, true) => ReadEnd::More,
        (true, false) => ReadEnd::Throttled(refill_at(rate, global, now)),
    }
}

/// When the allowance that ran out at `now` refills.
fn refill_at(rate: &mut ReadRate, global: &mut ReadRate, now: Time) -> Time {
    if rate.allowance(now) == 0 {
        rate.refill_at()
    } else {
        global.refill_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_is_spent_then_refilled_by_the_next_window() {
        let t0 = Time::from_secs(100);
        let mut r = ReadRate::new(10, t0);
        assert_eq!(r.allowance(t0), 10);
        r.spend(7);
        assert_eq!(r.allowance(t0 + Duration::from_millis(500)), 3);
        r.spend(3);
        assert_eq!(r.allowance(t0 + Duration::from_millis(999)), 0);
        assert_eq!(r.refill_at(), t0 + WINDOW);
        assert_eq!(r.allowance(t0 + WINDOW), 10);
    }

    #[test]
    fn overspending_never_wraps() {
        let t0 = Time::from_secs(1);
        let mut r = ReadRate::new(1, t0);
        r.spend(usize::MAX);
        r.spend(5);
        assert_eq!(r.allowance(t0), 0);
    }
}
