//! The q/k/v step of model families that add a bias or normalize q and k per head (Qwen2,
//! Gemma 3; `qkv_finish.comp`): the fused GEMM's RoPE epilogue ([`crate::GemmEpilogue::QkvRope`])
//! rotates the product as it stores it, which leaves no room for a per-head norm before the
//! rotation, so these layers store the plain product and finish it in one more dispatch.

use hetsched_kernels::reference::RopeStyle;

use crate::batch::{GpuBatch, dense};
use crate::buffers::{Elem, GpuMatrix};
use crate::error::{Result, shape};
use crate::fused::QkvRows;
use crate::pipelines::{PUSH_WORDS, Shader};

const OP: &str = "qkv_finish";

/// Largest head dimension of `qkv_finish.comp` (its shared row is sized for it).
const MAX_HEAD_DIM: usize = 256;

/// The optional parts of [`GpuBatch::qkv_finish`] and its operands.
#[derive(Clone, Copy, Debug)]
pub struct QkvFinish<'a> {
    /// RoPE's (cos, sin) table, `[rows, head_dim]` (see [`QkvRows`]).
    pub angles: &'a GpuMatrix,
    /// The layer's key and value caches, `[capacity, n_kv_heads · head_dim]`.
    pub caches: (&'a GpuMatrix, &'a GpuMatrix),
    /// Which cache and angle rows the product's rows are.
    pub rows: QkvRows<'a>,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Which dims RoPE pairs.
    pub style: RopeStyle,
    /// `[1, q + 2 kv]` biases of q, k and v, added first.
    pub bias: Option<&'a GpuMatrix>,
    /// `[1, 2 head_dim]`: the q and the k norm weights, and epsilon: each query and key
    /// head RMS-normalized after the bias, before RoPE.
    pub norm: Option<(&'a GpuMatrix, f32)>,
}

/// Checks [`GpuBatch::qkv_finish`]'s operands; returns the first cache row (or 0) and the
/// positions buffer, if the rows come from one.
fn check<'a>(
    qkv: &GpuMatrix,
    f: &QkvFinish<'a>,
    q_out: &GpuMatrix,
) -> Result<(usize, Option<&'a GpuMatrix>)> {
    let d = f.angles.cols();
    let (m, q_cols, kv_cols) = (qkv.rows(), f.n_heads * d, f.n_kv_heads * d);
    if d == 0 || !d.is_multiple_of(2) || d > MAX_HEAD_DIM {
        return Err(shape(
            OP,
            format!("head_dim {d} must be even, at most {MAX_HEAD_DIM}"),
        ));
    }
    dense(OP, "qkv", qkv, m, q_cols + 2 * kv_cols)?;
    dense(OP, "q out", q_out, m, q_cols)?;
    let (kc, vc) = f.caches;
    dense(OP, "k cache", kc, kc.rows(), kv_cols)?;
    dense(OP, "v cache", vc, vc.rows(), kv_cols)?;
    let capacity = kc.rows().min(vc.rows());
    let (pos0, table_rows, positions) = match f.rows {
        QkvRows::From(pos0) => (pos0, m, None),
        QkvRows::At(positions) => {
            if positions.elem() != Elem::I32 || positions.rows() * positions.cols() < m {
                return Err(shape(
                    OP,
                    format!("positions must hold {m} u32 values (I32)"),
                ));
            }
            (0, f.angles.rows().min(capacity), Some(positions))
        }
    };
    dense(OP, "angles", f.angles, table_rows, d)?;
    if pos0 + m > capacity {
        return Err(shape(
            OP,
            format!(
                "caches of {capacity} rows have no rows {pos0}..{}",
                pos0 + m
            ),
        ));
    }
    if let Some(bias) = f.bias {
        dense(OP, "bias", bias, 1, q_cols + 2 * kv_cols)?;
    }
    if let Some((norm, _)) = f.norm {
        dense(OP, "norm weights", norm, 1, 2 * d)?;
    }
    if m > 65_535 {
        return Err(shape(OP, format!("{m} rows exceed one dispatch")));
    }
    Ok((pos0, positions))
}

impl<C: AsRef<crate::GpuContext>> GpuBatch<C> {
    /// Finishes the product `qkv` `[m, q + 2 kv]` of a plain q/k/v GEMM (`[Wq; Wk; Wv]`,
    /// rows in the file's order): bias, per-head norm and RoPE as `f` says, the queries
    /// into `q_out` `[m, q]`, keys and values into the caches (see the shader's header).
    pub fn qkv_finish(
        &mut self,
        qkv: &GpuMatrix,
        f: &QkvFinish<'_>,
        q_out: &GpuMatrix,
    ) -> Result<()> {
        let (m, d) = (qkv.rows(), f.angles.cols());
        let (pos0, positions) = check(qkv, f, q_out)?;
        let (kc, vc) = f.caches;
        let flags = u32::from(positions.is_some())
            | u32::from(f.style == RopeStyle::HalfSplit) << 1
            | u32::from(f.bias.is_some()) << 2
            | u32::from(f.norm.is_some()) << 3;
        let mut push = [0u32; PUSH_WORDS];
        push[..11].copy_from_slice(&[
            m as u32,
            f.n_heads as u32,
            f.n_kv_heads as u32,
            d as u32,
            qkv.ld() as u32,
            q_out.ld() as u32,
            kc.ld() as u32,
            (f.angles.ld() / 2) as u32,
            pos0 as u32,
            flags,
            f.norm.map_or(0.0, |(_, eps)| eps).to_bits(),
        ]);
        let job = self.job_mut();
        let unused = job.ctx().unused_bindings()?;
        let bufs = [
            &qkv.buf,
            f.bias.map_or(&unused[0], |m| &m.buf),
            f.norm.map_or(&unused[1], |(n, _)| &n.buf),
            &f.angles.buf,
            &q_out.buf,
            &kc.buf,
            &vc.buf,
            positions.map_or(&unused[2], |m| &m.buf),
        ];
        let slots = f.n_heads + 2 * f.n_kv_heads;
        job.dispatch(Shader::QkvFinish, &bufs, push, [slots as u32, m as u32, 1])
    }
}
