//! The pages the metrics port serves, rendered once and shared.
//!
//! Rendering runs on the loop thread, and at thousands of relays a status
//! view takes milliseconds and its JSON a megabyte; sixteen clients that
//! ask and never read used to cost a render and a copy each. So a page,
//! once rendered, is served to every client that asks for it within
//! [`PAGE_TTL`], each connection holding a reference (an `Arc`: the shell is moved
//! onto its thread once) and its offset, not a
//! copy. What the port holds in pages (fresh ones, and older ones still
//! being written to a slow client) is bounded by [`PAGES_BYTES_MAX`]:
//! past it, a page not at hand is refused (503) rather than rendered,
//! until connections finish or meet their deadline.
//!
//! `/metrics` is the exception to sharing: a scrape reads the counters as
//! they are when it asks (a test, or an alert, that waits for a count must
//! not read one a second old), and the page is small (11 KB, under a
//! millisecond at 5,390 relays). Its bytes still count against the
//! budget while a connection writes them.

use std::sync::Arc;
use std::time::Duration;

use crate::sans_io::timing::time::Time;
use crate::shell::metrics_server::Resource;
use crate::shell::status::Window;

/// How long a rendered page is served to every client that asks: longer
/// than a burst of requests, shorter than any scrape interval.
pub(crate) const PAGE_TTL: Duration = Duration::from_secs(1);
/// Bytes of pages the port holds at most before it refuses to render
/// another (one page may pass it: its size is known once rendered).
pub(crate) const PAGES_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Fresh pages kept at once (a page is a resource and, for
/// `/status.json`, a window).
const FRESH_MAX: usize = 8;

/// Which page: the resource and, for `/status.json`, its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageKey {
    resource: Resource,
    window: Window,
}

impl PageKey {
    /// Whether the page is shared while fresh: all but `/metrics`.
    fn shared(self) -> bool {
        self.resource != Resource::Metrics
    }

    /// The page of `resource` a request with `window` gets: only
    /// `/status.json` pages its relays.
    pub(crate) fn new(resource: Resource, window: Window) -> PageKey {
        let window = match resource {
            Resource::StatusJson => window,
            _ => Window::default(),
        };
        PageKey { resource, window }
    }
}

/// One rendered page.
struct Page {
    key: PageKey,
    at: Time,
    body: Arc<[u8]>,
}

/// Pages at hand, and older ones connections still write.
#[derive(Default)]
pub(crate) struct Pages {
    fresh: Vec<Page>,
    /// Pages past their time (or pushed out) that a connection still
    /// holds; counted until the last lets go.
    retired: Vec<Arc<[u8]>>,
}

impl Pages {
    /// The page `key` if one was rendered within [`PAGE_TTL`] of `now`.
    pub(crate) fn get(&mut self, key: PageKey, now: Time) -> Option<Arc<[u8]>> {
        self.expire(now);
        let page = self.fresh.iter().find(|p| p.key == key)?;
        Some(Arc::clone(&page.body))
    }

    /// Whether another page may be rendered: what is held is under
    /// [`PAGES_BYTES_MAX`].
    pub(crate) fn has_room(&mut self, now: Time) -> bool {
        self.expire(now);
        self.held() < PAGES_BYTES_MAX
    }

    /// Keeps `body`, rendered at `now`, as the page `key` (a page not
    /// shared is only counted while a connection holds it).
    pub(crate) fn insert(&mut self, key: PageKey, now: Time, body: Arc<[u8]>) {
        if !key.shared() {
            return self.retired.push(body);
        }
        if let Some(at) = self.fresh.iter().position(|p| p.key == key) {
            self.retire(at);
        }
        if self.fresh.len() >= FRESH_MAX {
            self.retire(0);
        }
        self.fresh.push(Page { key, at: now, body });
    }

    /// Bytes of every page held: fresh, or retired and still written.
    pub(crate) fn held(&self) -> usize {
        let fresh: usize = self.fresh.iter().map(|p| p.body.len()).sum();
        fresh + self.retired.iter().map(|b| b.len()).sum::<usize>()
    }

    /// Retires pages past their time; forgets retired pages no
    /// connection holds any more.
    fn expire(&mut self, now: Time) {
        while let Some(at) = self.fresh.iter().position(|p| now.since(p.at) >= PAGE_TTL) {
            self.retire(at);
        }
        self.retired.retain(|b| Arc::strong_count(b) > 1);
    }

    fn retire(&mut self, at: usize) {
        let page = self.fresh.remove(at);
        if Arc::strong_count(&page.body) > 1 {
            self.retired.push(page.body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: usize) -> Arc<[u8]> {
        Arc::from(vec![b'x'; n])
    }

    #[test]
    fn a_page_is_shared_until_its_time_is_up() {
        let mut pages = Pages::default();
        let t0 = Time::from_millis(10_000);
        let key = PageKey::new(Resource::StatusJson, Window::default());
        assert!(pages.get(key, t0).is_none());
        pages.insert(key, t0, body(100));
        let a = pages.get(key, t0 + Duration::from_millis(999)).unwrap();
        let b = pages.get(key, t0 + Duration::from_millis(999)).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one page, no copy per connection");
        let other = PageKey::new(
            Resource::StatusJson,
            Window {
                offset: 500,
                limit: 500,
            },
        );
        assert!(
            pages.get(other, t0).is_none(),
            "another window is another page"
        );
        assert_eq!(
            PageKey::new(Resource::Metrics, other.window),
            PageKey::new(Resource::Metrics, Window::default()),
            "only status.json has windows"
        );
        assert!(pages.get(key, t0 + PAGE_TTL).is_none(), "stale");
        assert_eq!(
            pages.held(),
            100,
            "still written by the connections holding it"
        );
        drop((a, b));
        assert!(pages.has_room(t0 + PAGE_TTL));
        assert_eq!(pages.held(), 0, "let go once nobody writes it");
    }

    #[test]
    fn the_metrics_page_is_never_served_old_but_counted_while_written() {
        let mut pages = Pages::default();
        let t0 = Time::from_millis(10_000);
        let key = PageKey::new(Resource::Metrics, Window::default());
        let written = body(11_000);
        pages.insert(key, t0, Arc::clone(&written));
        assert!(pages.get(key, t0).is_none(), "each scrape gets a fresh one");
        assert_eq!(pages.held(), 11_000);
        drop(written);
        assert!(pages.has_room(t0));
        assert_eq!(pages.held(), 0);
    }

    #[test]
    fn what_slow_clients_hold_counts_against_the_budget() {
        let mut pages = Pages::default();
        let mut held = Vec::new();
        let mut t = Time::from_millis(10_000);
        while pages.has_room(t) {
            let key = PageKey::new(Resource::Status, Window::default());
            pages.insert(key, t, body(1024 * 1024));
            held.push(pages.get(key, t).unwrap());
            t = t + PAGE_TTL;
        }
        assert_eq!(pages.held(), PAGES_BYTES_MAX);
        assert_eq!(held.len(), PAGES_BYTES_MAX / (1024 * 1024));
        held.pop();
        assert!(pages.has_room(t), "room again once a client finishes");
    }
}
