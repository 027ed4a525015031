//! ggml tensor types: block geometry of every type ggml defines, and
//! dequantization to f32 of the ones this importer supports.
//!
//! # Block layouts (little-endian)
//!
//! | type | block | bytes | layout | value |
//! |------|-------|-------|--------|-------|
//! | F32  | 1  | 4  | f32 | `x` |
//! | F16  | 1  | 2  | IEEE half | `x` |
//! | BF16 | 1  | 2  | bfloat16 | `x` |
//! | Q8_0 | 32 | 34 | f16 `d`, 32 × i8 `q` | `x[i] = d·q[i]` |
//! | Q4_0 | 32 | 18 | f16 `d`, 16 bytes `qs` | `x = d·(q − 8)` |
//! | Q4_1 | 32 | 20 | f16 `d`, f16 `m`, 16 bytes `qs` | `x = d·q + m` |
//! | Q5_0 | 32 | 22 | f16 `d`, u32 `qh`, 16 bytes `qs` | `x = d·(q − 16)` |
//! | Q5_1 | 32 | 24 | f16 `d`, f16 `m`, u32 `qh`, 16 bytes `qs` | `x = d·q + m` |
//! | Q4_K, Q5_K, Q6_K | 256 | 144, 176, 210 | see [`super::kquant`] | |
//!
//! The 4-bit types use ggml's **split-nibble** layout: byte `j` of `qs`
//! holds element `j` in its low nibble and element `j + 16` in its high
//! nibble, i.e. the low nibbles are elements `0..16` and the high nibbles
//! elements `16..32` (not interleaved pairs). Q5_0 and Q5_1 add a fifth bit: bit `i`
//! of the little-endian `qh` for element `i`.

use half::{bf16, f16};

use super::kquant;

/// A ggml tensor type, with the ids of `enum ggml_type`.
///
/// Every type ggml defines is known (so that any GGUF file parses and its
/// tensor sizes are checked); only those with [`GgmlType::is_supported`] can
/// be dequantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs, non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// `(type, ggml id, elements per block, bytes per block)`.
const TABLE: [(GgmlType, u32, u64, u64); 32] = [
    (GgmlType::F32, 0, 1, 4),
    (GgmlType::F16, 1, 1, 2),
    (GgmlType::Q4_0, 2, 32, 18),
    (GgmlType::Q4_1, 3, 32, 20),
    (GgmlType::Q5_0, 6, 32, 22),
    (GgmlType::Q5_1, 7, 32, 24),
    (GgmlType::Q8_0, 8, 32, 34),
    (GgmlType::Q8_1, 9, 32, 36),
    (GgmlType::Q2_K, 10, 256, 84),
    (GgmlType::Q3_K, 11, 256, 110),
    (GgmlType::Q4_K, 12, 256, 144),
    (GgmlType::Q5_K, 13, 256, 176),
    (GgmlType::Q6_K, 14, 256, 210),
    (GgmlType::Q8_K, 15, 256, 292),
    (GgmlType::IQ2_XXS, 16, 256, 66),
    (GgmlType::IQ2_XS, 17, 256, 74),
    (GgmlType::IQ3_XXS, 18, 256, 98),
    (GgmlType::IQ1_S, 19, 256, 50),
    (GgmlType::IQ4_NL, 20, 32, 18),
    (GgmlType::IQ3_S, 21, 256, 110),
    (GgmlType::IQ2_S, 22, 256, 82),
    (GgmlType::IQ4_XS, 23, 256, 136),
    (GgmlType::I8, 24, 1, 1),
    (GgmlType::I16, 25, 1, 2),
    (GgmlType::I32, 26, 1, 4),
    (GgmlType::I64, 27, 1, 8),
    (GgmlType::F64, 28, 1, 8),
    (GgmlType::IQ1_M, 29, 256, 56),
    (GgmlType::BF16, 30, 1, 2),
    (GgmlType::TQ1_0, 34, 256, 54),
    (GgmlType::TQ2_0, 35, 256, 66),
    (GgmlType::MXFP4, 39, 32, 17),
];

impl GgmlType {
    fn row(self) -> (GgmlType, u32, u64, u64) {
        // The table holds every variant exactly once.
        TABLE
            .into_iter()
            .find(|r| r.0 == self)
            .unwrap_or((self, u32::MAX, 1, 1))
    }

    /// The type with ggml id `id`, if ggml defines one.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.into_iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The ggml id (`enum ggml_type` value).
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// Elements per block (1 for plain types, 32 or 256 for quantized ones).
    pub fn block_size(self) -> u64 {
        self.row().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.row().3
    }

