//! The argument checks every GEMM dispatcher makes before it picks a kernel variant
//! (`gemm_f32`, `gemm_i8`, `gemm_w4` and its grouped twin): one place, one set of
//! messages.

use std::ops::Range;

use crate::cpu::{F32Kernel, I8Kernel};

/// A kernel variant a dispatcher may be asked for.
pub(crate) trait Variant: Copy {
    /// Whether this CPU runs it.
    fn available(self) -> bool;
    /// Its name, for the panic message.
    fn label(self) -> &'static str;
}

impl Variant for F32Kernel {
    fn available(self) -> bool {
        self.is_available()
    }
    fn label(self) -> &'static str {
        self.name()
    }
}

impl Variant for I8Kernel {
    fn available(self) -> bool {
        self.is_available()
    }
    fn label(self) -> &'static str {
        self.name()
    }
}

/// Panics unless `a` holds `m` rows of `k` (`kn = (k, n)`), `cols` lies within `0..n`,
/// `out` holds `m` rows of `cols.len()`, and `kernel` runs on this CPU.
#[track_caller]
pub(crate) fn check_tile(
    a_len: usize,
    m: usize,
    (k, n): (usize, usize),
    cols: &Range<usize>,
    out_len: usize,
    kernel: impl Variant,
) {
    assert_eq!(a_len, m * k, "a must be [m, k]");
    assert!(
        cols.start <= cols.end && cols.end <= n,
        "cols must be within 0..n"
    );
    assert_eq!(out_len, m * cols.len(), "out must be [m, cols.len()]");
    assert!(
        kernel.available(),
        "kernel {} unsupported by this CPU",
        kernel.label()
    );
}
