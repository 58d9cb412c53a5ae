//! The one name rule: a queue, partition, consumer group, transactionId, traceId or token `sub`
//! holds at most [`MAX_NAME_CHARS`] characters (characters, not bytes). The frame format in
//! `storage::frames` relies on it for its field widths.

use std::fmt;

/// Longest queue, partition, transactionId, traceId or `sub`, in characters.
pub const MAX_NAME_CHARS: usize = 255;

/// A string that passed the name rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Name(String);

/// A name longer than [`MAX_NAME_CHARS`] characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("is longer than {MAX_NAME_CHARS} characters")]
pub struct NameTooLong;

impl Name {
    /// Checks the rule.
    ///
    /// # Errors
    ///
    /// [`NameTooLong`] past [`MAX_NAME_CHARS`] characters.
    pub fn new(text: impl Into<String>) -> Result<Self, NameTooLong> {
        let text = text.into();
        if Self::fits(&text) {
            Ok(Self(text))
        } else {
            Err(NameTooLong)
        }
    }

    /// Whether `text` keeps the rule (for callers that only need the answer).
    pub fn fits(text: &str) -> bool {
        // Counting stops one past the limit, so a huge string costs no more than a short one.
        text.chars().take(MAX_NAME_CHARS + 1).count() <= MAX_NAME_CHARS
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_characters_not_bytes() {
        assert!(Name::new("é".repeat(255)).is_ok());
        assert_eq!(Name::new("x".repeat(256)), Err(NameTooLong));
        assert!(Name::fits(""));
        assert_eq!(NameTooLong.to_string(), "is longer than 255 characters");
    }
}