    /// Whether [`dequantize`] handles this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::Q8_0
                | Self::Q4_0
                | Self::Q4_1
                | Self::Q5_0
                | Self::Q5_1
                | Self::Q4_K
                | Self::Q5_K
                | Self::Q6_K
        )
    }

    /// Byte size of `n_elements` elements, or `None` if `n_elements` is not a
    /// multiple of the block size or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.type_size())
    }
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes `bytes` of type `ty` into `out` (`out.len()` elements).
///
/// Returns `false` (writing nothing) if `ty` is unsupported, or if `bytes`
/// is not exactly [`GgmlType::bytes_for`]`(out.len())` long.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> bool {
    if !ty.is_supported() || ty.bytes_for(out.len() as u64) != Some(bytes.len() as u64) {
        return false;
    }
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => hetsched_kernels::convert::f16_le_bytes_to_f32(bytes, out),
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q8_0 => {
            for (o, blk) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(34)) {
                let d = half_at(blk, 0);
                for (o, &q) in o.iter_mut().zip(&blk[2..]) {
                    *o = d * f32::from(q as i8);
                }
            }
        }
        GgmlType::Q4_0 => {
            for (o, blk) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(18)) {
                let d = half_at(blk, 0);
                let (lo, hi) = o.split_at_mut(16);
                for (j, &q) in blk[2..].iter().enumerate() {
                    lo[j] = d * (f32::from(q & 0x0F) - 8.0);
                    hi[j] = d * (f32::from(q >> 4) - 8.0);
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, blk) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(20)) {
                let d = half_at(blk, 0);
                let m = half_at(blk, 2);
                let (lo, hi) = o.split_at_mut(16);
                for (j, &q) in blk[4..].iter().enumerate() {
                    lo[j] = d * f32::from(q & 0x0F) + m;
                    hi[j] = d * f32::from(q >> 4) + m;
                }
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let size = ty.type_size() as usize;
            for (o, blk) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(size)) {
                for (i, o) in o.iter_mut().enumerate() {
                    *o = q5_element(ty, blk, i);
                }
            }
        }
        GgmlType::Q4_K => per_block(bytes, out, 144, kquant::dequantize_q4_k),
        GgmlType::Q5_K => per_block(bytes, out, 176, kquant::dequantize_q5_k),
        GgmlType::Q6_K => per_block(bytes, out, 210, kquant::dequantize_q6_k),
        _ => return false,
    }
    true
}

/// Element `i` of a Q5_0 or Q5_1 block: ggml's `dequantize_row_q5_{0,1}` (`q·d`, then
/// `+ m` for Q5_1).
fn q5_element(ty: GgmlType, blk: &[u8], i: usize) -> f32 {
    let d = half_at(blk, 0);
    let at = if ty == GgmlType::Q5_1 { 4 } else { 2 };
    let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
    let byte = blk[at + 4 + i % 16];
    let low = if i < 16 { byte & 0x0F } else { byte >> 4 };
    let q = low | (((qh >> i) & 1) as u8) << 4;
    if ty == GgmlType::Q5_1 {
        f32::from(q) * d + half_at(blk, 2)
    } else {
        f32::from(q as i8 - 16) * d
    }
}

/// Runs `block` over every 256-element super-block of `bytes` (`size` bytes each).
fn per_block(bytes: &[u8], out: &mut [f32], size: usize, block: fn(&[u8], &mut [f32])) {
    for (o, blk) in out
        .chunks_exact_mut(kquant::QK_K)
        .zip(bytes.chunks_exact(size))
    {
        block(blk, o);
    }
}

/// Element `i` of one block `block` of type `ty` (exactly [`GgmlType::type_size`] bytes),
/// decoded with the same arithmetic as [`dequantize`]: a single weight without decoding
/// its block (the outlier shadow's cold rows read one per output row). `None` if `ty` is
/// unsupported, `block` has the wrong length or `i` is outside the block.
pub fn dequantize_element(ty: GgmlType, block: &[u8], i: usize) -> Option<f32> {
    if !ty.is_supported() || block.len() as u64 != ty.type_size() || i as u64 >= ty.block_size() {
        return None;
    }
    decode_element(ty, block, i)
}

