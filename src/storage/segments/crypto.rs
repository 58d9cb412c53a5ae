//! Payload encryption at rest for queues with `encryptionEnabled` (reference §12.7).
//!
//! AES-256-GCM (RustCrypto's `aes-gcm`) with a fresh random 16-byte nonce per message, the key
//! from `QUEEN_ENCRYPTION_KEY`. A sealed payload is stored in Queen's shape, as JSON text:
//! `{"encrypted": b64, "iv": b64 (16 bytes), "authTag": b64 (16 bytes)}` (standard base64 with
//! padding). What is encrypted is the payload's JSON text exactly as received, so opening gives
//! back the same bytes.
//!
//! Whether a stored payload is sealed is never guessed from its shape: the segment says so
//! (`storage::segments::frames`, version byte). This module seals and opens, with no SQL; the
//! start-up check of the key is [`crate::storage::segments::key_check`]. It never decides which
//! queue is encrypted and never logs (its callers log with the message id).

use aes_gcm::aead::consts::U16;
use aes_gcm::aead::{AeadCore, AeadInPlace, KeyInit, OsRng};
use aes_gcm::aes::Aes256;
use aes_gcm::{AesGcm, Nonce, Tag};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::Deserialize;

/// AES-256-GCM with Queen's 16-byte IV.
type Cipher = AesGcm<Aes256, U16>;

/// The key of encrypted queues, ready to seal and open payloads.
#[derive(Clone)]
pub struct PayloadKey {
    cipher: Cipher,
}

impl std::fmt::Debug for PayloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PayloadKey(***)")
    }
}

/// Why a stored payload could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// Not the stored shape (`encrypted`, `iv`, `authTag` as base64 strings of the right size).
    #[error("stored payload is not an encrypted payload: {0}")]
    Shape(&'static str),
    /// Authentication failed: another key, or the stored bytes were changed.
    #[error("authentication failed (another key, or the stored payload was changed)")]
    Authentication,
    /// The broker has no key (`QUEEN_ENCRYPTION_KEY` is not set).
    #[error("QUEEN_ENCRYPTION_KEY is not set on this broker")]
    NoKey,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed<'a> {
    #[serde(borrow)]
    encrypted: &'a str,
    #[serde(borrow)]
    iv: &'a str,
    #[serde(borrow, rename = "authTag")]
    auth_tag: &'a str,
}

impl PayloadKey {
    /// A key from its 32 bytes.
    pub fn new(bytes: &[u8; 32]) -> Self {
        Self {
            cipher: Cipher::new(bytes.into()),
        }
    }

    /// Encrypts `plaintext` (a payload's JSON text) under a fresh random nonce and returns the
    /// stored shape as JSON text.
    pub fn seal(&self, plaintext: &str) -> String {
        let nonce = Cipher::generate_nonce(&mut OsRng);
        let mut buffer = plaintext.as_bytes().to_vec();
        let tag = self
            .cipher
            .encrypt_in_place_detached(&nonce, b"", &mut buffer)
            .expect("a payload within the body limit is far below GCM's length limit");
        let mut out = String::with_capacity(buffer.len() * 4 / 3 + 80);
        out.push_str("{\"encrypted\":\"");
        B64.encode_string(&buffer, &mut out);
        out.push_str("\",\"iv\":\"");
        B64.encode_string(nonce, &mut out);
        out.push_str("\",\"authTag\":\"");
        B64.encode_string(tag, &mut out);
        out.push_str("\"}");
        out
    }

    /// The plaintext JSON text of a sealed payload.
    ///
    /// # Errors
    ///
    /// [`CryptoError::Shape`] for text that is not the stored shape,
    /// [`CryptoError::Authentication`] when the tag does not match (another key, or changed
    /// bytes). Nothing unauthenticated is ever returned.
    pub fn open(&self, stored: &str) -> Result<String, CryptoError> {
        let sealed: Sealed<'_> =
            serde_json::from_str(stored).map_err(|_| CryptoError::Shape("not the JSON shape"))?;
        let iv = B64
            .decode(sealed.iv)
            .map_err(|_| CryptoError::Shape("iv is not base64"))?;
        let tag = B64
            .decode(sealed.auth_tag)
            .map_err(|_| CryptoError::Shape("authTag is not base64"))?;
        let mut buffer = B64
            .decode(sealed.encrypted)
            .map_err(|_| CryptoError::Shape("encrypted is not base64"))?;
        if iv.len() != 16 {
            return Err(CryptoError::Shape("iv is not 16 bytes"));
        }
        if tag.len() != 16 {
            return Err(CryptoError::Shape("authTag is not 16 bytes"));
        }
        self.cipher
            .decrypt_in_place_detached(
                Nonce::<U16>::from_slice(&iv),
                b"",
                &mut buffer,
                Tag::<U16>::from_slice(&tag),
            )
            .map_err(|_| CryptoError::Authentication)?;
        // Authenticated bytes are what this broker sealed: JSON text, hence UTF-8.
        String::from_utf8(buffer).map_err(|_| CryptoError::Shape("plaintext is not UTF-8"))
    }
}

/// Opens `stored` with `key`, or says that there is no key.
///
/// # Errors
///
/// As [`PayloadKey::open`], and [`CryptoError::NoKey`] without a key.
pub fn open_with(key: Option<&PayloadKey>, stored: &str) -> Result<String, CryptoError> {
    key.ok_or(CryptoError::NoKey)?.open(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> PayloadKey {
        PayloadKey::new(&[byte; 32])
    }

    #[test]
    fn a_sealed_payload_opens_to_the_same_bytes_and_each_seal_has_its_own_nonce() {
        let k = key(7);
        let text = r#"{"b":1,"a":1.10,"s":"\u00e9ü"}"#;
        let first = k.seal(text);
        let second = k.seal(text);
        assert_ne!(first, second, "a fresh nonce per message");
        assert_eq!(k.open(&first).unwrap(), text);
        assert_eq!(k.open(&second).unwrap(), text);
        let shape: serde_json::Value = serde_json::from_str(&first).unwrap();
        let iv = B64.decode(shape["iv"].as_str().unwrap()).unwrap();
        let tag = B64.decode(shape["authTag"].as_str().unwrap()).unwrap();
        assert_eq!((iv.len(), tag.len()), (16, 16));
        assert!(!first.contains("1.10"), "no plaintext in the stored form");
    }

    #[test]
    fn another_key_or_a_changed_byte_fails_authentication() {
        let sealed = key(1).seal("[1,2,3]");
        assert_eq!(key(2).open(&sealed), Err(CryptoError::Authentication));
        let mut shape: serde_json::Value = serde_json::from_str(&sealed).unwrap();
        let mut bytes = B64.decode(shape["encrypted"].as_str().unwrap()).unwrap();
        bytes[0] ^= 1;
        shape["encrypted"] = B64.encode(bytes).into();
        assert_eq!(
            key(1).open(&shape.to_string()),
            Err(CryptoError::Authentication)
        );
    }

    #[test]
    fn text_of_another_shape_is_refused() {
        let k = key(1);
        for text in [
            "{}",
            "[1]",
            r#"{"encrypted":"AA==","iv":"AA==","authTag":"AA=="}"#,
            r#"{"encrypted":"!","iv":"AAAAAAAAAAAAAAAAAAAAAA==","authTag":"AAAAAAAAAAAAAAAAAAAAAA=="}"#,
        ] {
            assert!(matches!(k.open(text), Err(CryptoError::Shape(_))), "{text}");
        }
        assert_eq!(open_with(None, "{}"), Err(CryptoError::NoKey));
    }
}
