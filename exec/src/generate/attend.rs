//! The attention of a decode step: every query head of every sequence over its own KV
//! cache, split into runs of consecutive positions that the pool's threads take whole.
//!
//! Why runs of positions and not one task per head: a cache row holds every KV head
//! (`[positions, kv_heads · head_dim]`), so a task of one head reads a third of each row
//! (SmolLM2's three KV heads) at a stride of the whole row. On this project's 2-core
//! EPYC such a strided scan touched a 30-layer cache at 9.7 GB/s on one thread, where the
//! same bytes read row after row stream at about three times that; at 330 cached
//! positions attention was 45% of a W4A8 decode step in a profile. A task here reads its rows in
//! blocks of [`BLOCK_ROWS`] (a few KiB), every head over a block before the next block,
//! so each row is fetched from memory once and the GQA group's other heads find it in
//! L1.
//!
//! Each head's softmax runs in vector lanes ([`softmax_in_place`]: the prefill's
//! `exp_approx`, within 2 ulp of `expf`).
//!
//! A run's heads leave a partial result (the run's largest score, the sum of its
//! exponentials, its probability-weighted values); runs of one query are merged by the
//! usual rescaling. A query attended in one run (a short cache, or as many sequences as
//! threads) is a plain single pass: its scores, the softmax over them, the weighted sum in
//! position order. Over 640 generated tokens (330 cached positions on average), per-head
//! tasks decoded 230 tok/s against 271 with runs (`generate --precision w4a8-g32
//! --max-tokens 640`, 4 interleaved runs, medians).

use std::ops::Range;

use hetsched_kernels::{add_weighted_rows, scaled_dots, softmax_in_place};
use rayon::prelude::*;

use super::sequence_kv::KvRows;
use crate::ExecModel;

/// Cache rows a task scores (or weights) for every head before the next rows: 16 rows of
/// SmolLM2's 192 values are 12 KiB, within L1 beside the query.
const BLOCK_ROWS: usize = 16;
/// The fewest positions a run is cut to (a block): a query is split between the threads
/// from 32 cached positions on. With 64 a tg128 step (mostly under 128 positions) left a
/// thread idle through attention and decoded about 3% slower.
const MIN_RUN: usize = 16;

/// One sequence's query of a decode step (`[n_heads, head_dim]`, RoPE applied) and the
/// cache it attends over: the first `kv_len` positions of `cache`.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    /// The query.
    pub q: &'a [f32],
    /// The sequence's keys and values ([`KvRows::of`] a cache, or a shared prefix and the
    /// sequence's own rows).
    pub cache: KvRows<'a>,
    /// Positions attended (the query's own included).
    pub kv_len: usize,
}

/// The shape every task shares.
#[derive(Clone, Copy)]
struct Heads {
    /// Query heads.
    n: usize,
    /// Values a head.
    d: usize,
    /// Query heads a KV head serves.
    group: usize,
    /// Values a cache row (every KV head's).
    kv_dim: usize,
    /// `1 / √d`.
    scale: f32,
}

/// What one run of positions leaves for each head of its query.
struct Partial {
    /// The run's largest score, per head.
    max: Vec<f32>,
    /// `Σ exp(score - max)` over the run, per head.
    total: Vec<f32>,
    /// `Σ p · v` with `p = exp(score - max) / total`, `[heads, d]`.
    values: Vec<f32>,
}

