//! The fused GEMM of a decoder layer (`gemm_fused_tiles.glsl`, `gemm_fused_epilogue.glsl`):
//! RMSNorm folded into the GEMM's prologue, and RoPE with the KV-cache write, SiLU·up (or
//! GELU·up), or the residual add folded into its epilogue, so that a llama layer is four
//! GEMM dispatches and one attention. The activations are f32; the weights f32 (f32 sums on
//! CUDA cores, `gemm_f32_fused.comp`) or f16 (activations rounded to f16 as they are
//! staged, f32 sums: on tensor cores, `gemm_f16_coopmat_khr_fused.comp`, where the device
//! has KHR cooperative matrices, else on CUDA cores, `gemm_f16_fused.comp`).
//! Also the host-side weight layouts those epilogues expect ([`fold_norm`],
//! [`rope_pair_rows`], [`interleave_rows`]), prepared once when weights are uploaded.

use hetsched_kernels::reference::RopeStyle;

use crate::batch::{GpuBatch, dense};
use crate::buffers::{Elem, GpuMatrix};
use crate::context::GpuContext;
use crate::error::{Result, shape};
use crate::pipelines::{PUSH_WORDS, Shader};

/// What the fused GEMM does with the product (see the shader's header).
#[derive(Clone, Copy, Debug)]
pub enum GemmEpilogue<'a> {
    /// `out = a · wᵀ`.
    Store,
    /// `out += a · wᵀ` (the residual stream), and `flags[slot] = 1.0` when a sum is NaN or
    /// infinite, as [`GpuBatch::add_assign_checked`].
    Residual {
        /// A dense f32 matrix of flags.
        flags: &'a GpuMatrix,
        /// Which element the add raises.
        slot: usize,
    },
    /// `w` holds gate and up rows interleaved ([`interleave_rows`]); `out` `[m, n/2]` =
    /// `silu(gate) · up`.
    SiluMul,
    /// [`GemmEpilogue::SiluMul`] with GELU(tanh) for SiLU (Gemma): `out` = `gelu(gate) ·
    /// up`.
    GeluMul,
    /// `w` = `[Wq; Wk; Wv]` with each head's q and k rows in [`rope_pair_rows`] order: RoPE
    /// (the `angles` of [`GpuContext::rope_angles`] for the chunk's tokens) on q and k, q
    /// into `out` `[m, n_heads · head_dim]`, k and v into rows `pos0..pos0 + m` of the
    /// caches `[capacity, n_kv_heads · head_dim]`.
    QkvRope {
        /// RoPE's (cos, sin) table for the rows of `a`, `[m, head_dim]`.
        angles: &'a GpuMatrix,
        /// The layer's key and value caches.
        caches: (&'a GpuMatrix, &'a GpuMatrix),
        /// Cache row of `a`'s first row.
        pos0: usize,
        /// Query heads.
        n_heads: usize,
        /// Key/value heads.
        n_kv_heads: usize,
        /// Which dims RoPE pairs.
        style: RopeStyle,
    },
    /// [`GemmEpilogue::QkvRope`] with each row's position read from `positions` when the
    /// batch runs (so a recorded decode step replays at any position): row `r` is rotated
    /// by row `positions[r]` of `angles` (a table of every position the caches hold,
    /// [`GpuContext::rope_angles`] of `0..capacity`) and its k and v go to cache row
    /// `positions[r]`. Only for up to [`crate::GEMV_MAX_ROWS`] rows. The kernel cannot check
    /// positions it reads: each must be below the caches' and the table's rows.
    QkvRopeAt {
        /// RoPE's (cos, sin) table of every position, `[capacity, head_dim]`.
        angles: &'a GpuMatrix,
        /// The layer's key and value caches.
        caches: (&'a GpuMatrix, &'a GpuMatrix),
        /// `[1, m]` (or more) u32 positions ([`Elem::I32`]).
        positions: &'a GpuMatrix,
        /// Query heads.
        n_heads: usize,
        /// Key/value heads.
        n_kv_heads: usize,
        /// Which dims RoPE pairs.
        style: RopeStyle,
    },
}

