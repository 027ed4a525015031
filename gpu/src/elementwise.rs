//! Element-wise kernels: the gated FFN activation, matching
//! `hetsched_kernels::reference::silu_mul`.

use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::job::{Bind, for_row_chunks, stride_groups};
use crate::pipelines::{PUSH_WORDS, Shader};

/// Elements per chunk row when splitting flat tensors against the storage-buffer limit.
pub(crate) const FLAT_ROW: usize = 4096;

impl GpuContext {
    /// `out[i] = silu(gate[i]) * up[i]` with `silu(x) = x / (1 + e^-x)`; any shape.
    pub fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Result<Vec<f32>> {
        if gate.len() != up.len() {
            return Err(shape(
                "silu_mul",
                format!("gate has {} elements, up {}", gate.len(), up.len()),
            ));
        }
        let len = gate.len();
        let mut out = vec![0f32; len];
        for_row_chunks(
            self,
            "silu_mul",
            len.div_ceil(FLAT_ROW),
            FLAT_ROW * 4,
            |r0, r1| {
                let (i0, i1) = (r0 * FLAT_ROW, (r1 * FLAT_ROW).min(len));
                let g: Vec<u32> = gate[i0..i1].iter().map(|v| v.to_bits()).collect();
                let u: Vec<u32> = up[i0..i1].iter().map(|v| v.to_bits()).collect();
                let mut push = [0u32; PUSH_WORDS];
                push[0] = (i1 - i0) as u32;
                let got = self.run_simple(
                    Shader::SiluMul,
                    &[
                        Bind::Upload(&g),
                        Bind::Upload(&u),
                        Bind::Output((i1 - i0) as u64),
                    ],
                    &[2],
                    push,
                    stride_groups(i1 - i0),
                )?;
                for (o, &b) in out[i0..i1].iter_mut().zip(&got[0]) {
                    *o = f32::from_bits(b);
                }
                Ok(())
            },
        )?;
        Ok(out)
    }
}
