//! Asking relays for events: the GRASP-02 filters and their packing into
//! REQs (`filters`), one subscription and the paging of its history
//! (`subscription`), the result cap a relay showed (`result_cap`), what
//! a relay means when it ends or refuses one (`refusal`), and NIP-77
//! negentropy reconciliation of one filter (`reconcile`).
//!
//! Each piece knows one query on one relay; which relay gets what and
//! when is the engine's. May use `memory` (the index's ids and items),
//! `wire` (hex for NIP-77 frames) and `timing`; not the engine or
//! `own_relay`.

pub(crate) mod filters;
pub(crate) mod reconcile;
pub(crate) mod refusal;
pub(crate) mod result_cap;
pub(crate) mod subscription;