/// Which cache rows a q/k/v step writes keys and values to, and which RoPE row it reads:
/// [`QkvRows::rope_epilogue`], [`GpuBatch::qkv_finish`](crate::GpuBatch::qkv_finish).
#[derive(Clone, Copy, Debug)]
pub enum QkvRows<'a> {
    /// Row `r` of the product is cache row `pos0 + r` and angle row `r` (a table of the
    /// product's rows, [`crate::GpuContext::rope_angles`] of their positions).
    From(usize),
    /// Row `r` is cache row and angle row `positions[r]` (`[1, m]` or more u32,
    /// [`Elem::I32`]), read when the batch runs (a recorded decode step; the table holds
    /// every position). The kernel cannot check what it reads: each position must be
    /// below the caches' and the table's rows.
    At(&'a GpuMatrix),
}

impl<'a> QkvRows<'a> {
    /// The fused GEMM's RoPE epilogue for these rows ([`GemmEpilogue::QkvRope`] or
    /// [`GemmEpilogue::QkvRopeAt`]): the q/k/v of a layer with neither biases nor QK-norm,
    /// rotated and written as they are stored.
    pub fn rope_epilogue(
        self,
        angles: &'a GpuMatrix,
        caches: (&'a GpuMatrix, &'a GpuMatrix),
        (n_heads, n_kv_heads): (usize, usize),
        style: RopeStyle,
    ) -> GemmEpilogue<'a> {
        match self {
            QkvRows::From(pos0) => GemmEpilogue::QkvRope {
                angles,
                caches,
                pos0,
                n_heads,
                n_kv_heads,
                style,
            },
            QkvRows::At(positions) => GemmEpilogue::QkvRopeAt {
                angles,
                caches,
                positions,
                n_heads,
                n_kv_heads,
                style,
            },
        }
    }
}

/// One fused GEMM: the optional RMSNorm of `a`'s rows (its weight folded into `w` by
/// [`fold_norm`]) and the epilogue.
#[derive(Clone, Copy, Debug)]
pub struct FusedGemm<'a> {
    /// `Some(eps)`: normalise each row of `a` first.
    pub norm_eps: Option<f32>,
    /// What happens to the product.
    pub epilogue: GemmEpilogue<'a>,
}

/// `w` `[n, k]` with column `j` scaled by `g[j]`: `rms_norm(x, g) · wᵀ = rms_norm(x, 1) ·
/// fold_norm(w, g)ᵀ`, so the norm's weight costs nothing at run time.
pub fn fold_norm(w: &[f32], k: usize, g: &[f32]) -> Vec<f32> {
    let mut out = w.to_vec();
    if k == 0 || g.len() != k {
        return out;
    }
    for row in out.chunks_exact_mut(k) {
        for (v, s) in row.iter_mut().zip(g) {
            *v *= s;
        }
    }
    out
}

/// The order of one head's `head_dim` rows that puts RoPE's rotated pairs at (2i, 2i + 1):
/// row `2i` of the result is dim `a(i)`, row `2i + 1` dim `b(i)`, for the pairs
/// (2i, 2i + 1) of [`RopeStyle::Adjacent`] (the identity) and (i, i + d/2) of
/// [`RopeStyle::HalfSplit`].
pub fn rope_pair_rows(head_dim: usize, style: RopeStyle) -> Vec<usize> {
    let half = head_dim / 2;
    (0..half)
        .flat_map(|i| match style {
            RopeStyle::Adjacent => [2 * i, 2 * i + 1],
            RopeStyle::HalfSplit => [i, i + half],
        })
        .collect()
}

