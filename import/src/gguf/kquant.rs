//! ggml's K-quants: super-blocks of 256 elements, dequantized with the arithmetic of
//! llama.cpp's `dequantize_row_q{4,5,6}_K` (ggml-quants.c), layouts from ggml-common.h.
//!
//! | type | bytes | layout |
//! |------|-------|--------|
//! | Q4_K | 144 | f16 `d`, f16 `dmin`, 12 bytes `scales`, 128 bytes `qs` (4-bit) |
//! | Q5_K | 176 | f16 `d`, f16 `dmin`, 12 bytes `scales`, 32 bytes `qh`, 128 bytes `qs` |
//! | Q6_K | 210 | 128 bytes `ql`, 64 bytes `qh`, 16 × i8 `scales`, f16 `d` |
//!
//! **Q4_K / Q5_K**: eight sub-blocks of 32, each with a 6-bit scale `sc` and a 6-bit min
//! `m` packed into the 12 `scales` bytes ([`scale_min`]); element value
//! `d·sc · q − dmin·m`. The 256 elements are four chunks of 64: chunk `j` reads bytes
//! `qs[32j..32j+32]`, its first 32 elements from the low nibbles (sub-block `2j`), the
//! next 32 from the high nibbles (sub-block `2j+1`). Q5_K adds a fifth bit: bit `2j` of
//! `qh[l]` for the low-nibble element `l`, bit `2j+1` for the high one (`q` in 0..32).
//!
//! **Q6_K**: sixteen sub-blocks of 16 with signed 8-bit scales; value `d·sc · (q − 32)`
//! with a 6-bit `q`: the low four bits from `ql`, the top two from `qh`. The 256 elements
//! are two halves of 128; in half `n`, element `32·k + l` (quarter `k`, `l` in 0..32) takes
//! nibble `k / 2` of `ql[64n + l + 32·(k % 2)]`, bits `2k..2k+2` of `qh[32n + l]`, and
//! scale `scales[8n + l/16 + 2k]`.

use half::f16;

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Scale and min (both 6-bit) of sub-block `j` (0..8) from the 12 packed bytes `q`:
/// ggml's `get_scale_min_k4`. Sub-blocks 0..4 keep theirs in the low 6 bits of bytes
/// `j` (scale) and `j + 4` (min); sub-blocks 4..8 put their low four bits in the nibbles
/// of byte `j + 4` and their top two bits in the top bits of bytes `j − 4` and `j`.
pub fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one Q4_K block (144 bytes) into `out` (256 elements).
pub fn dequantize_q4_k(blk: &[u8], out: &mut [f32]) {
    let (d, min) = (half_at(blk, 0), half_at(blk, 2));
    let scales = &blk[4..16];
    let qs = &blk[16..144];
    for (j, (y, q)) in out
        .chunks_exact_mut(64)
        .zip(qs.chunks_exact(32))
        .enumerate()
    {
        let (sc1, m1) = scale_min(2 * j, scales);
        let (sc2, m2) = scale_min(2 * j + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * f32::from(q[l] & 0x0F) - m1;
            hi[l] = d2 * f32::from(q[l] >> 4) - m2;
        }
    }
}

