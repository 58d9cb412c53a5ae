//! The start-up check of the payload key: does this broker's `QUEEN_ENCRYPTION_KEY` open the
//! newest sealed message of an encrypted queue? A broker started with another key than the one
//! its messages were sealed with finds out at once (docs/operations.md, "Encryption").

use crate::storage::segments::crypto::{open_with, CryptoError, PayloadKey};

/// What the start-up check of the key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyCheck {
    /// No sealed message is stored.
    NothingSealed,
    /// The newest sealed message of an encrypted queue opens with the key.
    Opens,
    /// It does not open (or there is no key): this message, of this queue, and why.
    Fails {
        /// The message's id.
        message_id: uuid::Uuid,
        /// Its queue.
        queue: String,
        /// Why it does not open.
        error: CryptoError,
    },
}

/// Tries `key` on the last sealed segment of one encrypted queue: a broker started with another
/// key than the one its messages were sealed with finds out at once. It lists the encrypted
/// queues, then looks at the newest segment of each of their partitions until one is sealed;
/// the partitions of other queues are never read (a million of them took seconds when one
/// statement joined them all before filtering).
///
/// # Errors
///
/// Any database error, or a segment that does not decode.
pub async fn check_key(
    conn: &mut sqlx::PgConnection,
    key: Option<&PayloadKey>,
) -> Result<KeyCheck, crate::storage::StorageError> {
    // The encrypted queues first (usually none): the partitions of the others are never read,
    // however many there are.
    let queues: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, name FROM queen.queues WHERE encryption_enabled ORDER BY id")
            .fetch_all(&mut *conn)
            .await?;
    let mut found: Option<(String, i64, Vec<u8>)> = None;
    for (queue_id, name) in queues {
        let sealed: Option<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT p.id, s.frames
               FROM queen.partitions p
              CROSS JOIN LATERAL (
                    SELECT frames FROM queen.segments
                     WHERE partition_id = p.id
                     ORDER BY base_offset DESC
                     LIMIT 1
              ) s
              WHERE p.queue_id = $1
                AND get_byte(s.frames, 0) = 2
              LIMIT 1",
        )
        .bind(queue_id)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some((partition, frames)) = sealed {
            found = Some((name, partition, frames));
            break;
        }
    }
    let Some((queue, partition, bytes)) = found else {
        return Ok(KeyCheck::NothingSealed);
    };
    let frames = crate::storage::segments::frames::decode(&bytes)
        .map_err(|source| crate::storage::StorageError::CorruptSegment { partition, source })?;
    let Some(frame) = frames.first() else {
        return Ok(KeyCheck::NothingSealed);
    };
    Ok(match open_with(key, frame.payload) {
        Ok(_) => KeyCheck::Opens,
        Err(error) => KeyCheck::Fails {
            message_id: frame.id,
            queue,
            error,
        },
    })
}
