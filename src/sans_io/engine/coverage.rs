//! A relay's live coverage as one watermark that outlives its
//! connections: from when its live events may have been missed, and
//! whether its announcements (Layer 1) are owed a read from the start.
//!
//! While connected, a gap is what the next consolidation reads again
//! (items synced without a live subscription of their own, a refused
//! live set); when the connection ends, the gap moves back to where the
//! live set's coverage ended, and a quick reconnect catches up from it.
//! One watermark for both: the two were kept apart, with the same
//! min-update written four times.

use crate::sans_io::timing::time::Time;

/// Where live coverage of a relay is broken, kept across connections.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Coverage {
    /// Live events from here on may be missing (`None`: none are).
    gap: Option<Time>,
    /// Layer 1 was cut before it was read to the end: the next live set
    /// asks it from the beginning.
    layer1_unread: bool,
}

impl Coverage {
    /// Coverage restored from a saved state.
    pub(super) fn restored(gap: Time, layer1_unread: bool) -> Coverage {
        Coverage {
            gap: Some(gap),
            layer1_unread,
        }
    }

    /// Live coverage has a gap from `since` (the watermark only moves
    /// back).
    pub(super) fn gap_from(&mut self, since: Time) {
        self.gap = Some(self.gap.map_or(since, |t| t.min(since)));
    }

    /// Where the gap starts, if there is one.
    pub(super) fn gap(&self) -> Option<Time> {
        self.gap
    }

    /// The gap is being read again: coverage is whole from here on.
    pub(super) fn take_gap(&mut self) -> Option<Time> {
        self.gap.take()
    }

    /// Layer 1 is owed a read from the beginning.
    pub(super) fn owe_layer1(&mut self, owed: bool) {
        self.layer1_unread |= owed;
    }

    /// Whether Layer 1 is owed a read from the beginning.
    pub(super) fn layer1_unread(&self) -> bool {
        self.layer1_unread
    }

    /// Layer 1 goes into a live set read from the beginning: nothing owed.
    pub(super) fn take_layer1(&mut self) -> bool {
        std::mem::take(&mut self.layer1_unread)
    }

    /// A fresh sync reads everything from the beginning: nothing is owed.
    pub(super) fn clear(&mut self) {
        *self = Coverage::default();
    }
}