/// Dequantizes one Q5_K block (176 bytes) into `out` (256 elements).
pub fn dequantize_q5_k(blk: &[u8], out: &mut [f32]) {
    let (d, min) = (half_at(blk, 0), half_at(blk, 2));
    let scales = &blk[4..16];
    let qh = &blk[16..48];
    let ql = &blk[48..176];
    for (j, (y, q)) in out
        .chunks_exact_mut(64)
        .zip(ql.chunks_exact(32))
        .enumerate()
    {
        let (sc1, m1) = scale_min(2 * j, scales);
        let (sc2, m2) = scale_min(2 * j + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        let (u1, u2) = (1u8 << (2 * j), 1u8 << (2 * j + 1));
        let (lo, hi) = y.split_at_mut(32);
        for l in 0..32 {
            let b1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let b2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            lo[l] = d1 * f32::from((q[l] & 0x0F) + b1) - m1;
            hi[l] = d2 * f32::from((q[l] >> 4) + b2) - m2;
        }
    }
}

/// Dequantizes one Q6_K block (210 bytes) into `out` (256 elements).
pub fn dequantize_q6_k(blk: &[u8], out: &mut [f32]) {
    let d = half_at(blk, 208);
    for (n, y) in out.chunks_exact_mut(128).enumerate() {
        let ql = &blk[64 * n..64 * n + 64];
        let qh = &blk[128 + 32 * n..128 + 32 * n + 32];
        let sc = &blk[192 + 8 * n..192 + 8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |k: usize| d * f32::from(sc[is + 2 * k] as i8);
            y[l] = s(0) * f32::from(q1);
            y[l + 32] = s(1) * f32::from(q2);
            y[l + 64] = s(2) * f32::from(q3);
            y[l + 96] = s(3) * f32::from(q4);
        }
    }
}

/// Element `i` (0..256) of one Q4_K (`five_bits` false) or Q5_K block, with the same
/// arithmetic as the row dequantizers.
pub fn element_q4_q5_k(blk: &[u8], i: usize, five_bits: bool) -> f32 {
    let (d, min) = (half_at(blk, 0), half_at(blk, 2));
    let (j, within) = (i / 64, i % 64);
    let (l, high) = (within % 32, within >= 32);
    let sub = 2 * j + usize::from(high);
    let (sc, m) = scale_min(sub, &blk[4..16]);
    let qs_at = if five_bits { 48 } else { 16 };
    let byte = blk[qs_at + 32 * j + l];
    let mut q = if high { byte >> 4 } else { byte & 0x0F };
    if five_bits && blk[16 + l] & (1 << sub) != 0 {
        q += 16;
    }
    (d * f32::from(sc)) * f32::from(q) - min * f32::from(m)
}

/// Element `i` (0..256) of one Q6_K block, with the same arithmetic as
/// [`dequantize_q6_k`].
pub fn element_q6_k(blk: &[u8], i: usize) -> f32 {
    let d = half_at(blk, 208);
    let (n, r) = (i / 128, i % 128);
    let (k, l) = (r / 32, r % 32);
    let low = blk[64 * n + l + 32 * (k % 2)] >> (4 * (k / 2)) & 0x0F;
    let top = (blk[128 + 32 * n + l] >> (2 * k)) & 3;
    let q = (low | (top << 4)) as i8 - 32;
    let sc = blk[192 + 8 * n + l / 16 + 2 * k] as i8;
    (d * f32::from(sc)) * f32::from(q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetsched_kernels::seeded::SeededRng;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    /// Packs eight 6-bit (scale, min) pairs the way llama.cpp's quantize_row_q4_K does.
    fn pack_scales(sm: [(u8, u8); 8]) -> [u8; 12] {
        let mut q = [0u8; 12];
        for (j, &(ls, lm)) in sm.iter().enumerate() {
            if j < 4 {
                q[j] = ls;
                q[j + 4] = lm;
            } else {
                q[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
                q[j - 4] |= (ls >> 4) << 6;
                q[j] |= (lm >> 4) << 6;
            }
        }
        q
    }

    const SM: [(u8, u8); 8] = [
        (1, 0),
        (2, 3),
        (63, 5),
        (17, 63),
        (20, 7),
        (33, 48),
        (63, 63),
        (5, 16),
    ];

    #[test]
    fn scale_min_unpacks_every_sub_block() {
        let packed = pack_scales(SM);
        for (j, &want) in SM.iter().enumerate() {
            assert_eq!(scale_min(j, &packed), want, "sub-block {j}");
        }
    }

    /// Element `i`'s 4-bit quant in the test blocks: `(i * 7 + i / 64) % 16`.
    fn q4_of(i: usize) -> u8 {
        ((i * 7 + i / 64) % 16) as u8
    }

    /// A Q4_K block with d = 0.5, dmin = 0.25, scales [`SM`] and quants [`q4_of`].
    fn q4_k_block() -> Vec<u8> {
        let mut blk = [h(0.5), h(0.25)].concat();
        blk.extend(pack_scales(SM));
        let mut qs = [0u8; 128];
        for i in 0..QK_K {
            let (j, l, high) = (i / 64, i % 32, i % 64 >= 32);
            let byte = &mut qs[32 * j + l];
            *byte |= if high { q4_of(i) << 4 } else { q4_of(i) };
        }
        blk.extend(qs);
        blk
    }

    #[test]
    fn q4_k_known_values() {
        let blk = q4_k_block();
        assert_eq!(blk.len(), 144);
        let mut out = [0f32; QK_K];
        dequantize_q4_k(&blk, &mut out);
        for (i, &o) in out.iter().enumerate() {
            let (sc, m) = SM[i / 32];
            // Exact: small integers times powers of two.
            let want = 0.5 * f32::from(sc) * f32::from(q4_of(i)) - 0.25 * f32::from(m);
            assert_eq!(o, want, "element {i}");
            assert_eq!(element_q4_q5_k(&blk, i, false), want, "element {i} alone");
        }
    }

    #[test]
    fn q5_k_known_values() {
        // The fifth bit set on every element whose index is a multiple of 3.
        let mut blk = [h(0.5), h(0.25)].concat();
        blk.extend(pack_scales(SM));
        let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
        let q5_of = |i: usize| q4_of(i) + if i.is_multiple_of(3) { 16 } else { 0 };
        for i in 0..QK_K {
            let (j, l, high) = (i / 64, i % 32, i % 64 >= 32);
            let q = q5_of(i);
            qs[32 * j + l] |= if high { (q & 15) << 4 } else { q & 15 };
            if q >= 16 {
                qh[l] |= 1 << (2 * j + usize::from(high));
            }
        }
        blk.extend(qh);
        blk.extend(qs);
        assert_eq!(blk.len(), 176);
        let mut out = [0f32; QK_K];
        dequantize_q5_k(&blk, &mut out);
        for (i, &o) in out.iter().enumerate() {
            let (sc, m) = SM[i / 32];
            let want = 0.5 * f32::from(sc) * f32::from(q5_of(i)) - 0.25 * f32::from(m);
            assert_eq!(o, want, "element {i}");
            assert_eq!(element_q4_q5_k(&blk, i, true), want, "element {i} alone");
        }
    }

    #[test]
    fn q6_k_known_values() {
        // q = (i * 5) % 64 (so q − 32 spans −32..32), scale of sub-block s: s − 8.
        let q6_of = |i: usize| ((i * 5) % 64) as u8;
        let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
        for i in 0..QK_K {
            let (n, r) = (i / 128, i % 128);
            let (k, l) = (r / 32, r % 32);
            let q = q6_of(i);
            ql[64 * n + l + 32 * (k % 2)] |= (q & 15) << (4 * (k / 2));
            qh[32 * n + l] |= (q >> 4) << (2 * k);
        }
        let mut blk = ql.to_vec();
        blk.extend(qh);
        blk.extend((0..16).map(|s| (s as i8 - 8) as u8));
        blk.extend(h(0.125));
        assert_eq!(blk.len(), 210);
        let mut out = [0f32; QK_K];
        dequantize_q6_k(&blk, &mut out);
        for (i, &o) in out.iter().enumerate() {
            let sc = (i / 16) as f32 - 8.0;
            let want = 0.125 * sc * (f32::from(q6_of(i)) - 32.0);
            assert_eq!(o, want, "element {i}");
            assert_eq!(element_q6_k(&blk, i), want, "element {i} alone");
        }
    }

    #[test]
    fn element_decoders_match_rows_on_random_blocks() {
        let mut rng = SeededRng::new(7);
        for _ in 0..20 {
            let mut bytes = rng.bytes(210);
            // Finite, moderate f16 scales.
            bytes[..2].copy_from_slice(&h(0.01));
            bytes[2..4].copy_from_slice(&h(-0.02));
            bytes[208..210].copy_from_slice(&h(0.03));
            let mut out = [0f32; QK_K];
            dequantize_q4_k(&bytes[..144], &mut out);
            for (i, &o) in out.iter().enumerate() {
                assert_eq!(element_q4_q5_k(&bytes[..144], i, false), o);
            }
            dequantize_q5_k(&bytes[..176], &mut out);
            for (i, &o) in out.iter().enumerate() {
                assert_eq!(element_q4_q5_k(&bytes[..176], i, true), o);
            }
            dequantize_q6_k(&bytes, &mut out);
            for (i, &o) in out.iter().enumerate() {
                assert_eq!(element_q6_k(&bytes, i), o);
            }
        }
    }

    /// Blocks and values from llama.cpp's own gguf-py (`scripts/kquant-fixture.py`): the
    /// layouts above agree with an implementation this crate did not write.
    #[test]
    fn matches_llama_cpp_gguf_py() {
        let text = include_str!("../../testdata/kquant_gguf_py.txt");
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len() / 2)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        };
        let mut seen = 0;
        for line in text.lines() {
            let mut parts = line.split(' ');
            let (ty, blk, values) = (parts.next(), parts.next(), parts.next());
            let (blk, values) = (hex(blk.unwrap()), hex(values.unwrap()));
            let mut out = [0f32; QK_K];
            match ty.unwrap() {
                "Q4_K" => dequantize_q4_k(&blk, &mut out),
                "Q5_K" => dequantize_q5_k(&blk, &mut out),
                "Q6_K" => dequantize_q6_k(&blk, &mut out),
                other => panic!("unexpected type {other}"),
            }
            for (i, (o, v)) in out.iter().zip(values.chunks_exact(4)).enumerate() {
                let want = f32::from_bits(u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
                // gguf-py orders the float products differently: a rounding apart at most.
                assert!(
                    (o - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "{line:.4}… element {i}: {o} vs {want}"
                );
            }
            seen += 1;
        }
        assert_eq!(seen, 9);
    }
}
