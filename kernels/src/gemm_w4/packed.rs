//! W4 weights packed once for the W4A8 kernels: two 4-bit values per byte, laid out
//! so that one 512-bit load and two masks give two `vpdpbusd` operands.

use std::borrow::Cow;

use super::quant::{GROUP_K, W4Rows};
use crate::tiling::{BLOCK, pad_rows};

/// Packed bytes of one block (16 columns) × one group (32 k): 512 nibbles.
pub(crate) const GROUP_BYTES: usize = BLOCK * GROUP_K / 2;
/// Bytes of one "vector" of a group: 16 columns × 4 k, two nibbles each.
pub(crate) const VEC_BYTES: usize = BLOCK * 4;
/// Vectors per group: each holds quads `v` (low nibbles) and `v + 4` (high).
pub(crate) const VECS: usize = GROUP_BYTES / VEC_BYTES;

/// W4 weights `[n, k]` reordered for the W4A8 GEMM kernels.
///
/// Columns are split into blocks of 16 (the last zero-padded) and `k` into groups of
/// 32 (the last zero-padded). Block `b`, group `g` is 256 contiguous bytes, four
/// vectors of 64; byte `e` of column `c` of vector `v` holds, as `q + 8` (0..=15),
///
/// ```text
/// low nibble:  q[16 b + c, 32 g + 4 v + e]
/// high nibble: q[16 b + c, 32 g + 4 (v + 4) + e]
/// ```
///
/// so `x & 0x0f` and `(x >> 4) & 0x0f` of one 64-byte load are the `vpdpbusd`
/// operands (16 lanes × 4 k) of quads `v` and `v + 4`, already in the W8A8 kernel's
/// column-major-over-the-block order. The block's 16 sub-scales of group `g` are 16
/// contiguous bytes. The struct also keeps each column's row scale and its
/// correction `Σ_g s[j, g] · Σ_{p ∈ g} q[j, p]` for the VNNI kernel's +128 activation
/// bias. Memory: half a byte per weight, one byte per 32, 8 bytes per row.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedW4Weights {
    n: usize,
    k: usize,
    groups: usize,
    n_blocks: usize,
    data: Vec<u8>,
    sub_scales: Vec<i8>,
    row_scales: Vec<f32>,
    col_corrections: Vec<i32>,
}

impl PackedW4Weights {
    /// Quantizes ([`W4Rows::quantize`]) and packs row-major `w[n, k]`.
    ///
    /// # Panics
    /// If `w.len() != n * k`.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        Self::pack(&W4Rows::quantize(w, n, k))
    }

    /// Packs quantized rows.
    ///
    /// # Panics
    /// If a field's length does not match `n` and `k`, or a value lies outside
    /// `-8..=7`.
    pub fn pack(w: &W4Rows) -> Self {
        let (n, k, groups) = (w.n, w.k, w.groups());
        assert_eq!(w.q.len(), n * k, "q must be [n, k]");
        assert_eq!(
            w.sub_scales.len(),
            n * groups,
            "sub_scales must be [n, groups]"
        );
        assert_eq!(w.row_scales.len(), n, "row_scales must be [n]");
        assert!(
            w.q.iter().all(|v| (-8..=7).contains(v)),
            "q must be in -8..=7"
        );
        let n_blocks = n.div_ceil(BLOCK);
        // Nibble 8 encodes 0: padding contributes nothing.
        let mut data = vec![0x88u8; n_blocks * groups * GROUP_BYTES];
        let mut sub_scales = vec![0i8; n_blocks * groups * BLOCK];
        let mut col_corrections = vec![0i32; n_blocks * BLOCK];
        for (j, correction) in col_corrections.iter_mut().enumerate().take(n) {
            let (b, c) = (j / BLOCK, j % BLOCK);
            let row = &w.q[j * k..(j + 1) * k];
            for (p, &v) in row.iter().enumerate() {
                let (g, quad, e) = (p / GROUP_K, (p % GROUP_K) / 4, p % 4);
                let byte = (b * groups + g) * GROUP_BYTES + (quad % VECS) * VEC_BYTES + c * 4 + e;
                let shift = if quad < VECS { 0 } else { 4 };
                data[byte] = (data[byte] & !(0x0f << shift)) | (((v + 8) as u8) << shift);
            }
            for g in 0..groups {
                let s = w.sub_scales[j * groups + g];
                sub_scales[(b * groups + g) * BLOCK + c] = s;
                let sum: i32 = row[g * GROUP_K..((g + 1) * GROUP_K).min(k)]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                *correction = correction.wrapping_add(sum * i32::from(s));
            }
        }
        Self {
            n,
            k,
            groups,
            n_blocks,
            data,
            sub_scales,
            row_scales: w.row_scales.clone(),
            col_corrections,
        }
    }

    /// Number of output features (rows of the unpacked matrix).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Reduction length (columns of the unpacked matrix).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The `[n]` row scales: `w ≈ row_scale · sub_scale · q`; the dequantization of
    /// the GEMM's accumulators multiplies by them (and the activation scale).
    pub fn row_scales(&self) -> &[f32] {
        &self.row_scales
    }

    /// Bytes this matrix keeps in memory (packed values, sub-scales, row scales and
    /// column corrections).
    pub fn bytes(&self) -> usize {
        self.data.len()
            + self.sub_scales.len()
            + 4 * self.row_scales.len()
            + 4 * self.col_corrections.len()
    }

    /// Unpacks to the rows it was built from.
    pub fn to_rows(&self) -> W4Rows {
        let (n, k, groups) = (self.n, self.k, self.groups);
        let mut q = Vec::with_capacity(n * k);
        let mut sub_scales = Vec::with_capacity(n * groups);
        for j in 0..n {
            let (b, c) = (j / BLOCK, j % BLOCK);
            for p in 0..k {
                let (g, quad, e) = (p / GROUP_K, (p % GROUP_K) / 4, p % 4);
                let byte = self.data
                    [(b * groups + g) * GROUP_BYTES + (quad % VECS) * VEC_BYTES + c * 4 + e];
                let nibble = if quad < VECS { byte & 0x0f } else { byte >> 4 };
                q.push(nibble as i8 - 8);
            }
            for g in 0..groups {
                sub_scales.push(self.sub_scales[(b * groups + g) * BLOCK + c]);
            }
        }
        W4Rows {
            n,
            k,
            q,
            sub_scales,
            row_scales: self.row_scales.clone(),
        }
    }

    /// Number of groups of 32 along `k`.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Number of blocks of 16 output columns.
    #[cfg(test)]
    pub(crate) fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// The packed bytes of block `b`: `groups * 256` bytes.
    pub(crate) fn block(&self, b: usize) -> &[u8] {
        let len = self.groups * GROUP_BYTES;
        &self.data[b * len..(b + 1) * len]
    }

    /// The sub-scales of block `b`: 16 per group, `groups * 16` bytes.
    pub(crate) fn block_sub_scales(&self, b: usize) -> &[i8] {
        let len = self.groups * BLOCK;
        &self.sub_scales[b * len..(b + 1) * len]
    }

    /// Corrections `Σ_g s · Σ q` of the 16 columns of block `b` (0 for padding).
    pub(crate) fn col_corrections(&self, b: usize) -> &[i32] {
        &self.col_corrections[b * BLOCK..(b + 1) * BLOCK]
    }
}