/// Rows of `w` `[heads · head_dim, k]` reordered head by head as [`rope_pair_rows`] says.
pub fn reorder_rope_rows(w: &[f32], k: usize, head_dim: usize, style: RopeStyle) -> Vec<f32> {
    let order = rope_pair_rows(head_dim, style);
    let mut out = Vec::with_capacity(w.len());
    for head in w.chunks_exact(head_dim * k) {
        for &r in &order {
            out.extend_from_slice(&head[r * k..(r + 1) * k]);
        }
    }
    out
}

/// `gate` and `up` `[n, k]` interleaved row by row into `[2n, k]` (gate j, then up j), the
/// layout of [`GemmEpilogue::SiluMul`].
pub fn interleave_rows(gate: &[f32], up: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gate.len() + up.len());
    for (g, u) in gate.chunks_exact(k.max(1)).zip(up.chunks_exact(k.max(1))) {
        out.extend_from_slice(g);
        out.extend_from_slice(u);
    }
    out
}

const OP: &str = "gemm_fused";

/// Checks that `m` is an f32 `[rows, cols]` matrix (rows may be padded: the kernel takes
/// its row stride).
fn f32_shape(what: &str, m: &GpuMatrix, rows: usize, cols: usize) -> Result<()> {
    if m.elem() != Elem::F32 || m.rows() != rows || m.cols() != cols {
        return Err(shape(
            OP,
            format!(
                "{what} is [{}, {}] {:?}, expected [{rows}, {cols}] f32",
                m.rows(),
                m.cols(),
                m.elem()
            ),
        ));
    }
    Ok(())
}

fn check_ab(a: &GpuMatrix, w: &GpuMatrix) -> Result<()> {
    let w_ok = matches!(w.elem(), Elem::F32 | Elem::F16);
    if a.elem() != Elem::F32 || !w_ok || a.cols() != w.cols() {
        return Err(shape(
            OP,
            format!(
                "a [{}, {}] {:?} (f32) and w [{}, {}] {:?} (f32 or f16) must have the same k",
                a.rows(),
                a.cols(),
                a.elem(),
                w.rows(),
                w.cols(),
                w.elem()
            ),
        ));
    }
    if a.rows() > 65_535 * 64 {
        return Err(shape(OP, format!("{} rows exceed one dispatch", a.rows())));
    }
    Ok(())
}

/// Push constants and the five mode-dependent bindings (angles, k cache, v cache, flags,
/// positions; `None` where unused) of one fused GEMM, after checking its operands.
type Plan<'a> = ([u32; PUSH_WORDS], [Option<&'a GpuMatrix>; 5]);

fn plan<'a>(a: &GpuMatrix, w: &GpuMatrix, out: &GpuMatrix, f: &FusedGemm<'a>) -> Result<Plan<'a>> {
    check_ab(a, w)?;
    let (m, n) = (a.rows(), w.rows());
    let mut p = [0u32; PUSH_WORDS];
    p[0] = m as u32;
    p[1] = n as u32;
    p[2] = (a.ld_words() / 4) as u32;
    p[4] = (w.ld_words() / 4) as u32;
    p[7] = u32::from(f.norm_eps.is_some());
    p[8] = f.norm_eps.unwrap_or(0.0).to_bits();
    p[9] = a.cols() as u32;
    let mut binds = [None; 5];
    match f.epilogue {
        GemmEpilogue::Store | GemmEpilogue::Residual { .. } => {
            f32_shape("out", out, m, n)?;
            if let GemmEpilogue::Residual { flags, slot } = f.epilogue {
                dense(OP, "flags", flags, flags.rows(), flags.cols())?;
                if slot >= flags.rows() * flags.cols() {
                    return Err(shape(OP, format!("flag slot {slot} past the flags")));
                }
                p[6] = 1;
                p[14] = slot as u32;
                binds[3] = Some(flags);
            }
        }
        GemmEpilogue::SiluMul | GemmEpilogue::GeluMul => {
            if !n.is_multiple_of(2) {
                return Err(shape(OP, format!("gate/up rows {n} must be even")));
            }
            f32_shape("out", out, m, n / 2)?;
            p[6] = match f.epilogue {
                GemmEpilogue::SiluMul => 2,
                _ => 4,
            };
        }
        GemmEpilogue::QkvRopeAt {
            angles,
            caches,
            positions,
            n_heads,
            n_kv_heads,
            style,
        } => {
            check_positions(m, positions, angles, caches.0)?;
            let table_rows = angles.rows();
            let at = QkvRows::From(0).rope_epilogue(angles, caches, (n_heads, n_kv_heads), style);
            let mut planned = plan_qkv(&mut p, m, n, out, at, table_rows)?;
            p[7] |= 4;
            planned[4] = Some(positions);
            binds = planned;
        }
        GemmEpilogue::QkvRope { .. } => {
            binds = plan_qkv(&mut p, m, n, out, f.epilogue, m)?;
        }
    }
    p[5] = out.ld_words() as u32;
    Ok((p, binds))
}

