//! Relay-provided text (NOTICE, CLOSED and OK reasons) made fit for a log.
//!
//! A relay chooses these strings: up to a frame (1 MiB) each, thousands a
//! second, with newlines that would forge log lines of their own. The log
//! writer is synchronous, so a flood of them also stalls the loop behind a
//! slow journal. So relay text is logged only through [`relay_text`]
//! (truncated to [`RELAY_TEXT_MAX`] characters, hidden characters escaped)
//! and under a per-relay [`LogBudget`].
//!
//! Hidden characters ([`is_hidden`]) are the ones a reader cannot see for
//! what they are: controls (newlines forge lines, `ESC` drives the
//! terminal), format characters (U+202E turns the rest of a line around,
//! zero-width ones hide text) and the line and paragraph separators. The
//! `status` CLI escapes the same set, so the classification lives here
//! once.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::sans_io::timing::time::Time;

/// Characters of relay text a log line shows at most.
pub(crate) const RELAY_TEXT_MAX: usize = 200;
/// Lines of relay text one relay may log per [`LOG_WINDOW`].
pub(crate) const LOG_LINES_PER_WINDOW: u32 = 10;
/// The window [`LOG_LINES_PER_WINDOW`] counts over.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(60);

/// Relay text shown safely: at most [`RELAY_TEXT_MAX`] characters, hidden
/// characters ([`is_hidden`], newlines included) escaped, an ellipsis when
/// cut.
pub(crate) fn relay_text(text: &str) -> RelayText<'_> {
    RelayText(text)
}

/// See [`relay_text`]; formats without allocating.
pub(crate) struct RelayText<'a>(&'a str);

impl fmt::Display for RelayText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.chars().enumerate() {
            if i == RELAY_TEXT_MAX {
                return f.write_str("…");
            }
            if is_hidden(c) {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// Whether `c` must be escaped before a person reads it: a control
/// character (Unicode `Cc`), a format character (`Cf`) or U+2028/U+2029.
/// `Cf` is listed by hand from the Unicode Character Database rather than
/// taken from a crate: it changes rarely, and a format character added
/// later and shown raw hides text, it cannot forge a line (only `Cc` and
/// the separators break lines).
pub fn is_hidden(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') || is_format(c)
}

/// Unicode general category `Cf`.
fn is_format(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// The tail of a line [`LogBudget::admit`] let through: how many lines
/// of the relay's were dropped before it, if any.
pub(crate) fn dropped(lines: u64) -> Dropped {
    Dropped(lines)
}

/// See [`dropped`].
pub(crate) struct Dropped(u64);

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} earlier lines of this relay's not logged)"),
        }
    }
}

/// How many lines of relay text each relay logged in its current window.
/// Lines over budget are counted, not logged; the first line of the next
/// window says how many were dropped.
#[derive(Debug, Default)]
pub(crate) struct LogBudget {
    windows: HashMap<usize, Window>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Time,
    logged: u32,
    dropped: u64,
}

impl LogBudget {
    /// Whether relay `key` may log a line now: `Some(dropped)` (lines
    /// suppressed since its last logged one) if so, `None` if over budget.
    pub(crate) fn admit(&mut self, key: usize, now: Time) -> Option<u64> {
        let w = self.windows.entry(key).or_insert(Window {
            start: now,
            logged: 0,
            dropped: 0,
        });
        if now.since(w.start) >= LOG_WINDOW {
            w.start = now;
            w.logged = 0;
        }
        if w.logged >= LOG_LINES_PER_WINDOW {
            w.dropped += 1;
            return None;
        }
        w.logged += 1;
        Some(std::mem::take(&mut w.dropped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_and_control_characters_escaped() {
        let forged = format!(
            "blocked\n[INFO] forged line\r\t\u{1b}[31m{}",
            "x".repeat(5000)
        );
        let shown = relay_text(&forged).to_string();
        assert!(!shown.contains('\n') && !shown.contains('\r') && !shown.contains('\u{1b}'));
        assert!(
            shown.starts_with("blocked\\n[INFO] forged line\\r\\t\\u{1b}[31m"),
            "{shown}"
        );
        assert!(shown.ends_with('…'));
        assert!(
            shown.chars().count() < RELAY_TEXT_MAX + 40,
            "{}",
            shown.len()
        );
        assert_eq!(
            relay_text("rate-limited: slow down").to_string(),
            "rate-limited: slow down"
        );
    }

    #[test]
    fn format_characters_and_separators_are_escaped_too() {
        let hidden = "a\u{202E}txt.exe\u{2028}b\u{2029}c\u{200B}d\u{FEFF}e\u{E0041}f\u{AD}g";
        let shown = relay_text(hidden).to_string();
        assert_eq!(
            shown,
            "a\\u{202e}txt.exe\\u{2028}b\\u{2029}c\\u{200b}d\\u{feff}e\\u{e0041}f\\u{ad}g"
        );
        for c in ['\u{202A}', '\u{2066}', '\u{061C}', '\u{1D173}', '\u{13430}'] {
            assert!(is_hidden(c), "{c:?}");
        }
        for c in ['a', 'é', '€', '\u{2010}', '\u{FFFC}', '😀', ' '] {
            assert!(!is_hidden(c), "{c:?}");
        }
    }

    #[test]
    fn each_relay_logs_a_few_lines_per_window_and_the_rest_are_counted() {
        let mut budget = LogBudget::default();
        let t0 = Time::from_millis(1_000);
        let logged = (0..1000).filter(|_| budget.admit(1, t0).is_some()).count();
        assert_eq!(logged, LOG_LINES_PER_WINDOW as usize);
        assert_eq!(
            budget.admit(2, t0),
            Some(0),
            "another relay has its own budget"
        );
        let later = t0 + LOG_WINDOW;
        assert_eq!(
            budget.admit(1, later),
            Some(1000 - LOG_LINES_PER_WINDOW as u64)
        );
        assert_eq!(budget.admit(1, later), Some(0));
        assert_eq!(dropped(0).to_string(), "");
        assert!(dropped(3).to_string().contains("3 earlier lines"));
    }
}
