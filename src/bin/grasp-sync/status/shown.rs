//! Text from the metrics port made fit for a terminal: whatever answers
//! at ADDR chose it, so an escape sequence in a relay URL could clear the
//! screen, retitle the window or write the clipboard (OSC 52), and a
//! 50 KiB cell would widen every row of the table to 50 KiB.
//!
//! Every string `status` prints passes [`cell`]: hidden characters (the
//! engine's log classification, [`is_hidden`]) escaped visibly as
//! `\u{1b}`, then cut to a width.

use grasp_sync::internal::is_hidden;

/// `text` with its hidden characters escaped, cut to `width` characters
/// (the cut marked with `…`).
pub fn cell(text: &str, width: usize) -> String {
    let mut out: Vec<char> = Vec::with_capacity(width.min(256) + 1);
    for c in text.chars() {
        if is_hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > width {
            out.truncate(width.saturating_sub(1));
            out.push('…');
            break;
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_escaped_not_sent() {
        let hostile =
            "a\u{1b}[2J\u{1b}]0;owned\u{7}\u{1b}]52;c;ZWNobw==\u{7}\u{202e}gpj.exe\u{2028}z";
        let shown = cell(hostile, 500);
        assert!(!shown.chars().any(is_hidden), "{shown:?}");
        assert_eq!(
            shown,
            "a\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\u{1b}]52;c;ZWNobw==\\u{7}\\u{202e}gpj.exe\\u{2028}z"
        );
    }

    #[test]
    fn long_cells_are_cut_and_marked() {
        assert_eq!(cell("wss://short", 20), "wss://short");
        assert_eq!(cell("abcde", 5), "abcde");
        assert_eq!(cell("abcdefgh", 5), "abcd…");
        assert_eq!(cell(&"x".repeat(50_000), 40).chars().count(), 40);
        let escapes = cell(&"\u{1b}".repeat(100), 20);
        assert!(escapes.chars().count() <= 20, "{escapes}");
        assert!(escapes.ends_with('…'));
    }
}
