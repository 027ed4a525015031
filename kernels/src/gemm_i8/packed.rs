//! INT8 weights packed once for the GEMM kernels.

use crate::tiling::{BLOCK, pad_rows};

/// Bytes of one k-group of one block: 16 columns × 4 consecutive k.
pub(crate) const GROUP_BYTES: usize = BLOCK * 4;

/// INT8 weights `[n, k]` reordered for the INT8 GEMM kernels.
///
/// Layout: output columns are split into blocks of 16 (the last one
/// zero-padded) and `k` into groups of 4 (the last one zero-padded). Block
/// `b`, group `g` is 64 contiguous bytes, column-major over the block:
///
/// ```text
/// data[((b * k_groups + g) * 16 + c) * 4 + t] = w[16 b + c, 4 g + t]
/// ```
///
/// so one 512-bit load feeds `vpdpbusd` (16 lanes × 4 products) and one
/// 256-bit load holds 8 columns × 4 k for the AVX2 kernel. The struct also
/// keeps each column's weight sum, needed by the VNNI kernel's +128
/// activation bias correction, and whether every weight lies in the
/// symmetric range `[-127, 127]` ([`Self::is_symmetric`]), which the AVX2
/// kernels' fast form needs. Pack once per weight matrix and reuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedI8Weights {
    n: usize,
    k: usize,
    k_groups: usize,
    n_blocks: usize,
    data: Vec<i8>,
    col_sums: Vec<i32>,
    symmetric: bool,
}

impl PackedI8Weights {
    /// Packs row-major `w[n, k]` (one row per output feature).
    ///
    /// # Panics
    /// If `w.len() != n * k`.
    pub fn pack(w: &[i8], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        let k_groups = k.div_ceil(4);
        let n_blocks = n.div_ceil(BLOCK);
        let mut data = vec![0i8; n_blocks * k_groups * GROUP_BYTES];
        let mut col_sums = vec![0i32; n_blocks * BLOCK];
        for j in 0..n {
            let (b, c) = (j / BLOCK, j % BLOCK);
            let row = &w[j * k..(j + 1) * k];
            for (p, &v) in row.iter().enumerate() {
                let (g, t) = (p / 4, p % 4);
                data[((b * k_groups + g) * BLOCK + c) * 4 + t] = v;
            }
            col_sums[j] = row.iter().map(|&v| i32::from(v)).sum();
        }
        Self {
            n,
            k,
            k_groups,
            n_blocks,
            data,
            col_sums,
            symmetric: !w.contains(&i8::MIN),
        }
    }

    /// Whether no weight is -128, i.e. every weight lies in `[-127, 127]`: what the
    /// project's quantizers produce (`clamp(…, -127, 127)`,
    /// [`crate::reference::quantize_weights_per_row`]). The AVX2 kernels move each
    /// activation's sign onto the weight it multiplies (`vpsignb`), which cannot negate
    /// -128, and their pair sums `|a| · w` stay within i16 only for `|w| <= 127`; weights
    /// holding -128 take their exact widening form instead.
    pub fn is_symmetric(&self) -> bool {
        self.symmetric
    }

    /// Number of output features (rows of the unpacked matrix).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Reduction length (columns of the unpacked matrix).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Element `w[j, p]` of the unpacked matrix.
    ///
    /// # Panics
    /// If `j >= n` or `p >= k`.
    pub fn get(&self, j: usize, p: usize) -> i8 {
        assert!(j < self.n && p < self.k, "index out of bounds");
        let (b, c, g, t) = (j / BLOCK, j % BLOCK, p / 4, p % 4);
        self.data[((b * self.k_groups + g) * BLOCK + c) * 4 + t]
    }

    /// Unpacks to the row-major `[n, k]` matrix it was built from.
    pub fn to_rows(&self) -> Vec<i8> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for j in 0..self.n {
            for p in 0..self.k {
                w.push(self.get(j, p));
            }
        }
        w
    }

    /// Number of groups of 4 along `k` (`ceil(k / 4)`).
    pub(crate) fn k_groups(&self) -> usize {
        self.k_groups
    }

    /// Number of blocks of 16 output columns (`ceil(n / 16)`).
    pub(crate) fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// The packed bytes of block `b`: `k_groups * 64` bytes.
    pub(crate) fn block(&self, b: usize) -> &[i8] {
        let len = self.k_groups * GROUP_BYTES;
        &self.data[b * len..(b + 1) * len]
    }

    /// Weight sums `Σ_p w[16 b + c, p]` of the 16 columns of block `b`
    /// (0 for padding columns).
    pub(crate) fn col_sums(&self, b: usize) -> &[i32] {
        &self.col_sums[b * BLOCK..(b + 1) * BLOCK]
    }
}

/// Copies activations `a[m, k]` into rows of `4 * k_groups` bytes (the packed k-group
/// length, [`pad_rows`]), XOR-ing every byte with `xor`: `0x80` maps an i8 `v` to the u8
/// `v + 128` (the VNNI bias), `0` keeps the i8 bit pattern.
pub(super) fn pad_activations(a: &[i8], m: usize, k: usize, k_groups: usize, xor: u8) -> Vec<u8> {
    pad_rows(a, m, k, 4 * k_groups, xor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_and_pads_with_zeros() {
        let (n, k) = (17, 6);
        let w: Vec<i8> = (0..n * k).map(|i| (i as i32 % 255 - 127) as i8).collect();
        let p = PackedI8Weights::pack(&w, n, k);
        assert_eq!(p.to_rows(), w);
        assert_eq!((p.n_blocks(), p.k_groups()), (2, 2));
        assert_eq!(p.block(1).len(), 2 * 64);
        // Column 16 is block 1, lane 0; k = 5 is group 1, t = 1.
        assert_eq!(p.block(1)[64 + 1], w[16 * k + 5]);
        // Padding: k = 6, 7 and columns 17..32 are zero.
        assert_eq!(p.block(0)[64 + 2], 0);
        assert_eq!(p.block(0)[64 + 3], 0);
        assert!(p.block(1)[4..64].iter().all(|&v| v == 0));
        assert_eq!(
            p.col_sums(1)[0],
            w[16 * k..17 * k].iter().map(|&v| i32::from(v)).sum()
        );
        assert!(p.col_sums(1)[1..].iter().all(|&s| s == 0));
        // The values run from -127 to 127.
        assert!(p.is_symmetric());
    }

    #[test]
    fn one_minus_128_makes_the_weights_asymmetric() {
        let mut w = vec![127i8; 3 * 9];
        w[2 * 9 + 8] = -127;
        assert!(PackedI8Weights::pack(&w, 3, 9).is_symmetric());
        w[2 * 9 + 8] = -128;
        assert!(!PackedI8Weights::pack(&w, 3, 9).is_symmetric());
        assert!(PackedI8Weights::pack(&[], 0, 4).is_symmetric());
    }

    #[test]
    fn padded_activations_are_biased_and_padded() {
        let a = [-128i8, -1, 0, 127, 5];
        // m = 1, k = 5 -> 2 groups of 4 bytes.
        assert_eq!(
            pad_activations(&a, 1, 5, 2, 0x80),
            vec![0, 127, 128, 255, 133, 128, 128, 128]
        );
        assert_eq!(
            pad_activations(&a, 1, 5, 2, 0),
            vec![128, 255, 0, 127, 5, 0, 0, 0]
        );
        assert_eq!(
            pad_activations(&a[..4], 2, 2, 1, 0),
            vec![128, 255, 0, 0, 0, 127, 0, 0]
        );
    }
}
