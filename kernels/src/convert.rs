//! Conversions of half-precision weights (GGUF F16 / BF16 tensors) to f32.

use half::{bf16, f16};

/// Widens IEEE half-precision values: `dst[i] = src[i] as f32` (exact).
///
/// # Panics
/// If the lengths differ.
pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "dst must have the length of src");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Widens bfloat16 values: `dst[i] = src[i] as f32` (exact).
///
/// # Panics
/// If the lengths differ.
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "dst must have the length of src");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Decodes little-endian IEEE half-precision bytes (as stored in a GGUF F16
/// tensor) to f32; `dst.len()` values from `2 * dst.len()` bytes.
///
/// # Panics
/// If `bytes.len() != 2 * dst.len()`.
pub fn f16_le_bytes_to_f32(bytes: &[u8], dst: &mut [f32]) {
    assert_eq!(
        bytes.len(),
        2 * dst.len(),
        "bytes must hold dst.len() halves"
    );
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
        *d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        let src = [
            f16::from_f32(1.5),
            f16::from_f32(-2.0),
            f16::from_bits(0x7C00),
        ];
        let mut dst = [0f32; 3];
        f16_to_f32(&src, &mut dst);
        assert_eq!(dst, [1.5, -2.0, f32::INFINITY]);
        let mut dst2 = [0f32; 2];
        bf16_to_f32(&[bf16::from_f32(3.0), bf16::from_bits(0xBF80)], &mut dst2);
        assert_eq!(dst2, [3.0, -1.0]);
        // 0x3C00 = 1.0, 0xC000 = -2.0 (little-endian).
        let mut dst3 = [0f32; 2];
        f16_le_bytes_to_f32(&[0x00, 0x3C, 0x00, 0xC0], &mut dst3);
        assert_eq!(dst3, [1.0, -2.0]);
    }
}