/// Checks [`GemmEpilogue::QkvRopeAt`]'s operands for `m` rows: `positions` holds `m` u32
/// values, and the angle table covers them without outgrowing the key cache `kc`.
fn check_positions(
    m: usize,
    positions: &GpuMatrix,
    angles: &GpuMatrix,
    kc: &GpuMatrix,
) -> Result<()> {
    if m > crate::GEMV_MAX_ROWS {
        return Err(shape(
            OP,
            format!(
                "positions from a buffer take at most {} rows, a has {m}",
                crate::GEMV_MAX_ROWS
            ),
        ));
    }
    if positions.elem() != Elem::I32 || positions.rows() * positions.cols() < m {
        return Err(shape(
            OP,
            format!("positions must hold {m} u32 values (I32)"),
        ));
    }
    let table_rows = angles.rows();
    // The table holds every position, not m rows: its columns and stride are checked by
    // `plan_qkv` as a table of m rows; here its rows against m and the caches' rows.
    if table_rows < m || table_rows > kc.rows() {
        return Err(shape(
            OP,
            format!(
                "an angle table of {table_rows} positions for caches of {} rows",
                kc.rows()
            ),
        ));
    }
    Ok(())
}

/// The push constants and bindings of [`GemmEpilogue::QkvRope`] (`epilogue`), with an
/// angle table of `table_rows` rows.
fn plan_qkv<'a>(
    p: &mut [u32; PUSH_WORDS],
    m: usize,
    n: usize,
    out: &GpuMatrix,
    epilogue: GemmEpilogue<'a>,
    table_rows: usize,
) -> Result<[Option<&'a GpuMatrix>; 5]> {
    let mut binds = [None; 5];
    match epilogue {
        GemmEpilogue::QkvRope {
            angles,
            caches: (kc, vc),
            pos0,
            n_heads,
            n_kv_heads,
            style,
        } => {
            let d = angles.cols();
            let (qcols, kvcols) = (n_heads * d, n_kv_heads * d);
            if d == 0 || !d.is_multiple_of(2) || n != qcols + 2 * kvcols {
                return Err(shape(
                    OP,
                    format!("w has {n} rows; q/k/v of {n_heads}/{n_kv_heads} heads x {d} (even)"),
                ));
            }
            f32_shape("q out", out, m, qcols)?;
            f32_shape("angles", angles, table_rows, d)?;
            if kc.ld() != vc.ld() {
                return Err(shape(OP, "the k and v caches' rows differ in stride"));
            }
            for (what, cache) in [("k cache", kc), ("v cache", vc)] {
                f32_shape(what, cache, cache.rows(), kvcols)?;
                if pos0 + m > cache.rows() {
                    return Err(shape(
                        OP,
                        format!(
                            "{what} of {} rows has no rows {pos0}..{}",
                            cache.rows(),
                            pos0 + m
                        ),
                    ));
                }
            }
            p[6] = 3;
            p[7] |= u32::from(style == RopeStyle::HalfSplit) << 1;
            p[10] = qcols as u32;
            p[11] = kvcols as u32;
            p[12] = d as u32;
            p[13] = pos0 as u32;
            p[3] = (angles.ld_words() / 2) as u32;
            p[15] = kc.ld_words() as u32;
            binds[0] = Some(angles);
            binds[1] = Some(kc);
            binds[2] = Some(vc);
        }
        _ => return Err(shape(OP, "not a q/k/v epilogue")),
    }
    Ok(binds)
}

