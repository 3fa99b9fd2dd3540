//! What one relay accepts: our limits, lowered to what it stated (its
//! NIP-11 document, a saved state) or taught us by refusing. They are
//! facts of the relay, not of a connection: they outlive every socket.

use crate::sans_io::config::Config;
use crate::sans_io::query::refusal::Refusal;

/// Limits of one relay, lowered when it refuses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// REQs open at once.
    pub subscriptions: usize,
    /// NIP-77 sessions open at once. strfry counts them apart from REQs
    /// (each against `maxSubsPerConnection`) and refuses one over it with
    /// its own NOTICE, so each kind has its own limit, learnt apart.
    pub neg_sessions: usize,
    pub filters_per_req: usize,
    pub message_bytes: usize,
    /// `limit` asked per filter: ours, or the relay's NIP-11 `max_limit`.
    pub page_limit: usize,
    /// Values per tag filter (repo refs, root ids) the relay accepts.
    pub tag_values: usize,
    /// Kinds per filter the relay accepts.
    pub kinds: usize,
    /// Bytes of one tag value the relay accepts in a filter (strfry: 255);
    /// an item with a longer value cannot be asked there.
    pub value_bytes: usize,
}

/// Bytes of a REQ besides its filters (`["REQ","<id>"` and `]`).
pub(super) const REQ_OVERHEAD: usize = 32;

/// REQs, and negentropy sessions, a relay gets at once while its NIP-11
/// document is on its way.
pub(super) const PROVISIONAL_LIMIT: usize = 4;

/// Filters per REQ a relay gets until its NIP-11 document shows it takes
/// more: rust-nostr's relay builder (LocalRelay, and the GRASP relays
/// built on it) serves no document and refuses a REQ of 21 with
/// `rate-limited: REQ exceeds max filter count 20`. Every relay met takes
/// 20.
pub(super) const UNPROVEN_FILTERS: usize = 20;

/// The smallest message limit a refusal may lower us to.
pub(super) const MIN_MESSAGE_BYTES: usize = 4096;

/// The shortest tag value limit a relay may teach us: a root id is 64 hex
/// characters, and a limit below it would make every root unaskable.
pub(super) const MIN_VALUE_BYTES: usize = 64;

/// Limits a relay stated (its NIP-11 document, or a state file that
/// remembers what it taught us); `None` where it said nothing.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StatedLimits {
    pub subscriptions: Option<usize>,
    pub filters_per_req: Option<usize>,
    pub message_bytes: Option<usize>,
    pub page_limit: Option<usize>,
    pub tag_values: Option<usize>,
    pub kinds: Option<usize>,
    pub value_bytes: Option<usize>,
}

impl Limits {
    /// A relay's starting limits: ours, from the config, before the
    /// relay taught us anything.
    pub(super) fn starting(config: &Config) -> Limits {
        Limits {
            subscriptions: config.max_subscriptions.max(1),
            neg_sessions: config.max_subscriptions.max(1),
            filters_per_req: config.max_filters_per_req.clamp(1, UNPROVEN_FILTERS),
            message_bytes: config.max_message_bytes.max(1024),
            page_limit: config.page_limit.max(1),
            tag_values: config.chunk_size.max(1),
            kinds: usize::MAX,
            value_bytes: usize::MAX,
        }
    }

    /// Lowers ours to what the relay stated, never raising them (ours are
    /// what we can afford) and never below a usable floor.
    pub(super) fn lower_to(&mut self, stated: StatedLimits) {
        let lower = |ours: &mut usize, theirs: Option<usize>, floor: usize| {
            if let Some(t) = theirs {
                *ours = (*ours).min(t.max(floor));
            }
        };
        lower(&mut self.subscriptions, stated.subscriptions, 1);
        lower(&mut self.neg_sessions, stated.subscriptions, 1);
        lower(&mut self.filters_per_req, stated.filters_per_req, 1);
        lower(
            &mut self.message_bytes,
            stated.message_bytes,
            MIN_MESSAGE_BYTES,
        );
        lower(&mut self.page_limit, stated.page_limit, 1);
        lower(&mut self.tag_values, stated.tag_values, 1);
        lower(&mut self.kinds, stated.kinds, 1);
        lower(&mut self.value_bytes, stated.value_bytes, MIN_VALUE_BYTES);
    }

    /// Raises the filters per REQ from where they started to what the
    /// relay's NIP-11 document shows it takes (`taken`: its
    /// `max_filters`, or what its software is known to take), up to
    /// `ours`. Only from the start: a limit a refusal or a saved state
    /// lowered is the relay's word, and stays.
    pub(super) fn raise_filters(&mut self, taken: usize, ours: usize) {
        if self.filters_per_req == ours.clamp(1, UNPROVEN_FILTERS) {
            self.filters_per_req = self.filters_per_req.max(taken.min(ours));
        }
    }

    /// Items per historic chunk and per live per-id filter: `ours`, or
    /// fewer if the relay refuses that many tag values.
    pub(super) fn chunk_size(&self, ours: usize) -> usize {
        ours.min(self.tag_values).max(1)
    }

    /// True when the limit `refusal` names cannot be lowered any further.
    pub(super) fn at_floor(&self, refusal: Refusal) -> bool {
        match refusal {
            Refusal::TooManySubscriptions => self.subscriptions <= 1,
            Refusal::TooManyFilters => self.filters_per_req <= 1,
            Refusal::TooLarge => self.message_bytes <= MIN_MESSAGE_BYTES,
            Refusal::TooManyValues => self.tag_values <= 1,
            Refusal::TooManyKinds => self.kinds <= 1,
            _ => false,
        }
    }
}
