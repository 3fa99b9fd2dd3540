//! A queued chunk's filters kept between REQs: `requests` builds them and
//! the relay table (`relay`) holds them, so the type lives apart from both
//! and neither file imports the other for it.

use crate::sans_io::query::filters::Encoded;
use crate::sans_io::query::subscription::WorkRef;

/// A queued chunk's filters, built for a REQ they did not fit, kept for
/// the next one (if the chunk and the page limit are still the same).
#[derive(Debug)]
pub(super) struct BuiltChunk {
    pub(super) work: WorkRef,
    pub(super) limit: usize,
    pub(super) filters: Vec<Encoded>,
}
