//! The demo's world: repositories spread over relays and the events that
//! must reach the own relay, generated deterministically from a seed.
//!
//! Besides the history and the events published while the engine runs,
//! some events are published while the engine is down (between its first
//! run and its restart): new roots of known repositories and replies to
//! known roots, so a restarted engine can find them all by negentropy in
//! the filters it already had.
//!
//! With `--chaos` some relays misbehave. Every event is then placed on
//! honest relays, so each one must arrive; each repository also lists one
//! misbehaving relay, which holds copies of that repository's history and
//! sends its bad stuff along with them.

use std::collections::HashSet;

use nostr::prelude::{
    Event, EventBuilder, EventId, FinalizeEvent, Keys, Kind, SecretKey, Tag, Timestamp, ToBech32,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::DemoOptions;
use super::profiles::{BUSY_REPLIES, CAPPED_RESULTS};

/// One generated repository.
struct Repo {
    owner: Keys,
    d: String,
    relays: Vec<usize>,
    /// The misbehaving relay it also lists, if any.
    chaotic: Option<usize>,
    roots: Vec<(Event, usize)>,
}

/// The generated world: what each relay holds and what must arrive.
pub struct Scenario {
    /// Events on the own relay at start (announcements).
    pub own: Vec<Event>,
    /// Events on each remote relay at start (index 0 is farm relay 1).
    pub remote: Vec<Vec<Event>>,
    /// Events on each misbehaving relay at start: copies of events placed
    /// on honest relays.
    pub chaotic: Vec<Vec<Event>>,
    /// Events published while the engine runs: (farm relay, event).
    pub live: Vec<(usize, Event)>,
    /// Every event that must reach the own relay in the first run.
    pub expected: Vec<EventId>,
    /// Events published while the engine is down, before its restart:
    /// (farm relay, event). Each is on one honest relay.
    pub down: Vec<(usize, Event)>,
    /// Events no engine can ask for: those of the repo whose `d` tag
    /// makes its coordinate longer than a strfry-like relay takes, on such
    /// a relay alone. Not expected; the engine counts the repo unreachable.
    pub unreachable: Vec<EventId>,
}

/// `d` of the repo strfry-like relays cannot be asked for: its coordinate
/// (`30617:<64 hex>:<d>`) passes 255 bytes.
pub const LONG_D_LEN: usize = 200;

/// Replies in the one second of the crowded issue: more than a capped
/// relay returns for one filter (see [`CAPPED_RESULTS`]).
pub const SAME_SECOND_REPLIES: usize = CAPPED_RESULTS + 50;

/// What some remote relays (indexes into the URLs) are for.
#[derive(Debug, Clone, Copy)]
pub struct Roles<'a> {
    /// Capped relays read by REQ, each holding a busy issue.
    pub busy: &'a [usize],
    /// Relays that do not speak NIP-77.
    pub req_only: &'a [usize],
    /// Relays that behave like strfry; the first carries the long-`d` repo.
    pub strfry: &'a [usize],
    /// The capped relay holding an issue with a crowded second.
    pub crowded: Option<usize>,
}

/// Repos one owner key announces at most (there are at least 8 owners).
const REPOS_PER_OWNER: usize = 150;

