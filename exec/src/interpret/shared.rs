//! What a CPU step shares beyond its chunk's values: the quantize operator (and the
//! shadow slot its outliers go to), the shadow stage and the merge of its results, and a
//! layer's KV rows and cache, which a later chunk's attention may write first.

use std::sync::Arc;

use parking_lot::Mutex;

use hetsched_kernels::AttentionShape;
use hetsched_systems::op::Projection;
use hetsched_systems::shadow::ShadowSite;

use super::StageRunner;
use crate::activation::Act;
use crate::blocks::for_each_block;
use crate::error::ExecError;
use crate::family;
use crate::float_kernels::FloatKernels;
use crate::lock_wait;
use crate::passes;
use crate::shadow::QuantRule;
use crate::state::KvRows;
use crate::steps::Step;
use crate::values::{LinearOut, dequantize, quantize, shadow_product};

impl StageRunner {
    /// The quantize operator of `site` in layer `layer`, after the calibration recorder
    /// (if any) has seen the activation. A shadowed site's outliers go to the chunk's
    /// shadow slot, for the shadow stage beside the INT8 linears. A non-finite input is
    /// refused before it is quantized.
    pub(super) fn quantize(
        &self,
        layer: usize,
        chunk: usize,
        site: ShadowSite,
        x: Vec<f32>,
    ) -> Result<Act, ExecError> {
        if let Some(recorder) = &self.state.recorder {
            recorder.observe(layer, site, &x);
        }
        let rule = self.model.quant_rule(layer, site);
        if rule != QuantRule::PassThrough {
            passes::finite_quantize_input(&x, Some((layer, site)), chunk)?;
        }
        let shadows = rule.shadows();
        let mut act = quantize(x, rule);
        if shadows && let Act::Int8 { outliers, .. } = &mut act {
            let outliers = Arc::new(std::mem::take(outliers));
            lock_wait::lock(&self.state.shadow[chunk]).pending = Some((site, outliers));
        }
        Ok(act)
    }

    /// The shadow stage of `site` (seed 000, Eq. 1): the pending outliers of chunk
    /// `chunk` times each of the site's linears' float rows, left for the merge.
    pub(super) fn shadow(
        &self,
        site: ShadowSite,
        layer: usize,
        chunk: usize,
    ) -> Result<(), ExecError> {
        let slot = &self.state.shadow[chunk];
        let outliers = match &lock_wait::lock(slot).pending {
            Some((pending, outliers)) if *pending == site => outliers.clone(),
            _ => return Err(ExecError::missing(Step::Shadow(site), chunk, "outliers")),
        };
        let rows = self.state.positions(chunk).len();
        let mut results = Vec::new();
        for &p in Projection::of_site(site) {
            let w = self.weights(layer, p)?;
            let y = shadow_product(&outliers, rows, w, &self.model.shadow_counters);
            results.push((p, y?));
        }
        let mut slot = lock_wait::lock(slot);
        for (p, y) in results {
            slot.results[p.index()] = Some(y);
        }
        slot.pending = None;
        Ok(())
    }

    /// `out` with chunk `chunk`'s shadow result for `p` attached, if the shadow left one:
    /// the merge of Eq. 1 (the dequantize adds it). `step` is the merging one.
    pub(super) fn merged(
        &self,
        chunk: usize,
        p: Projection,
        step: Step,
        out: LinearOut,
    ) -> Result<LinearOut, ExecError> {
        let mut slot = lock_wait::lock(&self.state.shadow[chunk]);
        if let Some((site, _)) = &slot.pending
            && Projection::of_site(*site).contains(&p)
        {
            return Err(ExecError::missing(step, chunk, "outlier shadow"));
        }
        let result = slot.results[p.index()].take();
        Ok(match (out, result) {
            (LinearOut::Int32 { acc, a_scale, .. }, Some(shadow)) => LinearOut::Int32 {
                acc,
                a_scale,
                shadow: Some(shadow),
            },
            (out, _) => out,
        })
    }

