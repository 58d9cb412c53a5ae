//! The transaction ids one lease handed out, with their offsets: what the common ack looks up
//! instead of reading the leased segments again.
//!
//! A pop writes every delivered message's `transactionId` into its answer; the same pass
//! records them here (one string buffer, not one allocation per id), and the broker keeps the
//! record with the lease's range (`storage::segments::cache`). An ack of that lease then finds each
//! acknowledged message's offset without the segments, cached or not. PostgreSQL still decides
//! whether the ack applies (the grouped statement checks the lease and its range).

/// Transaction id → offset for the messages of one lease on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTxns {
    /// The ids, one after the other.
    text: String,
    /// Where each id ends in `text`.
    ends: Vec<u32>,
    /// Each id's offset.
    offsets: Vec<i64>,
}

impl LeaseTxns {
    /// Records the delivered `(offset, transaction id)` pairs, in delivery order; `None` when
    /// two messages share an id (the ack then reads the segments, which resolve such an id to
    /// its first offset) or the ids do not fit the index.
    pub fn new<'a>(delivered: impl Iterator<Item = (i64, &'a str)>) -> Option<Self> {
        let (n, _) = delivered.size_hint();
        let mut txns = Self {
            text: String::new(),
            ends: Vec::with_capacity(n),
            offsets: Vec::with_capacity(n),
        };
        let mut seen = std::collections::HashSet::with_capacity(n);
        for (offset, id) in delivered {
            if !seen.insert(id) {
                return None;
            }
            if txns.text.is_empty() {
                txns.text.reserve(id.len() * n.max(1));
            }
            txns.text.push_str(id);
            txns.ends.push(u32::try_from(txns.text.len()).ok()?);
            txns.offsets.push(offset);
        }
        Some(txns)
    }

    /// Bytes held, for the broker's budget.
    pub fn bytes(&self) -> usize {
        self.text.len() + self.ends.len() * 4 + self.offsets.len() * 8 + 64
    }

    fn id(&self, n: usize) -> &str {
        let start = if n == 0 { 0 } else { self.ends[n - 1] as usize };
        &self.text[start..self.ends[n] as usize]
    }

    /// The offset of `id`. `hint` is where to look first: acks usually come in delivery
    /// order, so the caller passes the position after the previous match and the common
    /// lookup is one comparison; otherwise every id is compared.
    pub fn find(&self, id: &str, hint: usize) -> Option<(usize, i64)> {
        if hint < self.offsets.len() && self.id(hint) == id {
            return Some((hint, self.offsets[hint]));
        }
        (0..self.offsets.len())
            .find(|&n| self.id(n) == id)
            .map(|n| (n, self.offsets[n]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_in_order_and_out_of_it() {
        let txns = LeaseTxns::new([(5, "a"), (6, "bb"), (8, "ccc")].into_iter()).expect("index");
        assert_eq!(txns.find("a", 0), Some((0, 5)));
        assert_eq!(txns.find("bb", 1), Some((1, 6)));
        assert_eq!(txns.find("ccc", 2), Some((2, 8)));
        // A wrong hint still finds the id; an unknown id is not found.
        assert_eq!(txns.find("a", 2), Some((0, 5)));
        assert_eq!(txns.find("ccc", 9), Some((2, 8)));
        assert_eq!(txns.find("b", 1), None);
        assert_eq!(txns.find("", 0), None);
    }

    #[test]
    fn a_shared_id_gives_no_index() {
        assert!(LeaseTxns::new([(0, "x"), (1, "y"), (2, "x")].into_iter()).is_none());
        // Far apart among many distinct ids, still found.
        let ids: Vec<String> = (0..300).map(|n| format!("txn-{n}")).collect();
        let mut delivered: Vec<(i64, &str)> = ids
            .iter()
            .enumerate()
            .map(|(n, id)| (n as i64, id.as_str()))
            .collect();
        assert!(LeaseTxns::new(delivered.iter().copied()).is_some());
        delivered.push((300, "txn-7"));
        assert!(LeaseTxns::new(delivered.iter().copied()).is_none());
        let empty = LeaseTxns::new(std::iter::empty()).expect("index");
        assert_eq!(empty.find("x", 0), None);
    }
}
