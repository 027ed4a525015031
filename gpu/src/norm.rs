//! RMSNorm, matching `hetsched_kernels::reference::rms_norm`.

use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::job::{Bind, for_row_chunks};
use crate::pipelines::{PUSH_WORDS, Shader};

fn words(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

impl GpuContext {
    /// RMSNorm of each row: `out[r, c] = x[r, c] / sqrt(mean_c(x[r, :]²) + eps) * weight[c]`;
    /// `x` and the result `[rows, cols]`, `weight` `[cols]`.
    pub fn rms_norm(
        &self,
        x: &[f32],
        weight: &[f32],
        eps: f32,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>> {
        if x.len() != rows * cols {
            return Err(shape(
                "rms_norm",
                format!(
                    "x has {} elements, [{rows}, {cols}] needs {}",
                    x.len(),
                    rows * cols
                ),
            ));
        }
        if weight.len() != cols {
            return Err(shape(
                "rms_norm",
                format!("weight has {} elements, expected {cols}", weight.len()),
            ));
        }
        let mut out = vec![0f32; rows * cols];
        if cols == 0 {
            return Ok(out);
        }
        let w = words(weight);
        for_row_chunks(self, "rms_norm", rows, cols * 4, |r0, r1| {
            let n = r1 - r0;
            let mut push = [0u32; PUSH_WORDS];
            push[0] = n as u32;
            push[1] = cols as u32;
            push[2] = eps.to_bits();
            let got = self.run_simple(
                Shader::RmsNorm,
                &[
                    Bind::Upload(&words(&x[r0 * cols..r1 * cols])),
                    Bind::Upload(&w),
                    Bind::Output((n * cols) as u64),
                ],
                &[2],
                push,
                [n.clamp(1, 65_535) as u32, 1, 1],
            )?;
            for (o, &b) in out[r0 * cols..r1 * cols].iter_mut().zip(&got[0]) {
                *o = f32::from_bits(b);
            }
            Ok(())
        })?;
        Ok(out)
    }
}