/// [`dequantize_element`] without its checks, for a caller that made them once for many
/// blocks (a column read decodes one element of every row; the checks' table lookups cost
/// more than the decode). `block` must hold at least one block of `ty` and `i` lie inside
/// it, or this panics on the slice; `None` only for an unsupported type.
pub(crate) fn decode_element(ty: GgmlType, block: &[u8], i: usize) -> Option<f32> {
    // Q4 blocks split nibbles: byte j holds element j (low) and j + 16 (high).
    let nibble = |at: usize| {
        let q = block[at + i % 16];
        f32::from(if i < 16 { q & 0x0F } else { q >> 4 })
    };
    Some(match ty {
        GgmlType::F32 => f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
        GgmlType::F16 => half_at(block, 0),
        GgmlType::BF16 => bf16::from_le_bytes([block[0], block[1]]).to_f32(),
        GgmlType::Q8_0 => half_at(block, 0) * f32::from(block[2 + i] as i8),
        GgmlType::Q4_0 => half_at(block, 0) * (nibble(2) - 8.0),
        GgmlType::Q4_1 => half_at(block, 0) * nibble(4) + half_at(block, 2),
        GgmlType::Q5_0 | GgmlType::Q5_1 => q5_element(ty, block, i),
        GgmlType::Q4_K => kquant::element_q4_q5_k(block, i, false),
        GgmlType::Q5_K => kquant::element_q4_q5_k(block, i, true),
        GgmlType::Q6_K => kquant::element_q6_k(block, i),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn ids_round_trip_and_are_unique() {
        for (ty, id, _, _) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(ty));
            assert_eq!(ty.id(), id);
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "{id}");
        }
    }

    #[test]
    fn q4_0_split_nibbles() {
        // d = 0.5; byte j = (hi = 15 - j % 16) << 4 | (lo = j).
        let mut blk = h(0.5).to_vec();
        blk.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let mut out = [0f32; 32];
        assert!(dequantize(GgmlType::Q4_0, &blk, &mut out));
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * (j as f32 - 8.0), "low nibble {j}");
            assert_eq!(
                out[j + 16],
                0.5 * ((15 - j) as f32 - 8.0),
                "high nibble {j}"
            );
        }
    }

    #[test]
    fn q4_1_scale_and_min() {
        let mut blk = h(0.25).to_vec();
        blk.extend(h(-1.0));
        blk.extend((0..16u8).map(|j| (j << 4) | (15 - j)));
        let mut out = [0f32; 32];
        assert!(dequantize(GgmlType::Q4_1, &blk, &mut out));
        for j in 0..16 {
            assert_eq!(out[j], 0.25 * (15 - j) as f32 - 1.0);
            assert_eq!(out[j + 16], 0.25 * j as f32 - 1.0);
        }
    }

    #[test]
    fn q5_0_and_q5_1_fifth_bits() {
        // q(i) = (i * 3) % 32: the fifth bit from bit i of qh, the rest split nibbles.
        let q = |i: usize| ((i * 3) % 32) as u8;
        let mut qh = 0u32;
        let mut qs = [0u8; 16];
        for i in 0..32 {
            qh |= u32::from(q(i) >> 4) << i;
            qs[i % 16] |= (q(i) & 15) << (4 * (i / 16));
        }
        let mut q5_0 = h(0.5).to_vec();
        q5_0.extend(qh.to_le_bytes());
        q5_0.extend(qs);
        let mut out = [0f32; 32];
        assert!(dequantize(GgmlType::Q5_0, &q5_0, &mut out));
        for (i, &o) in out.iter().enumerate() {
            assert_eq!(o, 0.5 * (f32::from(q(i)) - 16.0), "Q5_0 element {i}");
            assert_eq!(dequantize_element(GgmlType::Q5_0, &q5_0, i), Some(o));
        }
        let mut q5_1 = [h(0.25), h(-3.0)].concat();
        q5_1.extend(qh.to_le_bytes());
        q5_1.extend(qs);
        assert!(dequantize(GgmlType::Q5_1, &q5_1, &mut out));
        for (i, &o) in out.iter().enumerate() {
            assert_eq!(o, 0.25 * f32::from(q(i)) - 3.0, "Q5_1 element {i}");
        }
    }

    #[test]
    fn q8_0_and_plain_types() {
        let mut blk = h(2.0).to_vec();
        blk.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut out = [0f32; 32];
        assert!(dequantize(GgmlType::Q8_0, &blk, &mut out));
        for (i, &o) in out.iter().enumerate() {
            assert_eq!(o, 2.0 * (i as f32 - 16.0));
        }
        let mut two = [0f32; 2];
        let f32s: Vec<u8> = [1.5f32, -3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert!(dequantize(GgmlType::F32, &f32s, &mut two));
        assert_eq!(two, [1.5, -3.0]);
        assert!(dequantize(
            GgmlType::F16,
            &[h(0.5), h(-2.0)].concat(),
            &mut two
        ));
        assert_eq!(two, [0.5, -2.0]);
        let bf: Vec<u8> = [bf16::from_f32(3.0), bf16::from_f32(-0.125)]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert!(dequantize(GgmlType::BF16, &bf, &mut two));
        assert_eq!(two, [3.0, -0.125]);
    }

    #[test]
    fn rejects_wrong_lengths_and_unsupported_types() {
        let mut out = [0f32; 32];
        assert!(!dequantize(GgmlType::Q4_0, &[0; 17], &mut out));
        assert!(!dequantize(GgmlType::Q3_K, &[0; 110], &mut [0f32; 256]));
        assert!(!dequantize(GgmlType::Q4_K, &[0; 143], &mut [0f32; 256]));
        assert!(!dequantize(GgmlType::F32, &[0; 4], &mut out[..3]));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
    }
}
