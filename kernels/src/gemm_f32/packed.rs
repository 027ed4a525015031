//! f32 weights packed once for the f32 GEMM kernels.

use crate::tiling::BLOCK;

/// f32 weights `[n, k]` reordered into column panels for the f32 GEMM.
///
/// Layout: output columns are split into blocks of 16 (the last one
/// zero-padded); block `b` is a `[k, 16]` row-major panel:
///
/// ```text
/// data[(b * k + p) * 16 + c] = w[16 b + c, p]
/// ```
///
/// so step `p` of the kernel loads the 16 weights of the block's columns
/// contiguously (one 512-bit or two 256-bit loads). Pack once per weight
/// matrix and reuse.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedF32Weights {
    n: usize,
    k: usize,
    n_blocks: usize,
    data: Vec<f32>,
}

impl PackedF32Weights {
    /// Packs row-major `w[n, k]` (one row per output feature).
    ///
    /// # Panics
    /// If `w.len() != n * k`.
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        let n_blocks = n.div_ceil(BLOCK);
        let mut data = vec![0f32; n_blocks * k * BLOCK];
        for j in 0..n {
            let (b, c) = (j / BLOCK, j % BLOCK);
            for (p, &v) in w[j * k..(j + 1) * k].iter().enumerate() {
                data[(b * k + p) * BLOCK + c] = v;
            }
        }
        Self {
            n,
            k,
            n_blocks,
            data,
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

    /// Element `w[j, p]` of the unpacked matrix.
    ///
    /// # Panics
    /// If `j >= n` or `p >= k`.
    pub fn get(&self, j: usize, p: usize) -> f32 {
        assert!(j < self.n && p < self.k, "index out of bounds");
        self.data[((j / BLOCK) * self.k + p) * BLOCK + j % BLOCK]
    }

    /// Unpacks to the row-major `[n, k]` matrix it was built from.
    pub fn to_rows(&self) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for j in 0..self.n {
            for p in 0..self.k {
                w.push(self.get(j, p));
            }
        }
        w
    }

    /// Number of blocks of 16 output columns (`ceil(n / 16)`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// The `[k, 16]` panel of block `b`.
    pub(crate) fn block(&self, b: usize) -> &[f32] {
        let len = self.k * BLOCK;
        &self.data[b * len..(b + 1) * len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_and_pads_with_zeros() {
        let (n, k) = (18, 3);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32 + 0.5).collect();
        let p = PackedF32Weights::pack(&w, n, k);
        assert_eq!(p.to_rows(), w);
        assert_eq!(p.n_blocks(), 2);
        // Column 17 (block 1, lane 1), k = 2.
        assert_eq!(p.block(1)[2 * 16 + 1], w[17 * k + 2]);
        // Padding lanes 2..16 of block 1 are zero.
        assert!(
            p.block(1)
                .chunks(16)
                .all(|r| r[2..].iter().all(|&v| v == 0.0))
        );
    }
}
