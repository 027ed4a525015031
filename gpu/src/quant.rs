//! INT8 quantization (f32 -> i8, per-tensor scale) and dequantization of GEMM accumulators,
//! matching `hetsched_kernels::reference::{quantize_per_tensor, scale_for_max_abs,
//! dequantize_i32_acc}` exactly.

use crate::buffers::{Elem, GpuMatrix, unpack_f32, unpack_i8};
use crate::context::GpuContext;
use crate::elementwise::FLAT_ROW;
use crate::error::{Result, shape};
use crate::job::{Bind, Job, for_row_chunks, stride_groups};
use crate::pipelines::{PUSH_WORDS, Shader};

fn f32_words(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn unpack_flat_i8(words: &[u32], len: usize) -> Vec<i8> {
    let mut v = unpack_i8(words, 1, words.len() * 4);
    v.truncate(len);
    v
}

impl GpuContext {
    /// The quantize kernel: exact with f64 residuals where the device has them.
    fn quantize_shader(&self) -> Shader {
        if self.info.shader_f64 {
            Shader::Quantize
        } else {
            Shader::QuantizeF32
        }
    }

    /// Per-tensor quantization with a given scale:
    /// `q[i] = clamp(round_ties_even(x[i] / scale), -127, 127)`, NaN -> 0.
    pub fn quantize_per_tensor(&self, x: &[f32], scale: f32) -> Result<Vec<i8>> {
        if scale.is_nan() || scale <= 0.0 {
            return Err(shape(
                "quantize_per_tensor",
                format!("scale {scale} must be positive"),
            ));
        }
        let len = x.len();
        let mut out = vec![0i8; len];
        for_row_chunks(
            self,
            "quantize_per_tensor",
            len.div_ceil(FLAT_ROW),
            FLAT_ROW * 4,
            |r0, r1| {
                let (i0, i1) = (r0 * FLAT_ROW, (r1 * FLAT_ROW).min(len));
                let n = i1 - i0;
                let mut push = [0u32; PUSH_WORDS];
                push[0] = n as u32;
                push[1] = 0;
                push[2] = scale.to_bits();
                let got = self.run_simple(
                    self.quantize_shader(),
                    &[
                        Bind::Upload(&f32_words(&x[i0..i1])),
                        Bind::Output(n.div_ceil(4) as u64),
                        Bind::Upload(&[0, 0]),
                    ],
                    &[1],
                    push,
                    stride_groups(n.div_ceil(4)),
                )?;
                out[i0..i1].copy_from_slice(&unpack_flat_i8(&got[0], n));
                Ok(())
            },
        )?;
        Ok(out)
    }

    /// Dynamic per-tensor quantization: the scale is `max|x| / 127` (1 when `x` is all zero),
    /// found on the GPU by a max-reduction in the same submission. Returns `(q, scale)`.
    pub fn quantize_dynamic(&self, x: &[f32]) -> Result<(Vec<i8>, f32)> {
        let len = x.len();
        let mut job = Job::new(self)?;
        let xb = job.upload(&f32_words(x), "quantize_dynamic input")?;
        let qb = self.alloc_words(len.div_ceil(4) as u64, "quantize_dynamic output")?;
        let sb = job.upload(&[0, 0], "quantize_dynamic scale")?;
        let mut push = [0u32; PUSH_WORDS];
        push[0] = len as u32;
        job.dispatch(Shader::AbsMax, &[&xb, &sb], push, stride_groups(len))?;
        push[1] = 1;
        job.dispatch(
            self.quantize_shader(),
            &[&xb, &qb, &sb],
            push,
            stride_groups(len.div_ceil(4)),
        )?;
        job.download(&qb);
        job.download(&sb);
        let done = job.finish()?;
        let scale = f32::from_bits(done.downloads[1][1]);
        if len == 0 {
            return Ok((Vec::new(), 1.0));
        }
        Ok((unpack_flat_i8(&done.downloads[0], len), scale))
    }

    /// Dequantizes i32 GEMM accumulators `acc` `[m, n]`:
    /// `out[i, j] = acc[i, j] as f32 * (a_scale * w_scales[j])`, bit-exact with the reference.
    pub fn dequantize_i32_acc(
        &self,
        acc: &[i32],
        m: usize,
        n: usize,
        a_scale: f32,
        w_scales: &[f32],
    ) -> Result<Vec<f32>> {
        if acc.len() != m * n {
            return Err(shape(
                "dequantize_i32_acc",
                format!("acc has {} elements, [{m}, {n}] needs {}", acc.len(), m * n),
            ));
        }
        if w_scales.len() != n {
            return Err(shape(
                "dequantize_i32_acc",
                format!("w_scales has {} elements, expected {n}", w_scales.len()),
            ));
        }
        let mut out = vec![0f32; m * n];
        if n == 0 {
            return Ok(out);
        }
        let ld = Elem::I32.ld(n);
        let scales = f32_words(w_scales);
        for_row_chunks(self, "dequantize_i32_acc", m, ld * 4, |r0, r1| {
            let rows = r1 - r0;
            let mut words = vec![0u32; rows * ld];
            for i in 0..rows {
                for j in 0..n {
                    words[i * ld + j] = acc[(r0 + i) * n + j] as u32;
                }
            }
            let mut push = [0u32; PUSH_WORDS];
            push[0] = rows as u32;
            push[1] = n as u32;
            push[2] = ld as u32;
            push[3] = a_scale.to_bits();
            let got = self.run_simple(
                Shader::Dequantize,
                &[
                    Bind::Upload(&words),
                    Bind::Upload(&scales),
                    Bind::Output((rows * ld) as u64),
                ],
                &[2],
                push,
                stride_groups(rows * ld),
            )?;
            out[r0 * n..r1 * n].copy_from_slice(&unpack_f32(&got[0], rows, n));
            Ok(())
        })?;
        Ok(out)
    }

    /// Resident dequantization: `acc` `[m, n]` in [`Elem::I32`] (from
    /// [`GpuContext::gemm_i8_device`]), `w_scales` a `[1, n]` f32 matrix, `out` `[m, n]` in
    /// [`Elem::F32`]. Returns the GPU time in ns.
    pub fn dequantize_device(
        &self,
        acc: &GpuMatrix,
        a_scale: f32,
        w_scales: &GpuMatrix,
        out: &GpuMatrix,
    ) -> Result<Option<u64>> {
        let (m, n) = (acc.rows(), acc.cols());
        if acc.elem() != Elem::I32 || out.elem() != Elem::F32 || w_scales.elem() != Elem::F32 {
            return Err(shape(
                "dequantize_device",
                "expected acc I32, w_scales F32, out F32",
            ));
        }
        if w_scales.rows() != 1 || w_scales.cols() != n || out.rows() != m || out.cols() != n {
            return Err(shape(
                "dequantize_device",
                format!("acc [{m}, {n}] needs w_scales [1, {n}] and out [{m}, {n}]"),
            ));
        }
        let mut push = [0u32; PUSH_WORDS];
        push[0] = m as u32;
        push[1] = n as u32;
        push[2] = acc.ld() as u32;
        push[3] = a_scale.to_bits();
        let mut job = Job::new(self)?;
        job.dispatch(
            Shader::Dequantize,
            &[&acc.buf, &w_scales.buf, &out.buf],
            push,
            stride_groups(m * acc.ld()),
        )?;
        Ok(job.finish()?.gpu_ns)
    }
}
