//! Lower-case hex, for NIP-77 messages (negentropy frames travel as hex)
//! and test challenges. nostr has its own hex code, but keeps it private.

/// `bytes` as lower-case hex.
pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    hex
}

/// Decodes hex (either case); `None` for an odd length or a non-hex digit.
pub fn decode(hex: &str) -> Option<Vec<u8>> {
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

fn nibble(digit: u8) -> Option<u8> {
    // to_digit(16) is below 16: the cast cannot truncate.
    char::from(digit).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_non_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&bytes)), Some(bytes));
        assert_eq!(decode("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode("abc"), None);
        assert_eq!(decode("0g"), None);
        assert_eq!(decode("+1"), None);
        assert_eq!(decode(""), Some(vec![]));
    }
}
