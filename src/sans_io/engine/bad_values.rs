//! Refusals of one value: finding the item that carries it and asking
//! everything else.
//!
//! strfry refuses a whole REQ when any tag value in it is over 255 bytes
//! (`bad req: error parsing #a: filter item too large`). A repo whose `d`
//! tag is long enough gives such a coordinate, and anyone can publish one:
//! read as "message too large", the refusal halved the message size (which
//! never helps) and the same 100-repo chunk was asked again every minute,
//! so none of the repos packed with it synced.
//!
//! Instead, the items of a REQ refused for a value become suspects: their
//! chunks are asked alone (one REQ each), at half the size at each new
//! refusal, so the offending item stands alone after a few rounds while
//! the others sync. An item refused alone cannot be asked on that relay
//! at all: it is kept out of every later chunk and live filter there, and
//! said once in the log and in `Stats::items_unaskable`. A refusal that
//! says the value was too long also teaches the relay's value length
//! limit, so other items with values as long are never sent.

use std::collections::{HashMap, HashSet};

use log::{debug, warn};

use super::ctx::Ctx;
use super::limits::{Limits, MIN_VALUE_BYTES};
use super::targets::Targets;
use crate::sans_io::memory::index::Item;
use crate::sans_io::query::subscription::Subscription;
use crate::sans_io::wire::relay_text::relay_text;

/// A relay's items refused for one of their values, for the process's
/// life: those it cannot be asked for, and the suspects being narrowed
/// down to them. Empty on almost every relay (strfry refuses values over
/// 255 bytes; a repo's coordinate rarely is), so until a first refusal
/// it costs one pointer, not two empty tables per relay.
#[derive(Debug, Default)]
pub(super) struct BadValues(Option<Box<Values>>);

#[derive(Debug, Default)]
struct Values {
    /// Items the relay cannot be asked for: one of their values is
    /// refused alone (or breaks the relay's value limit). Kept out of
    /// every chunk and live filter on this relay.
    unaskable: HashSet<Item>,
    /// Items in a REQ the relay refused for one of its values (strfry's
    /// `filter item too large`), each with the most items its chunk may
    /// hold: halved at each refusal until the offending item stands
    /// alone. A suspect's chunk travels in a REQ of its own. Cleared by
    /// an EOSE.
    suspects: HashMap<Item, usize>,
}

impl BadValues {
    /// The relay cannot be asked for `item`.
    pub(super) fn is_unaskable(&self, item: &Item) -> bool {
        self.0.as_ref().is_some_and(|v| v.unaskable.contains(item))
    }

    /// The unaskable items.
    pub(super) fn unaskable(&self) -> impl Iterator<Item = &Item> {
        self.0.iter().flat_map(|v| v.unaskable.iter())
    }

    /// The most items a suspect's chunk may hold, if `item` is one.
    pub(super) fn suspect(&self, item: &Item) -> Option<usize> {
        self.0.as_ref()?.suspects.get(item).copied()
    }

    fn has_suspects(&self) -> bool {
        self.0.as_ref().is_some_and(|v| !v.suspects.is_empty())
    }

    /// True when any of `items` is a suspect: their chunk travels in a
    /// REQ of its own.
    pub(super) fn any_suspect(&self, items: &[Item]) -> bool {
        self.has_suspects() && items.iter().any(|i| self.suspect(i).is_some())
    }

    /// `items` (two or more) were in a REQ refused for one of their
    /// values: each becomes a suspect whose chunk holds at most half of
    /// them, so the offending one stands alone after a few rounds.
    fn isolate(&mut self, items: Vec<Item>) {
        let size = items.len().div_ceil(2);
        let suspects = &mut self.values().suspects;
        for item in items {
            let at = suspects.entry(item).or_insert(size);
            *at = (*at).min(size);
        }
    }

    /// `item` cannot be asked: no longer a suspect. True when it was not
    /// known unaskable before.
    fn mark_unaskable(&mut self, item: Item) -> bool {
        let values = self.values();
        values.suspects.remove(&item);
        values.unaskable.insert(item)
    }

    /// `items` were answered to EOSE: none of them is a suspect any more.
    pub(super) fn clear<'a>(&mut self, items: impl Iterator<Item = &'a Item>) {
        if !self.has_suspects() {
            return;
        }
        let suspects = &mut self.values().suspects;
        for item in items {
            suspects.remove(item);
        }
    }

    fn values(&mut self) -> &mut Values {
        self.0.get_or_insert_default()
    }
}

/// Steps on a refused value that reach past the relay's `BadValues`: the
/// limit a length refusal teaches (`limits`), the items a refused live
/// subscription confirmed (`targets`), and the engine's index to measure
/// values and name items in the log (`cx`).
impl BadValues {
    /// `sub` was refused for one of its values: its items (its chunks', or
    /// what a live subscription covered) are isolated further. Its
    /// batches were failed already, so the items are back in the diff.
    pub(super) fn refused(
        &mut self,
        cx: &mut Ctx,
        (limits, targets): (&mut Limits, &mut Targets),
        sub: &Subscription,
        too_long: bool,
    ) {
        let mut items: Vec<Item> = sub
            .work
            .iter()
            .flat_map(|w| w.items.iter())
            .copied()
            .collect();
        if items.is_empty() {
            items = sub.covers.iter().flatten().copied().collect();
            // Confirmed items of a refused live subscription go back to
            // history, where they are isolated like any refused chunk.
            targets.demote_confirmed(&items);
        }
        items.sort_unstable();
        items.dedup();
        match items.as_slice() {
            [] => debug!("{}: a value refused in a REQ of no items", cx.url()),
            [item] => self.refuse_item(cx, limits, *item, too_long),
            _ => {
                self.isolate(items);
                debug!("{}: isolating a refused value", cx.url());
            }
        }
        cx.mark_dirty();
    }

    /// `item` cannot be asked on the relay: one line, one count, and, for
    /// a length refusal, the relay's value limit lowered below its value.
    fn refuse_item(&mut self, cx: &mut Ctx, limits: &mut Limits, item: Item, too_long: bool) {
        let longest = longest_value(cx, item);
        if !self.mark_unaskable(item) {
            return;
        }
        if too_long && longest > MIN_VALUE_BYTES {
            limits.value_bytes = limits.value_bytes.min(longest - 1);
        }
        cx.stats.items_unaskable += 1;
        warn!(
            "{}: refuses to be asked for {} (a value of {longest} bytes); its events there are unreachable",
            cx.url(),
            item_name(cx, item)
        );
    }

    /// True when `item` may be asked on the relay; an item whose values
    /// break the relay's known value limit (`limits`) is marked unaskable
    /// here, before any REQ carries it.
    pub(super) fn askable(&mut self, cx: &mut Ctx, limits: &mut Limits, item: Item) -> bool {
        if self.is_unaskable(&item) {
            return false;
        }
        if longest_value(cx, item) > limits.value_bytes {
            self.refuse_item(cx, limits, item, false);
            return false;
        }
        true
    }
}

/// The longest tag value a filter for `item` carries: a repo's
/// coordinate (its `d` identifier is shorter), a root's 64-hex id.
fn longest_value(cx: &Ctx, item: Item) -> usize {
    match item {
        Item::Repo(repo) => cx.index.repo_coord(repo).len(),
        Item::Root(_) => 64,
    }
}

/// How the log names an item.
fn item_name(cx: &Ctx, item: Item) -> String {
    match item {
        Item::Repo(repo) => format!("repo {}", relay_text(cx.index.repo_coord(repo))),
        Item::Root(root) => format!("root {}", cx.index.root_event(root)),
    }
}