/// Generates the repos and their events over the honest relays `urls`,
/// deterministically from the seed; repo `i` also lists misbehaving relay
/// `i % chaotic.len()`. Default sizes count both kinds of relay.
/// Relays that require NIP-42 AUTH host remote-only announcements like any
/// other: the engine must read them from the beginning once accepted.
/// Each relay of `busy` (indexes into `urls`) also holds one busy issue of
/// a repo it hosts, with [`BUSY_REPLIES`] replies: more than a capped relay
/// returns for one filter. Events published while the engine is down go to
/// relays not in `req_only` (those speak NIP-77) where a repo has one: they
/// show what negentropy finds, and a relay read by REQ is read in full.
///
/// Every announcement names the own relay in its `relays` tag and in a
/// `clone` URL (`http(s)://<own host:port>/<npub>/<d>.git`), as GRASP-01
/// asks of an announcement a GRASP relay accepts: the engine passes on an
/// announcement found on another relay only if it does.
pub fn generate(
    opts: &DemoOptions,
    own_url: &str,
    urls: &[String],
    chaotic: &[String],
    roles: &Roles<'_>,
) -> Scenario {
    let Roles {
        busy,
        req_only,
        strfry,
        crowded,
    } = *roles;
    let mut rng = SmallRng::seed_from_u64(opts.seed);
    let n = urls.len();
    let all = n + chaotic.len();
    let repo_count = opts.repos.unwrap_or(2 * all).max(1);
    let event_count = opts.events.unwrap_or(20 * all);
    // At most 150 repos per owner, as people have, which keeps each owner
    // well inside the engine's per-key share of relays (500): eight owners
    // of 10,000 repos would each list thousands of relays, and the share
    // would stop the demo at scale.
    let owner_count = repo_count.div_ceil(REPOS_PER_OWNER).max(8);
    let owners: Vec<Keys> = (0..owner_count).map(|_| keys(&mut rng)).collect();
    let authors: Vec<Keys> = (0..16).map(|_| keys(&mut rng)).collect();
    let now = Timestamp::now().as_secs();
    let mut s = Scenario {
        own: Vec::new(),
        remote: vec![Vec::new(); n],
        chaotic: vec![Vec::new(); chaotic.len()],
        live: Vec::new(),
        expected: Vec::new(),
        down: Vec::new(),
        unreachable: Vec::new(),
    };
    let mut repos: Vec<Repo> = (0..repo_count)
        .map(|i| {
            let mut relays: Vec<usize> = (0..rng.gen_range(1..=3.min(n)))
                .map(|_| rng.gen_range(0..n))
                .collect();
            relays.sort_unstable();
            relays.dedup();
            Repo {
                owner: owners[i % owners.len()].clone(),
                d: format!("repo-{i}"),
                relays,
                chaotic: (!chaotic.is_empty()).then(|| i % chaotic.len()),
                roots: Vec::new(),
            }
        })
        .collect();
    // Relays some own-announced repo lists: a remote-only announcement placed
    // there is found through Layer 1 (recursive discovery).
    let mut listed: HashSet<usize> = HashSet::new();
    for (i, repo) in repos.iter().enumerate() {
        let mut tags = vec![tag(&["d", &repo.d]), tag(&["name", &repo.d])];
        let mut relay_tag = vec!["relays".to_owned(), own_url.to_owned()];
        relay_tag.extend(repo.relays.iter().map(|&r| urls[r].clone()));
        relay_tag.extend(repo.chaotic.map(|c| chaotic[c].clone()));
        tags.push(Tag::parse(relay_tag).expect("the relays tag has a name"));
        tags.push(tag(&["clone", &clone_url(own_url, &repo.owner, &repo.d)]));
        let ann = sign(&repo.owner, 30617, now - 86_400 + i as u64, tags, "");
        let remote_only = i % 5 == 4 && !listed.is_empty();
        if remote_only {
            let host = *listed
                .iter()
                .nth(i % listed.len())
                .unwrap_or(&repo.relays[0]);
            s.remote[host].push(ann.clone());
            s.expected.push(ann.id);
        } else {
            listed.extend(repo.relays.iter().copied());
            s.own.push(ann);
        }
        let state = sign(
            &repo.owner,
            30618,
            now - 80_000,
            vec![tag(&["d", &repo.d]), tag(&["refs/heads/main", "0123abcd"])],
            "",
        );
        place(&mut s, repo, &mut rng, state, None);
    }
    for &relay in busy {
        let place = (relay, now - 75_000);
        add_issue(
            &mut s,
            &mut repos,
            &authors,
            place,
            BUSY_REPLIES,
            Stamps::Spread,
        );
    }
    if let Some(relay) = crowded {
        let place = (relay, now - 74_000);
        let replies = SAME_SECOND_REPLIES;
        add_issue(
            &mut s,
            &mut repos,
            &authors,
            place,
            replies,
            Stamps::OneSecond,
        );
    }
    if let Some(&relay) = strfry.first() {
        add_long_repo(
            &mut s,
            &owners[0],
            &authors,
            own_url,
            &urls[relay],
            relay,
            now - 73_000,
        );
    }
    let live_from = event_count - event_count / 10;
    for i in 0..event_count {
        let r = rng.gen_range(0..repos.len());
        let repo = &mut repos[r];
        // History is backdated; live events carry the time they are published
        // at (within seconds), as real clients stamp them.
        let at = if i >= live_from {
            now + ((i - live_from) / 50) as u64
        } else {
            now - 70_000 + i as u64
        };
        let event = event(repo, &authors, &mut rng, at);
        let is_root = matches!(event.kind.as_u16(), 1617 | 1618 | 1621);
        let at_relay = repo.relays[rng.gen_range(0..repo.relays.len())];
        if is_root {
            repo.roots.push((event.clone(), at_relay));
        }
        let live = (i >= live_from).then_some(at_relay);
        place(&mut s, repo, &mut rng, event, live);
    }
    // A twentieth more while the engine is down. Roots among them are not
    // replied to, so every one matches a filter the restarted engine builds
    // from what the own relay holds. They are stamped an hour back, as
    // events that reach a relay late are (published elsewhere first, or by
    // a client that was offline): no live subscription of the restarted
    // engine reaches back that far, only its historic sync finds them.
    for i in 0..(event_count / 20).max(1) {
        let repo = &repos[rng.gen_range(0..repos.len())];
        let event = event(repo, &authors, &mut rng, now - 3_600 + i as u64);
        let nip77: Vec<usize> = repo
            .relays
            .iter()
            .copied()
            .filter(|r| !req_only.contains(r))
            .collect();
        let choices = if nip77.is_empty() {
            &repo.relays
        } else {
            &nip77
        };
        let at_relay = choices[rng.gen_range(0..choices.len())];
        s.down.push((at_relay + 1, event));
    }
    s
}

