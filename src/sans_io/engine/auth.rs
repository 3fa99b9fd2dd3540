//! NIP-42 AUTH: answering a relay's challenge, and retrying what it refused
//! with `auth-required:` once it accepted us.
//!
//! Many relays serve nothing until the client authenticates. With a key
//! configured, every challenge is answered once with a signed kind 22242
//! event (`relay` and `challenge` tags, `created_at` = now). A REQ refused
//! with `auth-required:` is paused with the usual backoff, so a relay that
//! never sends a challenge or never accepts us costs a retry now and then,
//! never a loop; when the relay's `OK` accepts our AUTH, the paused work is
//! resumed at once. `restricted:` after AUTH is an ordinary refusal with
//! backoff: we are known and not allowed. Without a key, `auth-required:`
//! is logged once per connection, counted, and backed off.

use log::{debug, info, warn};
use nostr::prelude::*;

use super::Engine;
use super::ctx::Ctx;
use super::relay::{RelayState, Role};
use crate::sans_io::config::Config;
use crate::sans_io::memory::index::RelayId;
use crate::sans_io::timing::time::Time;
use crate::sans_io::wire::relay_text::{dropped, relay_text};

/// Longest challenge kept. Challenges are short random strings (strfry
/// and khatru send 32–64 characters); a relay must not make us hold a
/// megabyte per connection for one.
pub(super) const MAX_CHALLENGE_BYTES: usize = 256;

/// NIP-42 on one relay connection; a new connection starts afresh.
#[derive(Debug, Default)]
pub(super) struct Auth {
    /// Where the connection stands.
    state: AuthState,
    /// `auth-required:` without a key was logged on this connection.
    required_logged: bool,
}

/// Where a relay connection stands with NIP-42.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum AuthState {
    /// No challenge seen on this connection.
    #[default]
    Unchallenged,
    /// Challenged; nothing sent yet (signing failed, or not connected).
    Challenged(String),
    /// Our AUTH event is out, waiting for its `OK`.
    Sent(EventId),
    /// The relay accepted us.
    Accepted,
    /// The relay rejected our AUTH; not tried again on this connection.
    Rejected,
}

impl Auth {
    /// A challenge came: kept to be answered (true), unless this
    /// connection answered one already. One answer per connection: a
    /// relay re-challenging in a loop gets no loop from us.
    fn challenged(&mut self, challenge: &str) -> bool {
        if matches!(
            self.state,
            AuthState::Sent(_) | AuthState::Accepted | AuthState::Rejected
        ) {
            return false;
        }
        self.state = AuthState::Challenged(challenge.to_owned());
        true
    }

    /// The challenge waiting for our answer, if any.
    fn challenge(&self) -> Option<&str> {
        match &self.state {
            AuthState::Challenged(challenge) => Some(challenge),
            _ => None,
        }
    }

    /// Our AUTH event `id` is out.
    fn sent(&mut self, id: EventId) {
        self.state = AuthState::Sent(id);
    }

    /// `auth-required:` heard without a key to answer with: true the first
    /// time on this connection, which alone is logged.
    fn first_required(&mut self) -> bool {
        !std::mem::replace(&mut self.required_logged, true)
    }

    /// The relay's `OK` for event `id`: `None` when it does not answer our
    /// AUTH, else whether the relay accepted us. A rejection is final for
    /// the connection.
    fn answered(&mut self, id: &EventId, accepted: bool) -> Option<bool> {
        if self.state != AuthState::Sent(*id) {
            return None;
        }
        self.state = match accepted {
            true => AuthState::Accepted,
            false => AuthState::Rejected,
        };
        Some(accepted)
    }
}

impl Engine {
    /// `["AUTH", challenge]` from `relay` (`RelayState::auth_challenged`).
    pub(super) fn on_auth_challenge(&mut self, relay: RelayId, challenge: &str, now: Time) {
        let (state, mut cx) = self.at(relay);
        state.auth_challenged(&mut cx, challenge, now);
    }

    /// `["OK", id, accepted, message]`: the answer to our AUTH, if it is
    /// ours. Accepted, it resumes work paused for it: resuming re-opens a
    /// refused self-subscription with the `since` it had, so a first read
    /// refused for AUTH starts from the beginning.
    pub(super) fn on_ok(
        &mut self,
        relay: RelayId,
        id: &EventId,
        accepted: bool,
        message: &str,
        now: Time,
    ) {
        let (state, mut cx) = self.at(relay);
        if state.auth_answered(&mut cx, id, accepted, message, now) {
            self.on_resume(relay, now);
        }
    }
}

