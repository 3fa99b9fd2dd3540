//! What the remote relays are like: which require NIP-42 AUTH, which are
//! capped like khatru, which behave like strfry, which hold a busy or a
//! crowded issue, and the line that says so.

use grasp_sync::testing::farm::RelayProfile;
use grasp_sync::testing::limits::ValueCaps;

/// What each relay of the farm is like (farm numbers: 0 is the own
/// relay, remote relay `i` is index `i - 1` into the remote relay URLs).
pub struct Plan {
    /// Relays that require NIP-42 AUTH (see [`auth_relays`]).
    pub auth_required: Vec<usize>,
    /// The relays limited like khatru or strfry, and the own relay's
    /// profile when one was given.
    pub profiles: Vec<(usize, RelayProfile)>,
    /// Relays holding a busy issue (indexes into the remote relay URLs).
    pub busy: Vec<usize>,
    /// Relays that behave like strfry (see [`strfry_relays`]).
    pub strfry: Vec<usize>,
    /// The relay holding a crowded second (see [`crowded_relay`]).
    pub crowded: Option<usize>,
}

impl Plan {
    /// The farm's `farm_len` relays, `busy_count` busy issues at most;
    /// `own` limits the own relay.
    pub fn new(farm_len: usize, busy_count: usize, own: Option<RelayProfile>) -> Plan {
        let auth_required = auth_relays(farm_len);
        let (mut profiles, busy) = capped_profiles(farm_len, busy_count);
        let strfry = strfry_relays(farm_len);
        profiles.extend(strfry.iter().map(|&i| (i, RelayProfile::strfry())));
        let crowded = crowded_relay(&profiles, &busy);
        profiles.extend(own.map(|p| (0, p)));
        Plan {
            auth_required,
            profiles,
            busy,
            strfry,
            crowded,
        }
    }

    /// Relays that do not speak NIP-77, as indexes into the remote relay
    /// URLs (as the scenario numbers them).
    pub fn req_only(&self) -> Vec<usize> {
        self.profiles
            .iter()
            .filter(|(_, p)| p.no_negentropy)
            .map(|(i, _)| i - 1)
            .collect()
    }

    /// The strfry-like relays as indexes into the remote relay URLs.
    pub fn strfry_indexes(&self) -> Vec<usize> {
        self.strfry.iter().map(|i| i - 1).collect()
    }
}

/// Remote relays (farm numbers) that require NIP-42 AUTH: every fifth.
fn auth_relays(farm_len: usize) -> Vec<usize> {
    (1..farm_len).filter(|i| i % 5 == 0).collect()
}

/// Stored events a capped relay returns per filter: khatru over
/// eventstore's SQL backends.
pub const CAPPED_RESULTS: usize = 100;

/// Replies to each busy issue: past the cap, so one page cannot hold them.
pub const BUSY_REPLIES: usize = CAPPED_RESULTS + 20;

/// Remote relays (farm numbers) limited like khatru relays over
/// eventstore's SQL backends, every third: 100 stored events per filter,
/// pages cut at 100 whatever `limit` asks. Every other one (numbers
/// divisible by 6) also refuses a filter with more than 10 tag values or
/// kinds the way khatru does (a `NOTICE`, then `EOSE`) and does not speak
/// NIP-77 (khatru's default), so it is read by REQ. Numbers 9, 21, 33, ...
/// and 12, 24, 36, ... publish a NIP-11 document naming `max_limit` 100;
/// numbers 3, 15, 27, ... say nothing of their cap, so a page of 100
/// asked with `limit` 500 is all the engine learns it from.
///
/// Also returns the relays (indexes into the remote relay URLs) that hold
/// a busy issue, `busy_count` at most (see [`DemoOptions::busy`](super::DemoOptions::busy)), among
/// numbers 3, 15, 27, ..., which then do not speak NIP-77 either, so the
/// engine reads the replies by REQ and the cap cuts its pages.
fn capped_profiles(farm_len: usize, busy_count: usize) -> (Vec<(usize, RelayProfile)>, Vec<usize>) {
    let mut busy = Vec::new();
    let profiles = (1..farm_len)
        .filter(|i| i % 3 == 0)
        .map(|i| {
            let busy_here = i % 12 == 3 && busy.len() < busy_count;
            if busy_here {
                busy.push(i - 1);
            }
            let profile = RelayProfile {
                max_results_per_filter: Some(CAPPED_RESULTS),
                value_caps: (i % 6 == 0).then(ValueCaps::eventstore),
                nip11: i % 12 == 9 || i % 12 == 0,
                no_negentropy: i % 6 == 0 || busy_here,
                ..RelayProfile::default()
            };
            (i, profile)
        })
        .collect();
    (profiles, busy)
}

/// Remote relays (farm numbers) that behave like strfry: every seventh
/// from 1 that is not capped like khatru (numbers divisible by 3).
fn strfry_relays(farm_len: usize) -> Vec<usize> {
    (1..farm_len).filter(|i| i % 7 == 1 && i % 3 != 0).collect()
}

/// The capped relay (index into the remote relay URLs) that holds an issue
/// with more replies in one second than it returns: the first that speaks
/// NIP-77 and holds no busy issue, so the engine reads that second whole
/// by negentropy.
fn crowded_relay(profiles: &[(usize, RelayProfile)], busy: &[usize]) -> Option<usize> {
    profiles
        .iter()
        .find(|(i, p)| {
            p.max_results_per_filter == Some(CAPPED_RESULTS)
                && !p.no_negentropy
                && !busy.contains(&(i - 1))
        })
        .map(|(i, _)| i - 1)
}

/// A line saying how the capped relays are limited.
pub fn describe_profiles(profiles: &[(usize, RelayProfile)], busy: usize, tls: bool) -> String {
    let profiles: Vec<&(usize, RelayProfile)> = profiles
        .iter()
        .filter(|(_, p)| p.max_results_per_filter == Some(CAPPED_RESULTS))
        .collect();
    let refusing = profiles
        .iter()
        .filter(|(_, p)| p.value_caps.is_some())
        .count();
    let nip11 = profiles.iter().filter(|(_, p)| p.nip11).count();
    let req_only = profiles.iter().filter(|(_, p)| p.no_negentropy).count();
    format!(
        "demo: {} of them cap stored results at {CAPPED_RESULTS} per filter (khatru over eventstore SQL); \
         {refusing} of those refuse filters over 10 tag values or kinds; {req_only} skip NIP-77; {nip11} \
         publish NIP-11{}; {busy} hold an issue with {BUSY_REPLIES} replies",
        profiles.len(),
        if tls {
            " (plain ws:// only, so not in this --tls run)"
        } else {
            ""
        },
    )
}