/// GRASP-01's clone URL of a repository on the relay at `relay_url`:
/// `http://` for `ws://`, `https://` for `wss://`, then `/<npub>/<d>.git`.
fn clone_url(relay_url: &str, owner: &Keys, d: &str) -> String {
    let (scheme, rest) = relay_url.split_once("://").unwrap_or(("ws", relay_url));
    let http = if scheme.eq_ignore_ascii_case("wss") {
        "https"
    } else {
        "http"
    };
    let npub = owner
        .public_key()
        .to_bech32()
        .expect("a public key always encodes as npub");
    format!("{http}://{}/{npub}/{d}.git", rest.trim_end_matches('/'))
}

/// How the replies of [`add_issue`] are stamped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stamps {
    /// A second apart: a busy issue, more replies than one capped page.
    Spread,
    /// All in one second, as replies imported in bulk are: paging by
    /// `until` cannot get past that second, so the engine asks it again.
    OneSecond,
}

/// An issue of the first repo hosted on `relay` with `replies` NIP-22
/// replies stamped as `stamps` says, all history on that relay (no copy
/// on a misbehaving relay: that relay is not the point here). Nothing if
/// no repo lists it.
fn add_issue(
    s: &mut Scenario,
    repos: &mut [Repo],
    authors: &[Keys],
    (relay, at): (usize, u64),
    replies: usize,
    stamps: Stamps,
) {
    let Some(repo) = repos.iter_mut().find(|r| r.relays.contains(&relay)) else {
        return;
    };
    let coord = format!("30617:{}:{}", repo.owner.public_key().to_hex(), repo.d);
    let issue = sign(
        &authors[relay % authors.len()],
        1621,
        at,
        vec![
            tag(&["a", &coord]),
            tag(&["p", &repo.owner.public_key().to_hex()]),
        ],
        "a busy issue",
    );
    let id = issue.id.to_hex();
    let mut events = vec![issue.clone()];
    for j in 0..replies {
        let stamp = match stamps {
            Stamps::Spread => at + 1 + j as u64,
            Stamps::OneSecond => at + 1,
        };
        events.push(sign(
            &authors[j % authors.len()],
            1111,
            stamp,
            vec![tag(&["E", &id]), tag(&["e", &id]), tag(&["K", "1621"])],
            &format!("reply {j}"),
        ));
    }
    repo.roots.push((issue, relay));
    for event in events {
        s.expected.push(event.id);
        s.remote[relay].push(event);
    }
}