    /// Keeps a chunk's key or value projection until its rows are written.
    pub(super) fn keep_kv(&self, layer: usize, chunk: usize, p: Projection, out: LinearOut) {
        let mut rows = lock_wait::lock(&self.state.kv[layer].rows[chunk]);
        let (mut k, mut v) = match std::mem::take(&mut *rows) {
            KvRows::Pending { k, v } => (k, v),
            _ => (None, None),
        };
        if p == Projection::K {
            k = Some(out);
        } else {
            v = Some(out);
        }
        *rows = KvRows::Pending { k, v };
    }

    /// Writes chunk `chunk`'s keys (rotated) and values into layer `layer`'s cache, once.
    ///
    /// Seed 000's Eq. 2 lets chunk i's attention start once the projections of chunks
    /// 0..=i are done, before their own attention stages ran: so whichever stage needs
    /// a chunk's rows first writes them.
    pub(super) fn write_kv(&self, layer: usize, chunk: usize) -> Result<(), ExecError> {
        let m = &self.model;
        let c = &m.config;
        let kv = &self.state.kv[layer];
        let mut rows = lock_wait::lock(&kv.rows[chunk]);
        let (k, v) = match std::mem::replace(&mut *rows, KvRows::Written) {
            KvRows::Written => return Ok(()),
            KvRows::Pending {
                k: Some(k),
                v: Some(v),
            } => (k, v),
            other => {
                *rows = other;
                return Err(ExecError::missing(
                    Step::Attention,
                    chunk,
                    "keys and values",
                ));
            }
        };
        let k = self.merged(chunk, Projection::K, Step::Attention, k)?;
        let v = self.merged(chunk, Projection::V, Step::Attention, v)?;
        let w = self.layer(layer)?;
        let positions = self.state.positions(chunk);
        // Keys and values are finished apart, the values on a helper when one is free:
        // the float lane's job is often alone on the pool here.
        let finished = [Projection::K, Projection::V].map(|_| Mutex::new(None));
        let sides = vec![
            (Projection::K, k, &finished[0]),
            (Projection::V, v, &finished[1]),
        ];
        for_each_block(sides, |(p, out, slot)| {
            let rows = dequantize(out, w.projection(p)).map(|mut rows| {
                if p == Projection::K {
                    family::finish_keys_only(m, layer, &mut rows, positions.clone());
                } else {
                    family::finish_values(m, layer, &mut rows);
                }
                rows
            });
            *slot.lock() = Some(rows);
        });
        let [k, v] = finished.map(|slot| slot.into_inner().expect("each side ran once"));
        let (k, v) = (k?, v?);
        let kv_dim = c.kv_dim();
        let span = positions.start * kv_dim..positions.end * kv_dim;
        let mut cache = lock_wait::write(&kv.cache);
        cache.k[span.clone()].copy_from_slice(&k);
        cache.v[span].copy_from_slice(&v);
        Ok(())
    }

    /// Causal attention of chunk `chunk`'s queries `q` over layer `layer`'s cache, after
    /// the rows of every chunk up to this one are written.
    pub(super) fn attention(
        &self,
        kernels: &dyn FloatKernels,
        layer: usize,
        chunk: usize,
        q: &[f32],
    ) -> Result<Vec<f32>, ExecError> {
        let c = &self.model.config;
        for earlier in 0..=chunk {
            self.write_kv(layer, earlier)?;
        }
        let positions = self.state.positions(chunk);
        let shape = AttentionShape {
            n_tokens: positions.len(),
            pos0: positions.start,
            kv_len: positions.end,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let cache = lock_wait::read(&self.state.kv[layer].cache);
        kernels
            .attention(q, &cache.k, &cache.v, &shape, c.window_of(layer))
            .map_err(ExecError::from)
    }
}
