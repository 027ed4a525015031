//! Seeded pseudo-random inputs for tests and benches: xorshift64*, so every test across the
//! workspace draws reproducible data from one generator instead of keeping its own copy.

/// An xorshift64* generator. Not for anything but test data.
///
/// # Examples
/// ```
/// use hetsched_kernels::seeded::SeededRng;
/// let a = SeededRng::new(7).f32s(4);
/// assert_eq!(a, SeededRng::new(7).f32s(4));
/// assert!(a.iter().all(|x| (-1.0..1.0).contains(x)));
/// ```
#[derive(Debug, Clone)]
pub struct SeededRng(u64);

impl SeededRng {
    /// A generator for `seed` (any value, zero included).
    pub fn new(seed: u64) -> Self {
        SeededRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A float in [-1, 1) with 24 random bits.
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// A uniformly random byte.
    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    /// A float in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `len` floats in [-1, 1).
    pub fn f32s(&mut self, len: usize) -> Vec<f32> {
        (0..len).map(|_| self.unit_f32()).collect()
    }

    /// `len` bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.byte()).collect()
    }

    /// `len` signed bytes covering -128..=127.
    pub fn i8s(&mut self, len: usize) -> Vec<i8> {
        (0..len).map(|_| self.byte() as i8).collect()
    }
}
