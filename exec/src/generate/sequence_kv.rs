//! The KV cache of one sequence of a decode step: a prompt's rows that parallel samples
//! share (read only, never copied), then the sequence's own rows.

use std::ops::Range;

use crate::state::KvCache;

/// The KV cache one sequence of a decode step reads and extends, per layer: positions
/// `0..shared_len` in `shared` (a prompt's cache that parallel samples share, read only,
/// never copied), the rest in `own` (row `p - shared_len` holds position `p`).
#[derive(Debug)]
pub struct SequenceKv<'a> {
    shared: &'a [KvCache],
    pub(super) shared_len: usize,
    pub(super) own: &'a mut [KvCache],
}

impl<'a> SequenceKv<'a> {
    /// A sequence with a cache of its own from position 0.
    pub fn alone(own: &'a mut [KvCache]) -> Self {
        Self {
            shared: &[],
            shared_len: 0,
            own,
        }
    }

    /// A sequence after `shared_len` positions of `shared` (per layer, as many layers as
    /// `own`), its later positions in `own`.
    pub fn after_prefix(shared: &'a [KvCache], shared_len: usize, own: &'a mut [KvCache]) -> Self {
        Self {
            shared,
            shared_len,
            own,
        }
    }

    /// Layer `layer`'s rows as attention reads them.
    pub(super) fn rows(&self, layer: usize) -> KvRows<'_> {
        KvRows {
            shared: self.shared.get(layer),
            shared_len: self.shared_len,
            own: &self.own[layer],
        }
    }
}

/// One layer's keys and values of a sequence: a shared prefix, then its own rows.
#[derive(Clone, Copy, Debug)]
pub struct KvRows<'a> {
    shared: Option<&'a KvCache>,
    shared_len: usize,
    own: &'a KvCache,
}

impl<'a> KvRows<'a> {
    /// The rows of one cache from position 0.
    pub fn of(cache: &'a KvCache) -> Self {
        Self {
            shared: None,
            shared_len: 0,
            own: cache,
        }
    }

    /// The keys and values of positions `range` as contiguous runs of `kv_dim`-wide rows:
    /// the shared prefix's part, then the sequence's own (either may be empty).
    pub(super) fn runs(&self, range: Range<usize>, kv_dim: usize) -> [(&'a [f32], &'a [f32]); 2] {
        let rows = |cache: &'a KvCache, rows: Range<usize>| {
            let span = rows.start * kv_dim..rows.end * kv_dim;
            (&cache.k[span.clone()], &cache.v[span])
        };
        let (shared, own_from) = match self.shared {
            Some(shared) => {
                let end = range.end.min(self.shared_len);
                (rows(shared, range.start.min(end)..end), self.shared_len)
            }
            None => ((&[][..], &[][..]), self.shared_len),
        };
        let own = range.start.max(own_from)..range.end.max(own_from);
        [
            shared,
            rows(self.own, own.start - own_from..own.end - own_from),
        ]
    }
}

/// One sequence of a batched decode step: the token fed at `position` (the sequence's
/// cache holds positions `0..position` and has room for one more).
#[derive(Debug)]
pub struct SequenceStep<'a> {
    /// The token fed.
    pub token: u32,
    /// Its position.
    pub position: usize,
    /// The sequence's KV cache.
    pub kv: SequenceKv<'a>,
}