/// Copies activations `a[m, k]` into rows of `32 * groups` bytes ([`pad_rows`]), XOR-ing
/// every byte with `xor`: `0x80` for the VNNI kernel's `a + 128`, `0` for the i8 bit
/// patterns.
pub(crate) fn pad_activations(a: &[i8], m: usize, k: usize, groups: usize, xor: u8) -> Vec<u8> {
    pad_rows(a, m, k, GROUP_K * groups, xor)
}

/// The activations `a[m, k]` as rows of `32 · groups` bytes ([`pad_activations`] with
/// `xor` 0, the layout of the per-group-scaled kernels): borrowed as they are when `k` is
/// whole groups (nothing to pad), copied and zero-padded otherwise. A decode step's
/// product runs as a few column tasks per thread, each calling its kernel: borrowing
/// took `memmove` from 3.8% to 2.7% of a W4A8 step's samples (1 thread, 300 tokens).
pub(crate) fn activation_rows(a: &[i8], m: usize, k: usize, groups: usize) -> Cow<'_, [u8]> {
    if k == GROUP_K * groups {
        Cow::Borrowed(as_bytes(a))
    } else {
        Cow::Owned(pad_activations(a, m, k, groups, 0))
    }
}

/// `a`'s bytes as unsigned.
#[allow(unsafe_code)]
fn as_bytes(a: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have the same size and alignment and every bit pattern is valid
    // for both; the view has `a`'s length and borrows it for its lifetime.
    unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), a.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_w4::tests::random_rows;

    #[test]
    fn roundtrips_and_places_nibbles() {
        let (n, k) = (17, 70);
        let rows = random_rows(n, k, 5);
        let p = PackedW4Weights::pack(&rows);
        assert_eq!(p.to_rows(), rows);
        assert_eq!((p.n_blocks(), p.groups()), (2, 3));
        // Column 16 = block 1, lane 0; k = 37 = group 1, quad 1 (low nibble of vector 1), e 1.
        let byte = p.block(1)[GROUP_BYTES + VEC_BYTES + 1];
        assert_eq!((byte & 0x0f) as i8 - 8, rows.q[16 * k + 37]);
        // k = 53 = group 1, quad 5 (high nibble of vector 1), e 1.
        let byte = p.block(1)[GROUP_BYTES + VEC_BYTES + 1];
        assert_eq!((byte >> 4) as i8 - 8, rows.q[16 * k + 53]);
        // Padding columns and k encode 0.
        assert!(p.block(1)[4..VEC_BYTES].iter().all(|&b| b == 0x88));
        assert_eq!(p.block(0)[2 * GROUP_BYTES + 3 * VEC_BYTES + 3] >> 4, 8);
        let want: i32 = (0..3)
            .map(|g| {
                let q: i32 = rows.q[16 * k + 32 * g..16 * k + (32 * g + 32).min(k)]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                q * i32::from(rows.sub_scales[16 * 3 + g])
            })
            .sum();
        assert_eq!(p.col_corrections(1)[0], want);
        assert!(p.col_corrections(1)[1..].iter().all(|&s| s == 0));
    }

    #[test]
    fn memory_is_about_17_32_bytes_per_weight() {
        let (n, k) = (1536, 576);
        let p = PackedW4Weights::pack(&random_rows(n, k, 1));
        assert_eq!(p.bytes(), n * k / 2 + n * k / 32 + 8 * n);
    }

    #[test]
    #[should_panic(expected = "q must be in -8..=7")]
    fn rejects_values_beyond_four_bits() {
        let mut rows = random_rows(2, 4, 3);
        rows.q[1] = 8;
        PackedW4Weights::pack(&rows);
    }
}
