//! Rotary position embedding, matching `hetsched_kernels::reference::rope` (both styles).

use hetsched_kernels::reference::RopeStyle;

use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::job::{Bind, for_row_chunks, stride_groups};
use crate::pipelines::{PUSH_WORDS, Shader};

/// `(cos, sin)` of every (token, pair) as interleaved f32 bits, computed in f64 like the
/// reference; see rope.comp for why the GPU does not evaluate them.
pub(crate) fn cos_sin_table(positions: &[usize], head_dim: usize, theta_base: f32) -> Vec<u32> {
    let half = head_dim / 2;
    let base = f64::from(theta_base);
    let mut table = Vec::with_capacity(positions.len() * half * 2);
    for &pos in positions {
        for i in 0..half {
            let freq = base.powf(-2.0 * i as f64 / head_dim as f64);
            let (sin, cos) = (pos as f64 * freq).sin_cos();
            table.push((cos as f32).to_bits());
            table.push((sin as f32).to_bits());
        }
    }
    table
}

impl GpuContext {
    /// RoPE in place on `x` `[tokens, n_heads, head_dim]`, `tokens = positions.len()`; pair
    /// `i` of every head at position `p` turns by `p · theta_base^(-2i / head_dim)`.
    pub fn rope(
        &self,
        x: &mut [f32],
        positions: &[usize],
        n_heads: usize,
        head_dim: usize,
        theta_base: f32,
        style: RopeStyle,
    ) -> Result<()> {
        if !head_dim.is_multiple_of(2) {
            return Err(shape("rope", format!("head_dim {head_dim} must be even")));
        }
        let tok = n_heads * head_dim;
        if x.len() != positions.len() * tok {
            return Err(shape(
                "rope",
                format!(
                    "x has {} elements, [{}, {n_heads}, {head_dim}] needs {}",
                    x.len(),
                    positions.len(),
                    positions.len() * tok
                ),
            ));
        }
        if tok == 0 {
            return Ok(());
        }
        let half = head_dim / 2;
        for_row_chunks(self, "rope", positions.len(), tok * 4, |t0, t1| {
            let n = t1 - t0;
            let xs: Vec<u32> = x[t0 * tok..t1 * tok].iter().map(|v| v.to_bits()).collect();
            let table = cos_sin_table(&positions[t0..t1], head_dim, theta_base);
            let mut push = [0u32; PUSH_WORDS];
            push[0] = n as u32;
            push[1] = n_heads as u32;
            push[2] = head_dim as u32;
            push[3] = match style {
                RopeStyle::Adjacent => 0,
                RopeStyle::HalfSplit => 1,
            };
            let got = self.run_simple(
                Shader::Rope,
                &[Bind::Upload(&xs), Bind::Upload(&table)],
                &[0],
                push,
                stride_groups(n * n_heads * half),
            )?;
            for (o, &b) in x[t0 * tok..t1 * tok].iter_mut().zip(&got[0]) {
                *o = f32::from_bits(b);
            }
            Ok(())
        })
    }
}