/// A repo whose `d` tag is [`LONG_D_LEN`] characters, announced on the own
/// relay, listing only strfry-like relay `relay` (at `url`), with an
/// issue and replies there. strfry refuses any REQ carrying its coordinate,
/// so none of it can be asked for: not expected, and the engine must
/// isolate it so the repos packed with it still sync.
fn add_long_repo(
    s: &mut Scenario,
    owner: &Keys,
    authors: &[Keys],
    own_url: &str,
    url: &str,
    relay: usize,
    at: u64,
) {
    let d = format!("long-{}", "d".repeat(LONG_D_LEN - 5));
    let relays = Tag::parse(["relays", own_url, url]).expect("the relays tag has a name");
    let clone = clone_url(own_url, owner, &d);
    let ann = sign(
        owner,
        30617,
        at,
        vec![tag(&["d", &d]), relays, tag(&["clone", &clone])],
        "",
    );
    let coord = format!("30617:{}:{d}", owner.public_key().to_hex());
    let issue = sign(&authors[1], 1621, at + 1, vec![tag(&["a", &coord])], "long");
    let id = issue.id.to_hex();
    let reply = sign(
        &authors[2],
        1111,
        at + 2,
        vec![tag(&["E", &id]), tag(&["e", &id])],
        "r",
    );
    s.own.push(ann);
    for event in [issue, reply] {
        s.unreachable.push(event.id);
        s.remote[relay].push(event);
    }
}

/// A root of `repo` (always when it has none yet), or a reply, status, PR
/// update or NIP-10 reply to one of its roots, created at `at`.
fn event(repo: &Repo, authors: &[Keys], rng: &mut SmallRng, at: u64) -> Event {
    let coord = format!("30617:{}:{}", repo.owner.public_key().to_hex(), repo.d);
    let author = &authors[rng.gen_range(0..authors.len())];
    if repo.roots.is_empty() || rng.gen_bool(0.3) {
        let kind = [1621, 1617, 1618][rng.gen_range(0..3)];
        sign(
            author,
            kind,
            at,
            vec![
                tag(&["a", &coord]),
                tag(&["p", &repo.owner.public_key().to_hex()]),
            ],
            "root",
        )
    } else {
        let (root, _) = &repo.roots[rng.gen_range(0..repo.roots.len())];
        let id = root.id.to_hex();
        match rng.gen_range(0..4) {
            0 => sign(
                author,
                1111,
                at,
                vec![
                    tag(&["E", &id]),
                    tag(&["e", &id]),
                    tag(&["K", &root.kind.as_u16().to_string()]),
                ],
                "reply",
            ),
            1 => sign(
                &repo.owner,
                1630 + rng.gen_range(0..4),
                at,
                vec![tag(&["e", &id])],
                "",
            ),
            2 => sign(
                author,
                1619,
                at,
                vec![tag(&["e", &id]), tag(&["a", &coord])],
                "PR update",
            ),
            _ => sign(author, 1, at, vec![tag(&["e", &id])], "NIP-10 reply"),
        }
    }
}

/// Puts an event of `repo` on one of its honest relays (now, or live
/// later) and expects it; a copy of history goes to its misbehaving relay.
fn place(s: &mut Scenario, repo: &Repo, rng: &mut SmallRng, event: Event, live: Option<usize>) {
    s.expected.push(event.id);
    match live {
        Some(relay) => s.live.push((relay + 1, event)),
        None => {
            if let Some(c) = repo.chaotic {
                s.chaotic[c].push(event.clone());
            }
            s.remote[repo.relays[rng.gen_range(0..repo.relays.len())]].push(event);
        }
    }
}

fn keys(rng: &mut SmallRng) -> Keys {
    loop {
        let bytes: [u8; 32] = rng.r#gen();
        if let Ok(sk) = SecretKey::from_slice(&bytes) {
            return Keys::new(sk);
        }
    }
}

fn tag(values: &[&str]) -> Tag {
    Tag::parse(values.iter().copied()).expect("tags built here always have a name")
}

fn sign(keys: &Keys, kind: u16, at: u64, tags: Vec<Tag>, content: &str) -> Event {
    EventBuilder::new(Kind::from_u16(kind), content)
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(at))
        .finalize(keys)
        .expect("signing with an in-memory key cannot fail")
}
