//! The one name rule: a queue, partition, consumer group, transactionId, traceId or token `sub`
//! holds at most [`MAX_NAME_CHARS`] characters (characters, not bytes) and no NUL character
//! (U+0000, which PostgreSQL's text type cannot hold: a name with one would be refused by every
//! statement that stores it). The frame format in `storage::segments::frames` relies on the length for its
//! field widths.

use std::fmt;

/// Longest queue, partition, transactionId, traceId or `sub`, in characters.
pub const MAX_NAME_CHARS: usize = 255;

/// A string that passed the name rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Name(String);

/// Why a string is not a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Longer than [`MAX_NAME_CHARS`] characters.
    #[error("is longer than {MAX_NAME_CHARS} characters")]
    TooLong,
    /// Holds a NUL character.
    #[error("must not contain NUL characters")]
    Nul,
}

impl Name {
    /// Checks the rule.
    ///
    /// # Errors
    ///
    /// [`NameError`] past [`MAX_NAME_CHARS`] characters or with a NUL character.
    pub fn new(text: impl Into<String>) -> Result<Self, NameError> {
        let text = text.into();
        Self::check(&text)?;
        Ok(Self(text))
    }

    /// Checks the rule without taking the text.
    ///
    /// # Errors
    ///
    /// [`NameError`] as for [`Name::new`].
    pub fn check(text: &str) -> Result<(), NameError> {
        if text.chars().take(MAX_NAME_CHARS + 1).count() > MAX_NAME_CHARS {
            return Err(NameError::TooLong);
        }
        if text.contains('\0') {
            return Err(NameError::Nul);
        }
        Ok(())
    }

    /// Whether `text` keeps the rule (for callers that only need the answer).
    pub fn fits(text: &str) -> bool {
        // Counting stops one past the limit, so a huge string costs no more than a short one.
        text.chars().take(MAX_NAME_CHARS + 1).count() <= MAX_NAME_CHARS && !text.contains('\0')
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
        assert_eq!(Name::new("x".repeat(256)), Err(NameError::TooLong));
        assert_eq!(Name::new("a\0b"), Err(NameError::Nul));
        assert!(!Name::fits("\0"));
        assert!(Name::fits(""));
        assert_eq!(
            NameError::TooLong.to_string(),
            "is longer than 255 characters"
        );
    }
}
