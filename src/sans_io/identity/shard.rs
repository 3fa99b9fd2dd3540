//! Sharding: which remote relays this engine connects to.
//!
//! `--shard I/N` splits the remote relays among N engines that share one
//! own relay and know nothing of each other: every engine subscribes to
//! the own relay and holds the whole index, but connects only to the
//! relays whose shard is its own. The own relay is never sharded.
//!
//! The shard of a relay is a pure function of its normalized URL, so
//! engines on different machines, builds and Rust versions agree without
//! talking: the 64-bit FNV-1a hash of the URL's UTF-8 bytes (offset basis
//! `0xcbf29ce484222325`, prime `0x100000001b3`, as published by Fowler,
//! Noll and Vo), passed through MurmurHash3's 64-bit finalizer `fmix64`
//! (FNV-1a alone barely moves its high bits for URLs that differ only in
//! their last characters, such as ports: 90% of one test farm fell in one
//! of two shards), then mapped onto `0..N` by its high bits
//! (`hash * N >> 64`, no modulo bias). std's `DefaultHasher` is
//! not used: its algorithm and keys may change between releases. The
//! golden table in the tests pins the function; changing it reshuffles
//! every deployment's relays, so it must never change.

use std::fmt;

/// FNV-1a 64 offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64 prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// One shard of N: this engine connects to the remote relays that
/// [`Shard::owns`]. Only valid shards exist (`index < count`, `count ≥ 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Default for Shard {
    /// 0/1: every relay.
    fn default() -> Self {
        Shard { index: 0, count: 1 }
    }
}

impl Shard {
    /// Shard `index` of `count`; `None` unless `index < count`.
    pub fn new(index: u32, count: u32) -> Option<Shard> {
        (index < count).then_some(Shard { index, count })
    }

    /// Parses `I/N` (as `--shard` spells it).
    pub fn parse(text: &str) -> Option<Shard> {
        let (index, count) = text.trim().split_once('/')?;
        Shard::new(index.parse().ok()?, count.parse().ok()?)
    }

    /// This shard's number, from 0.
    pub fn index(self) -> u32 {
        self.index
    }

    /// How many shards there are.
    pub fn count(self) -> u32 {
        self.count
    }

    /// True when the relay at `normalized_url` belongs to this shard.
    pub fn owns(self, normalized_url: &str) -> bool {
        shard_of(normalized_url, self.count) == self.index
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The shard (of `count`) that `normalized_url` falls in.
pub fn shard_of(normalized_url: &str, count: u32) -> u32 {
    let hash = fmix64(fnv1a64(normalized_url.as_bytes()));
    ((u128::from(hash) * u128::from(count)) >> 64) as u32
}

/// 64-bit FNV-1a.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// MurmurHash3's 64-bit finalizer: every input bit flips each output bit
/// with probability about one half.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// Pins the partition: these must never change, or shards of
    /// different versions would disagree. (Computed apart, in Python, from
    /// the definition in the module's documentation.)
    #[test]
    fn golden_table_of_relays_and_their_shards() {
        let golden: [(&str, u32, u32); 6] = [
            ("wss://relay.damus.io", 4, 1),
            ("wss://nos.lol", 4, 3),
            ("wss://relay.ngit.dev", 4, 2),
            ("wss://gitnostr.com", 4, 1),
            ("ws://127.0.0.1:7000", 2, 0),
            ("ws://127.0.0.1:7001", 2, 1),
        ];
        for (url, count, shard) in golden {
            assert_eq!(shard_of(url, count), shard, "{url} of {count}");
        }
    }

    /// Pins the spellings that normalize together (issue 26: a host's
    /// trailing dot, percent-encoded unreserved characters), so that the
    /// shard a relay falls in is decided once for all its spellings.
    /// Under the old canonical forms `wss://relay.example.` was in shard
    /// 2 of 4, `wss://relay.ngit.dev.` and `wss://r.example/%7eu` in 3:
    /// relays moved once, with that change. (Shards computed apart, in
    /// Python.)
    #[test]
    fn golden_table_of_spellings_their_canonical_form_and_shard() {
        use crate::sans_io::identity::relay_url::normalize;
        let golden: [(&str, &str, u32); 6] = [
            ("wss://relay.example.", "wss://relay.example", 3),
            ("wss://Relay.Example", "wss://relay.example", 3),
            ("wss://relay.ngit.dev.", "wss://relay.ngit.dev", 2),
            ("wss://r.example/%7eu", "wss://r.example/~u", 2),
            ("wss://r.example/%7Eu", "wss://r.example/~u", 2),
            ("wss://r.example/~u/", "wss://r.example/~u", 2),
        ];
        for (raw, canonical, shard) in golden {
            let url = normalize(raw).unwrap();
            assert_eq!(url, canonical, "{raw}");
            assert_eq!(shard_of(&url, 4), shard, "{raw} of 4");
        }
    }

    #[test]
    fn n_shards_cover_every_relay_exactly_once() {
        for count in 1..=7 {
            let shards: Vec<Shard> = (0..count).map(|i| Shard::new(i, count).unwrap()).collect();
            let mut per_shard = vec![0usize; count as usize];
            for port in 1000..3000 {
                let url = format!("ws://127.0.0.1:{port}");
                let owners: Vec<u32> = shards
                    .iter()
                    .filter(|s| s.owns(&url))
                    .map(|s| s.index())
                    .collect();
                assert_eq!(owners.len(), 1, "{url} of {count}: {owners:?}");
                per_shard[owners[0] as usize] += 1;
            }
            // Balanced enough that no shard idles: each within 25% of fair.
            let fair = 2000 / count as usize;
            for n in per_shard {
                assert!(
                    n * 4 > fair * 3 && n * 4 < fair * 5,
                    "{count}: {n} vs {fair}"
                );
            }
        }
    }

    #[test]
    fn only_valid_shards_parse() {
        assert_eq!(Shard::parse("1/3"), Shard::new(1, 3));
        assert_eq!(Shard::parse("0/1"), Some(Shard::default()));
        for bad in ["3/3", "0/0", "1", "-1/2", "a/2", "1/2/3", ""] {
            assert_eq!(Shard::parse(bad), None, "{bad}");
        }
        assert_eq!(Shard::new(2, 5).unwrap().to_string(), "2/5");
    }
}