/// Causal GQA attention of every query of a decode step over its own cache, or only the
/// last `window` positions of it (a sliding-window layer; `usize::MAX`: all), into `out`
/// (`[queries, n_heads · head_dim]`). One parallel region on the current pool for every
/// sequence's runs together; a query cut into several runs (fewer sequences than threads
/// and a long cache) is merged after it.
pub fn attend_all(model: &ExecModel, queries: &[Query<'_>], window: usize, out: &mut [f32]) {
    let c = &model.config;
    attend(
        &Heads::new(c.n_heads, c.n_kv_heads, c.head_dim),
        queries,
        window,
        out,
    );
}

impl Heads {
    fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Self {
        let d = head_dim.max(1);
        Self {
            n: n_heads,
            d,
            group: (n_heads / n_kv_heads.max(1)).max(1),
            kv_dim: n_kv_heads * d,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }
}

/// [`attend_all`] for heads of the shape `heads`.
fn attend(heads: &Heads, queries: &[Query<'_>], window: usize, out: &mut [f32]) {
    let d = heads.d;
    debug_assert_eq!(out.len(), queries.len() * heads.n * d);
    let threads = rayon::current_num_threads().max(1);
    let tasks: Vec<(usize, Range<usize>)> = queries
        .iter()
        .enumerate()
        .flat_map(|(i, query)| {
            let first = query.kv_len.saturating_sub(window);
            let runs = runs_of(first..query.kv_len, threads.div_ceil(queries.len()));
            runs.into_iter().map(move |run| (i, run))
        })
        .collect();
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map(|(i, run)| attend_run(heads, &queries[*i], run.clone()))
        .collect();
    let width = heads.n * d;
    for (i, out) in out.chunks_exact_mut(width.max(1)).enumerate() {
        let mine = tasks.iter().zip(&partials).filter(|((q, _), _)| *q == i);
        merge(heads, mine.map(|(_, p)| p), out);
    }
}

/// `positions` cut into at most `parts` runs of at least [`MIN_RUN`] (one run if it is
/// shorter), of nearly equal lengths.
fn runs_of(positions: Range<usize>, parts: usize) -> Vec<Range<usize>> {
    let len = positions.len();
    let parts = parts.min(len / MIN_RUN).max(1);
    (0..parts)
        .map(|p| positions.start + p * len / parts..positions.start + (p + 1) * len / parts)
        .collect()
}

/// Every head of `query` over the cache positions `run`: the scores block by block, the
/// softmax over the run, the weighted values block by block.
fn attend_run(h: &Heads, query: &Query<'_>, run: Range<usize>) -> Partial {
    let (n, d, kv_dim) = (run.len(), h.d, h.kv_dim);
    let runs = query.cache.runs(run, kv_dim);
    let mut scores = vec![0f32; h.n * n];
    let mut at = 0;
    for (keys, _) in runs {
        for_each_block(keys, kv_dim, |j, block, rows| {
            for head in 0..h.n {
                let q = &query.q[head * d..(head + 1) * d];
                let to = &mut scores[head * n + at + j..][..rows];
                scaled_dots(q, block, kv_dim, (head / h.group) * d, h.scale, to);
            }
        });
        at += keys.len() / kv_dim.max(1);
    }
    let (mut max, mut total) = (vec![f32::NEG_INFINITY; h.n], vec![0f32; h.n]);
    for (head, scores) in scores.chunks_exact_mut(n.max(1)).enumerate() {
        (max[head], total[head]) = softmax_in_place(scores);
    }
    let mut values = vec![0f32; h.n * d];
    let mut at = 0;
    for (_, rows_v) in runs {
        for_each_block(rows_v, kv_dim, |j, block, rows| {
            for head in 0..h.n {
                let p = &scores[head * n + at + j..][..rows];
                let acc = &mut values[head * d..(head + 1) * d];
                add_weighted_rows(p, block, kv_dim, (head / h.group) * d, acc);
            }
        });
        at += rows_v.len() / kv_dim.max(1);
    }
    Partial { max, total, values }
}

/// `f(first row, rows' values, row count)` for each block of [`BLOCK_ROWS`] rows of
/// `rows` (`[count, kv_dim]`).
fn for_each_block(rows: &[f32], kv_dim: usize, mut f: impl FnMut(usize, &[f32], usize)) {
    for (b, block) in rows.chunks(BLOCK_ROWS * kv_dim.max(1)).enumerate() {
        f(b * BLOCK_ROWS, block, block.len() / kv_dim.max(1));
    }
}

/// One query's output from the partial results of its runs (in position order): a lone
/// run's weighted values as they are, several rescaled by `exp(max - overall max)` times
/// their share of the exponentials' total.
fn merge<'p>(h: &Heads, partials: impl Iterator<Item = &'p Partial> + Clone, out: &mut [f32]) {
    let d = h.d;
    if partials.clone().count() == 1 {
        let only = partials.clone().next().expect("one partial");
        out.copy_from_slice(&only.values);
        return;
    }
    out.fill(0.0);
    for head in 0..h.n {
        let overall = partials
            .clone()
            .fold(f32::NEG_INFINITY, |m, p| m.max(p.max[head]));
        let weight = |p: &Partial| (p.max[head] - overall).exp() * p.total[head];
        let sum: f32 = partials.clone().map(weight).sum();
        let out = &mut out[head * d..(head + 1) * d];
        for p in partials.clone() {
            let share = weight(p) / sum;
            for (o, v) in out.iter_mut().zip(&p.values[head * d..(head + 1) * d]) {
                *o += share * v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use hetsched_kernels::seeded::SeededRng;

    use super::*;
    use crate::generate::sequence_kv::SequenceKv;
    use crate::state::KvCache;

    /// `Σ_j softmax(q · k_j / √d)_j v_j` per head in f64, over positions `first..kv_len`
    /// of `rows` (`[positions, kv_dim]` keys and values).
    fn reference(
        h: &Heads,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        first: usize,
        kv_len: usize,
    ) -> Vec<f64> {
        let (d, kv_dim) = (h.d, h.kv_dim);
        let mut out = vec![0f64; h.n * d];
        for head in 0..h.n {
            let off = (head / h.group) * d;
            let qh = &q[head * d..(head + 1) * d];
            let scores: Vec<f64> = (first..kv_len)
                .map(|j| {
                    let kj = &k[j * kv_dim + off..j * kv_dim + off + d];
                    qh.iter()
                        .zip(kj)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for (j, s) in (first..kv_len).zip(&scores) {
                let p = (s - max).exp() / total;
                for (o, &x) in out[head * d..(head + 1) * d]
                    .iter_mut()
                    .zip(&v[j * kv_dim + off..])
                {
                    *o += p * x as f64;
                }
            }
        }
        out
    }

    /// Against the f64 reference within 2e-6 of the values' scale, on pools of 1 to 4
    /// threads (one run a query, and queries cut into runs merged after), caches of
    /// every length around the block and run sizes, a window, a shared prefix and
    /// several sequences in one step.
    #[test]
    fn runs_of_positions_merge_to_the_whole_softmax() {
        let mut rng = SeededRng::new(41);
        let h = Heads::new(9, 3, 64);
        for threads in 1..=4 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (kv_len, window, prefix, sequences) in [
                (1, usize::MAX, 0, 1),
                (15, usize::MAX, 0, 1),
                (33, usize::MAX, 0, 1),
                (100, usize::MAX, 0, 1),
                (333, usize::MAX, 0, 1),
                (333, 50, 0, 1),
                (120, usize::MAX, 40, 1),
                (70, usize::MAX, 17, 3),
                (90, 64, 0, 2),
            ] {
                let shared = KvCache {
                    k: rng.f32s(prefix * h.kv_dim),
                    v: rng.f32s(prefix * h.kv_dim),
                };
                let mut own: Vec<[KvCache; 1]> = (0..sequences)
                    .map(|_| {
                        [KvCache {
                            k: rng.f32s((kv_len - prefix) * h.kv_dim),
                            v: rng.f32s((kv_len - prefix) * h.kv_dim),
                        }]
                    })
                    .collect();
                let qs: Vec<Vec<f32>> = (0..sequences).map(|_| rng.f32s(h.n * h.d)).collect();
                let shared = [shared];
                let kvs: Vec<SequenceKv<'_>> = own
                    .iter_mut()
                    .map(|own| SequenceKv::after_prefix(&shared, prefix, own))
                    .collect();
                let queries: Vec<Query<'_>> = kvs
                    .iter()
                    .zip(&qs)
                    .map(|(kv, q)| Query {
                        q,
                        cache: kv.rows(0),
                        kv_len,
                    })
                    .collect();
                let mut out = vec![f32::NAN; sequences * h.n * h.d];
                pool.install(|| attend(&h, &queries, window, &mut out));
                let first = kv_len.saturating_sub(window);
                for (s, q) in qs.iter().enumerate() {
                    let k = [&shared[0].k[..], &own[s][0].k[..]].concat();
                    let v = [&shared[0].v[..], &own[s][0].v[..]].concat();
                    let want = reference(&h, q, &k, &v, first, kv_len);
                    let got = &out[s * h.n * h.d..(s + 1) * h.n * h.d];
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g as f64 - w).abs() <= 2e-6,
                            "threads {threads} kv_len {kv_len} window {window} sequence {s} value {i}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn runs_cover_the_positions_in_order_and_none_is_short() {
        for (len, parts) in [
            (0, 2),
            (1, 4),
            (15, 2),
            (16, 2),
            (32, 2),
            (33, 3),
            (1000, 7),
        ] {
            let runs = runs_of(5..5 + len, parts);
            assert!(runs.len() <= parts.max(1));
            assert_eq!(runs.first().unwrap().start, 5);
            assert_eq!(runs.last().unwrap().end, 5 + len);
            for pair in runs.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
            }
            if runs.len() > 1 {
                assert!(
                    runs.iter().all(|r| r.len() >= MIN_RUN),
                    "{len} in {parts}: {runs:?}"
                );
            }
        }
    }
}
