//! A decode step's gate and up linears with the gated activation in their parallel
//! region: each task computes the same output columns of both products and applies
//! `act(gate) ⊙ up` to them at once, so the activation runs split over the threads, on
//! the values each thread has just produced, instead of on one thread after the join
//! (which also reads the other thread's half of both products from its cache).
//!
//! The values are those of [`super::linears::project_batch`] followed by
//! [`crate::family::gated_into`]: the same kernels per column, and an activation applied
//! element by element.

use hetsched_import::Activation;
use rayon::prelude::*;

use super::linears::{Batch, Matrix, TASKS_PER_THREAD, Task, check, run};
use crate::ExecError;
use crate::family::gated_into;

/// The outputs of [`project_gated`]: the two products' buffers (`[n]` each, the
/// tasks' scratch) and the gated activation (`[n]`).
pub(super) struct GatedOut<'a> {
    pub(super) gate: &'a mut [f32],
    pub(super) up: &'a mut [f32],
    pub(super) hidden: &'a mut [f32],
}

/// `out.hidden = act(gate · row) ⊙ (up · row)` for a batch of one row without outliers,
/// in one parallel region on the current pool; `Ok(false)`, computing nothing, for
/// any other batch (several rows, or a shadowed row whose shadow product is added to
/// the products before the activation).
pub(super) fn project_gated(
    batch: &Batch,
    [gate, up]: [Matrix<'_>; 2],
    activation: Activation,
    out: GatedOut<'_>,
) -> Result<bool, ExecError> {
    let Some(input) = batch.single_plain() else {
        return Ok(false);
    };
    let n = gate.n();
    check(up.n(), n)?;
    for buffer in [&*out.gate, &*out.up, &*out.hidden] {
        check(buffer.len(), n)?;
    }
    let tasks = rayon::current_num_threads().max(1) * TASKS_PER_THREAD;
    let per_task = n.div_ceil(tasks).div_ceil(16).max(1) * 16;
    let columns = out
        .gate
        .chunks_mut(per_task)
        .zip(out.up.chunks_mut(per_task))
        .zip(out.hidden.chunks_mut(per_task))
        .enumerate()
        .collect::<Vec<_>>();
    columns
        .into_par_iter()
        .try_for_each(|(t, ((g, u), hidden))| {
            let cols = t * per_task..t * per_task + g.len();
            let (weights, out) = (gate, &mut *g);
            run(
                input,
                Task {
                    weights,
                    cols: cols.clone(),
                    out,
                },
            )?;
            let (weights, out) = (up, &mut *u);
            run(input, Task { weights, cols, out })?;
            gated_into(activation, g, u, hidden);
            Ok::<_, ExecError>(())
        })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use hetsched_kernels::PackedW4Weights;

    use super::*;
    use crate::LinearWeights;
    use crate::generate::linears::project_batch;
    use crate::generate::linears::tests::values;
    use crate::shadow::{QuantRule, ShadowCounters};
    use crate::values::quantize;

    fn w4(n: usize, k: usize, seed: u32) -> LinearWeights {
        LinearWeights::Int4 {
            packed: PackedW4Weights::quantize(&values(n * k, seed), n, k),
            shadow: None,
        }
    }

    /// The fused region's activation equals the two products then the gated activation,
    /// bit for bit (per-group and per-tensor rows, both activations, a width that the
    /// tasks do not split evenly); a shadowed row is left to the unfused path.
    #[test]
    fn fused_gated_products_equal_products_then_activation() {
        let (k, n) = (128, 600);
        let (gate, up) = (w4(n, k, 1), w4(n, k, 2));
        let matrices = [Matrix::Linear(&gate), Matrix::Linear(&up)];
        let counters = ShadowCounters::default();
        for rule in [QuantRule::Groups, QuantRule::MaxAbs] {
            for activation in [Activation::SiluGlu, Activation::GeluTanhGlu] {
                let mut batch = Batch::default();
                batch.set(vec![quantize(values(k, 5), rule.clone())]);
                let (mut g, mut u) = (vec![0f32; n], vec![0f32; n]);
                project_batch(&batch, &matrices, &mut [&mut g, &mut u], &counters).unwrap();
                let mut want = vec![0f32; n];
                gated_into(activation, &g, &u, &mut want);
                let (mut g2, mut u2, mut got) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
                let out = GatedOut {
                    gate: &mut g2,
                    up: &mut u2,
                    hidden: &mut got,
                };
                assert!(project_gated(&batch, matrices, activation, out).unwrap());
                assert_eq!(got, want, "{rule:?} {activation:?}");
            }
        }
        let mut shadowed = Batch::default();
        shadowed.set(vec![quantize(values(k, 5), QuantRule::Clip { rms: 3.0 })]);
        let (mut g, mut u, mut h) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        let out = GatedOut {
            gate: &mut g,
            up: &mut u,
            hidden: &mut h,
        };
        let fused = project_gated(&shadowed, matrices, Activation::SiluGlu, out).unwrap();
        assert!(!fused, "a row with outliers goes through the unfused path");
    }
}