impl GpuContext {
    /// Whether [`GpuBatch::gemm_fused`] with f16 weights runs on tensor cores here (this
    /// build has the KHR kernels and the device 16x16x16 f16 cooperative matrices); else
    /// it runs the same arithmetic on CUDA cores.
    pub fn fused_gemm_on_tensor_cores(&self) -> bool {
        Shader::GemmF16FusedKhr.compiled() && self.check_coop(crate::CoopKernel::Khr64x64).is_ok()
    }

    /// The kernel of a fused GEMM of `m` rows with weights of type `w`: the one-row
    /// kernel for one row (a single sequence's decode step), the few-row kernel up to
    /// [`crate::GEMV_MAX_ROWS`] rows, else the tiles.
    fn fused_shader(&self, m: usize, w: Elem) -> Shader {
        match w {
            Elem::F16 if m == 1 && self.one_row_gemv_subgroup => Shader::Gemv1F16FusedSg,
            _ if m == 1 && self.one_row_gemv_subgroup => Shader::Gemv1F32FusedSg,
            Elem::F16 if m == 1 => Shader::Gemv1F16Fused,
            _ if m == 1 => Shader::Gemv1F32Fused,
            Elem::F16 if m <= crate::GEMV_MAX_ROWS => Shader::GemvF16Fused,
            _ if m <= crate::GEMV_MAX_ROWS => Shader::GemvF32Fused,
            Elem::F16 if self.fused_gemm_on_tensor_cores() => Shader::GemmF16FusedKhr,
            Elem::F16 => Shader::GemmF16Fused,
            _ => Shader::GemmF32Fused,
        }
    }
}

impl<C: AsRef<GpuContext>> GpuBatch<C> {
    /// One fused GEMM `a · wᵀ` (`a` `[m, k]` f32, `w` `[n, k]` f32 or f16) with the
    /// prologue and epilogue `f` describes; one dispatch of 64x64 tiles, or for up to
    /// [`crate::GEMV_MAX_ROWS`] rows of one workgroup per 4 columns. With f16 weights
    /// `a` is rounded to f16 on the way in and the sums stay f32 (see the module note).
    pub fn gemm_fused(
        &mut self,
        a: &GpuMatrix,
        w: &GpuMatrix,
        out: &GpuMatrix,
        f: FusedGemm<'_>,
    ) -> Result<()> {
        let (push, binds) = plan(a, w, out, &f)?;
        let job = self.job_mut();
        let unused = job.ctx().unused_bindings()?;
        let extra: Vec<_> = binds
            .iter()
            .zip(&unused)
            .map(|(m, u)| m.map_or_else(|| u.clone(), |m| m.buf.clone()))
            .collect();
        let shader = job.ctx().fused_shader(a.rows(), w.elem());
        let few = matches!(
            shader,
            Shader::GemvF32Fused
                | Shader::GemvF16Fused
                | Shader::Gemv1F32Fused
                | Shader::Gemv1F16Fused
                | Shader::Gemv1F32FusedSg
                | Shader::Gemv1F16FusedSg
        );
        let groups = match few {
            true => [w.rows().div_ceil(4) as u32, 1, 1],
            false => [
                w.rows().div_ceil(64) as u32,
                a.rows().div_ceil(64) as u32,
                1,
            ],
        };
        let mut buffers = vec![&a.buf, &w.buf, &out.buf];
        buffers.extend(&extra[..4]);
        if few {
            buffers.push(&extra[4]);
        }
        job.dispatch(shader, &buffers, push, groups)
    }
}