/// A relay's NIP-42 steps: its connection's [`Auth`], answered with the
/// key the config holds for the relay.
impl RelayState {
    /// `["AUTH", challenge]`: kept and answered only when a key is
    /// configured (without one it could never be used), and only when it is
    /// no longer than [`MAX_CHALLENGE_BYTES`].
    fn auth_challenged(&mut self, cx: &mut Ctx, challenge: &str, now: Time) {
        if cx.config.auth_keys.is_none() {
            return;
        }
        if challenge.len() > MAX_CHALLENGE_BYTES {
            let bytes = challenge.len();
            debug!("{}: AUTH challenge of {bytes} bytes ignored", cx.url());
            return;
        }
        if self
            .conn_mut()
            .is_some_and(|c| c.auth.challenged(challenge))
        {
            self.send_auth(cx, now);
        }
    }

    /// A REQ was refused with `auth-required:`; the caller pauses the work.
    pub(super) fn auth_required(&mut self, cx: &mut Ctx, now: Time) {
        cx.stats.auth_required += 1;
        let keyed = self.auth_keys(cx.config).is_some();
        let Some(conn) = self.conn_mut() else {
            return;
        };
        if !keyed {
            if conn.auth.first_required() {
                warn!(
                    "{} requires NIP-42 AUTH and no --auth-key-file is set; backing off",
                    cx.url()
                );
            }
            return;
        }
        if conn.auth.challenge().is_some() {
            self.send_auth(cx, now);
        }
    }

    /// An `OK` for event `id`: the answer to our AUTH, if it is ours. True
    /// when it accepted us with work paused (for it, perhaps).
    fn auth_answered(
        &mut self,
        cx: &mut Ctx,
        id: &EventId,
        accepted: bool,
        message: &str,
        now: Time,
    ) -> bool {
        let Some(conn) = self.conn_mut() else {
            return false;
        };
        let paused = conn.paused_until.is_some();
        match conn.auth.answered(id, accepted) {
            None => false,
            Some(false) => {
                cx.stats.auth_failures += 1;
                if let Some(n) = cx.admit_log(now) {
                    let (url, text) = (cx.url(), relay_text(message));
                    warn!("{url}: AUTH rejected: {text}{}", dropped(n));
                }
                false
            }
            Some(true) => {
                info!("{}: authenticated", cx.url());
                paused
            }
        }
    }

    /// The key that answers the relay's challenges: the own relay's own key
    /// if one is set (see [`Config::own_relay_auth_keys`]), else the shared one.
    fn auth_keys<'a>(&self, config: &'a Config) -> Option<&'a Keys> {
        let own = self.facts.role == Role::Own;
        let own_key = config.own_relay_auth_keys.as_ref().filter(|_| own);
        own_key.or(config.auth_keys.as_ref())
    }

    /// Answers the challenge waiting on the connection, if any.
    fn send_auth(&mut self, cx: &mut Ctx, now: Time) {
        let Some(challenge) = self.conn().and_then(|c| c.auth.challenge()) else {
            return;
        };
        let Some(keys) = self.auth_keys(cx.config) else {
            return;
        };
        let url = cx.url();
        let event = match crate::sans_io::wire::nip42::auth_event(keys, url, challenge, now) {
            Ok(event) => event,
            Err(e) => {
                warn!("{url}: could not sign AUTH: {e}");
                return;
            }
        };
        cx.stats.auth_attempts += 1;
        let Some(conn) = self.conn_mut() else {
            return;
        };
        conn.auth.sent(event.id);
        cx.send(ClientMessage::auth(event).as_json());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine with `relay` connected, and a key when `keyed`.
    fn engine(keyed: bool) -> (Engine, RelayId) {
        let mut config = Config::new("wss://own.example");
        config.bootstrap = vec!["wss://relay.example".to_owned()];
        config.relay_info = false;
        if keyed {
            config.auth_keys = Some(Keys::generate());
        }
        let now = Time::from_secs(1_000);
        let mut engine = Engine::new(config, now).expect("valid config");
        let relay = engine
            .relay_id("wss://relay.example")
            .expect("bootstrap relay");
        engine.handle_connected(now, relay);
        while engine.poll_action().is_some() {}
        (engine, relay)
    }

    #[test]
    fn without_a_key_no_challenge_is_kept() {
        let (mut engine, relay) = engine(false);
        engine.on_auth_challenge(relay, &"c".repeat(100), Time::from_secs(1_001));
        assert_eq!(
            engine.relays[relay.index()]
                .conn()
                .expect("connected")
                .auth
                .state,
            AuthState::Unchallenged
        );
    }

    #[test]
    fn an_over_long_challenge_is_ignored_a_short_one_answered() {
        let (mut engine, relay) = engine(true);
        let now = Time::from_secs(1_001);
        engine.on_auth_challenge(relay, &"c".repeat(MAX_CHALLENGE_BYTES + 1), now);
        assert_eq!(
            engine.relays[relay.index()]
                .conn()
                .expect("connected")
                .auth
                .state,
            AuthState::Unchallenged
        );
        engine.on_auth_challenge(relay, &"c".repeat(MAX_CHALLENGE_BYTES), now);
        assert!(matches!(
            engine.relays[relay.index()]
                .conn()
                .expect("connected")
                .auth
                .state,
            AuthState::Sent(_)
        ));
    }
}
