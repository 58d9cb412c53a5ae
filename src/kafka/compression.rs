//! Decompressing a produce's record batches within a byte budget.
//!
//! The codec crate inflates a batch whole, however large it becomes: a few hundred KiB of gzip
//! can declare gigabytes. So Produce hands it this decompressor instead, which stops (an error,
//! answered `MESSAGE_TOO_LARGE`) as soon as one request's batches would inflate past its
//! budget (`QUEEN_MAX_BODY_BYTES`, the largest HTTP push body). Formats as Kafka writes them:
//! gzip (one or more members), snappy (xerial framing, or raw as the Java client accepts), lz4
//! frames, zstd frames.

use std::cell::Cell;
use std::io::Read;

use bytes::{Buf, Bytes};
use kafka_protocol::records::Compression;

/// The xerial snappy stream header Kafka's clients write.
const SNAPPY_MAGIC: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

/// The budget left for one request (bytes of decompressed records).
pub struct Budget(Cell<usize>);

impl Budget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        Self(Cell::new(bytes))
    }

    fn take(&self, bytes: usize) -> anyhow::Result<()> {
        let left = self.0.get();
        if bytes > left {
            anyhow::bail!("the batches inflate past the request's budget");
        }
        self.0.set(left - bytes);
        Ok(())
    }

    /// Reads `reader` to its end within the budget.
    fn read_all(&self, reader: impl Read) -> anyhow::Result<Bytes> {
        let left = self.0.get();
        let mut out = Vec::new();
        reader
            .take(left as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| anyhow::anyhow!("does not decompress: {e}"))?;
        self.take(out.len())?;
        Ok(Bytes::from(out))
    }
}

/// Whether an error came from the budget (and not from bytes that do not decompress).
pub fn over_budget(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.to_string().contains("inflate past the request's budget"))
}

/// Decompresses one batch's records (the codec's custom decompressor).
///
/// # Errors
///
/// Bytes that do not decompress, or more than the budget.
pub fn decompress(
    budget: &Budget,
    data: &mut Bytes,
    compression: Compression,
) -> anyhow::Result<Bytes> {
    let data = data.split_to(data.len());
    match compression {
        Compression::None => Ok(data),
        Compression::Gzip => budget.read_all(flate2::read::MultiGzDecoder::new(data.reader())),
        Compression::Zstd => budget.read_all(
            zstd::stream::read::Decoder::new(data.reader())
                .map_err(|e| anyhow::anyhow!("zstd: {e}"))?,
        ),
        Compression::Lz4 => budget
            .read_all(lz4::Decoder::new(data.reader()).map_err(|e| anyhow::anyhow!("lz4: {e}"))?),
        Compression::Snappy => snappy(budget, data),
    }
}

fn snappy(budget: &Budget, data: Bytes) -> anyhow::Result<Bytes> {
    let raw = |block: &[u8]| -> anyhow::Result<Vec<u8>> {
        let len = snap::raw::decompress_len(block).map_err(|e| anyhow::anyhow!("snappy: {e}"))?;
        // Checked before the output is allocated: the length is what the block declares.
        budget.take(len)?;
        let mut out = vec![0u8; len];
        snap::raw::Decoder::new()
            .decompress(block, &mut out)
            .map_err(|e| anyhow::anyhow!("snappy: {e}"))?;
        Ok(out)
    };
    if !data.starts_with(SNAPPY_MAGIC) {
        return raw(&data).map(Bytes::from);
    }
    let mut rest = &data[SNAPPY_MAGIC.len()..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        if rest.len() < 4 {
            anyhow::bail!("snappy: a block length is cut off");
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        if rest.len() < len {
            anyhow::bail!("snappy: a block is cut off");
        }
        out.extend_from_slice(&raw(&rest[..len])?);
        rest = &rest[len..];
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_gzip_bomb_stops_at_the_budget() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![0u8; 8 << 20]).expect("compress");
        let bomb = Bytes::from(gz.finish().expect("compress"));
        assert!(bomb.len() < 64 << 10);
        let e = decompress(&Budget::new(1 << 20), &mut bomb.clone(), Compression::Gzip)
            .expect_err("over the budget");
        assert!(over_budget(&e), "{e:#}");
        let ok = decompress(&Budget::new(9 << 20), &mut bomb.clone(), Compression::Gzip)
            .expect("within the budget");
        assert_eq!(ok.len(), 8 << 20);
    }

    #[test]
    fn every_codec_round_trips_and_garbage_is_an_error() {
        let text = b"records records records".repeat(100);
        let zstd = zstd::encode_all(&text[..], 3).expect("zstd");
        let snappy_raw = snap::raw::Encoder::new()
            .compress_vec(&text)
            .expect("snappy");
        let mut framed = SNAPPY_MAGIC.to_vec();
        framed.extend_from_slice(&(snappy_raw.len() as u32).to_be_bytes());
        framed.extend_from_slice(&snappy_raw);
        let mut lz = lz4::EncoderBuilder::new().build(Vec::new()).expect("lz4");
        lz.write_all(&text).expect("lz4");
        let (lz, done) = lz.finish();
        done.expect("lz4");
        for (c, bytes) in [
            (Compression::Zstd, zstd),
            (Compression::Snappy, snappy_raw),
            (Compression::Snappy, framed),
            (Compression::Lz4, lz),
        ] {
            let out = decompress(&Budget::new(1 << 20), &mut Bytes::from(bytes), c)
                .unwrap_or_else(|e| panic!("{c:?}: {e:#}"));
            assert_eq!(&out[..], &text[..], "{c:?}");
        }
        for c in [
            Compression::Gzip,
            Compression::Zstd,
            Compression::Snappy,
            Compression::Lz4,
        ] {
            let mut garbage = Bytes::from_static(
                b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff",
            );
            assert!(
                decompress(&Budget::new(1 << 20), &mut garbage, c).is_err(),
                "{c:?}"
            );
        }
    }
}
