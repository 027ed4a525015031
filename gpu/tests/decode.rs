//! What a decode step recorded once and replayed needs: attention over positions read from
//! a buffer (`GpuBatch::attention_at`) and the few-token kernel against the reference, the
//! q/k/v GEMM taking its positions from a buffer (`GemmEpilogue::QkvRopeAt`) against the
//! same GEMM given them as push constants, split attention replayed at new positions, the
//! embedding gather, greedy sampling (ties to the lower id, NaN never chosen), a
//! recorded batch replayed with new inputs, and llama layers as one dispatch against the
//! same layers as five dispatches each.
//! Tolerances: attention `1e-5 · (max|v| + 0.1)` (as the other f32 attention kernels);
//! the rest exact.

mod common;

use std::sync::Arc;

use hetsched_gpu::{
    AttentionShape, DecodeLayerWeights, DecodeLayers, Elem, FusedGemm, GemmEpilogue, GpuBatch,
    GpuError, GpuMatrix, GpuOptions, RopeStyle,
};
use hetsched_kernels::{reference, seeded::SeededRng};

fn reference_attention(q: &[f32], k: &[f32], v: &[f32], s: &AttentionShape) -> Vec<f32> {
    let mut out = vec![0.0; q.len()];
    reference::attention_causal_gqa(q, k, v, &mut out, s);
    out
}

#[test]
fn decode_attention_matches_the_reference_at_any_position() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(41);
    // (tokens, pos0, heads, kv heads, head_dim, cache rows): one and several tokens, pasts
    // across the 64-key blocks (one workgroup each, merged), head_dim 8 to 256, and a past
    // long enough that each of the most workgroups walks two blocks.
    let cases = [
        (1, 9000, 2, 1, 8, 9001),
        (1, 0, 4, 2, 8, 1),
        (1, 300, 9, 3, 64, 301),
        (3, 510, 9, 3, 64, 600),
        (8, 17, 2, 1, 256, 40),
        (2, 700, 4, 4, 20, 702),
    ];
    for (n, pos0, heads, kv_heads, d, rows) in cases {
        let s = AttentionShape {
            n_tokens: n,
            pos0,
            kv_len: pos0 + n,
            n_heads: heads,
            n_kv_heads: kv_heads,
            head_dim: d,
        };
        let (qc, kvc) = (heads * d, kv_heads * d);
        let q = rng.f32s(n * qc);
        let k = rng.f32s(rows * kvc);
        let v = rng.f32s(rows * kvc);
        let want = reference_attention(&q, &k[..s.kv_len * kvc], &v[..s.kv_len * kvc], &s);
        let vmax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let tol = vec![vmax + 0.1; want.len()];
        let qm = ctx.upload_f32(&q, n, qc).unwrap();
        let km = ctx.upload_f32(&k, rows, kvc).unwrap();
        let vm = ctx.upload_f32(&v, rows, kvc).unwrap();
        let what = format!("{s:?}");
        // Positions as push constants (GpuBatch::attention picks the decode kernel)...
        let out = ctx.alloc_matrix(n, qc, Elem::F32).unwrap();
        common::run_batch(ctx, |b| b.attention(&qm, (&km, &vm), &s, &out));
        common::assert_close(&what, &ctx.download_f32(&out).unwrap(), &want, &tol, 1e-5);
        // ... and from a buffer, over caches with more rows than the keys attended.
        let pos: Vec<u32> = (pos0..pos0 + n).map(|p| p as u32).collect();
        let positions = ctx.upload_u32(&pos, 1, n).unwrap();
        let at = AttentionShape { kv_len: rows, ..s };
        let out_at = ctx.alloc_matrix(n, qc, Elem::F32).unwrap();
        common::run_batch(ctx, |b| {
            b.attention_at(&qm, (&km, &vm), &at, &positions, &out_at)
        });
        let got = ctx.download_f32(&out_at).unwrap();
        common::assert_same(
            &format!("{what} from a buffer"),
            &got,
            &ctx.download_f32(&out).unwrap(),
        );
    }
}

#[test]
fn split_decode_attention_replays_at_new_positions() {
    // A recorded step's attention over a 300-row cache runs split along its keys (five
    // workgroups a head, the last to finish merging them); each replay must find the
    // arrival counters back at zero, whichever position it attends from.
    let Some(ctx) = common::gpu_with(GpuOptions::default()) else {
        return;
    };
    let ctx = Arc::new(ctx);
    let mut rng = SeededRng::new(43);
    let (heads, kv_heads, d, capacity) = (9, 3, 64, 300);
    let (qc, kvc) = (heads * d, kv_heads * d);
    let k = rng.f32s(capacity * kvc);
    let v = rng.f32s(capacity * kvc);
    let km = ctx.upload_f32(&k, capacity, kvc).unwrap();
    let vm = ctx.upload_f32(&v, capacity, kvc).unwrap();
    let q_in = ctx.host_matrix(1, qc).unwrap();
    let q = ctx.alloc_matrix(1, qc, Elem::F32).unwrap();
    let position_in = ctx.host_matrix(1, 1).unwrap();
    let position = ctx.alloc_matrix(1, 4, Elem::I32).unwrap();
    let out = ctx.alloc_matrix(1, qc, Elem::F32).unwrap();
    let out_host = ctx.host_matrix(1, qc).unwrap();
    let at = AttentionShape {
        n_tokens: 1,
        pos0: 0,
        kv_len: capacity,
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: d,
    };
    let mut b = GpuBatch::replayable(ctx.clone()).unwrap();
    b.upload_host(&q_in, &q).unwrap();
    b.upload_host(&position_in, &position).unwrap();
    b.attention_at(&q, (&km, &vm), &at, &position, &out)
        .unwrap();
    b.download_host(&out, &out_host).unwrap();
    let step = b.record().unwrap();
    assert_eq!(
        step.dispatches(),
        1,
        "the merge runs inside the attention dispatch"
    );
    let vmax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    for pos in [299usize, 5, 130, 299, 64] {
        let qh = rng.f32s(qc);
        q_in.write(&qh.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            .unwrap();
        position_in.write(&[pos as u32]).unwrap();
        step.submit().unwrap();
        let s = AttentionShape {
            pos0: pos,
            kv_len: pos + 1,
            ..at
        };
        let want = reference_attention(&qh, &k[..s.kv_len * kvc], &v[..s.kv_len * kvc], &s);
        let got: Vec<f32> = out_host
            .read()
            .unwrap()
            .into_iter()
            .map(f32::from_bits)
            .collect();
        let tol = vec![vmax + 0.1; want.len()];
        common::assert_close(&format!("replay at {pos}"), &got, &want, &tol, 1e-5);
    }
}

#[test]
fn qkv_from_positions_in_a_buffer_equals_pushed_positions() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = SeededRng::new(43);
    let (heads, kv_heads, d, k, capacity) = (4, 2, 8, 36, 50);
    let (qc, kvc) = (heads * d, kv_heads * d);
    let n = qc + 2 * kvc;
    let w = ctx.upload_f32(&rng.f32s(n * k), n, k).unwrap();
    let table: Vec<usize> = (0..capacity).collect();
    let angles_all = ctx.rope_angles(&table, d, 10_000.0).unwrap();
    for style in [RopeStyle::Adjacent, RopeStyle::HalfSplit] {
        for pos in [0, 7, capacity - 1] {
            let x = ctx.upload_f32(&rng.f32s(k), 1, k).unwrap();
            let run = |at: bool| {
                let q = ctx.alloc_matrix(1, qc, Elem::F32).unwrap();
                let kc = ctx
                    .upload_f32(&vec![0.0; capacity * kvc], capacity, kvc)
                    .unwrap();
                let vc = ctx
                    .upload_f32(&vec![0.0; capacity * kvc], capacity, kvc)
                    .unwrap();
                let one = ctx.rope_angles(&[pos], d, 10_000.0).unwrap();
                let positions = ctx.upload_u32(&[pos as u32], 1, 1).unwrap();
                let epilogue = match at {
                    true => GemmEpilogue::QkvRopeAt {
                        angles: &angles_all,
                        caches: (&kc, &vc),
                        positions: &positions,
                        n_heads: heads,
                        n_kv_heads: kv_heads,
                        style,
                    },
                    false => GemmEpilogue::QkvRope {
                        angles: &one,
                        caches: (&kc, &vc),
                        pos0: pos,
                        n_heads: heads,
                        n_kv_heads: kv_heads,
                        style,
                    },
                };
                let f = FusedGemm {
                    norm_eps: Some(1e-5),
                    epilogue,
                };
                common::run_batch(ctx, |b| b.gemm_fused(&x, &w, &q, f));
                [&q, &kc, &vc].map(|m| ctx.download_f32(m).unwrap())
            };
            let (want, got) = (run(false), run(true));
            for (i, what) in ["q", "k cache", "v cache"].iter().enumerate() {
                common::assert_same(&format!("{style:?} at {pos}: {what}"), &got[i], &want[i]);
            }
        }
    }
    // More rows than the few-row kernel takes, and an angle table past the caches.
    let x9 = ctx.alloc_matrix(9, k, Elem::F32).unwrap();
    let q9 = ctx.alloc_matrix(9, qc, Elem::F32).unwrap();
    let kc = ctx.alloc_matrix(capacity, kvc, Elem::F32).unwrap();
    let positions = ctx.upload_u32(&[0; 9], 1, 9).unwrap();
    let f = FusedGemm {
        norm_eps: None,
        epilogue: GemmEpilogue::QkvRopeAt {
            angles: &angles_all,
            caches: (&kc, &kc),
            positions: &positions,
            n_heads: heads,
            n_kv_heads: kv_heads,
            style: RopeStyle::Adjacent,
        },
    };
    let mut b = ctx.batch().unwrap();
    let err = b.gemm_fused(&x9, &w, &q9, f);
    assert!(matches!(err, Err(GpuError::Shape { .. })), "{err:?}");
}

#[test]
fn embedding_gather_and_greedy_sampling_replay_with_new_inputs() {
    let Some(ctx) = common::gpu_with(GpuOptions::default()) else {
        return;
    };
    let ctx = Arc::new(ctx);
    let mut rng = SeededRng::new(47);
    let (vocab, cols) = (37, 12);
    let table_host = rng.f32s(vocab * cols);
    let table = ctx.upload_f32(&table_host, vocab, cols).unwrap();
    // The gathered rows are read as "logits": each row's argmax is known on the host.
    let ids_in = ctx.host_matrix(1, 3).unwrap();
    let ids = ctx.alloc_matrix(1, 4, Elem::I32).unwrap();
    let rows = ctx.alloc_matrix(3, cols, Elem::F32).unwrap();
    let best = ctx.alloc_matrix(1, 4, Elem::I32).unwrap();
    let best_out = ctx.host_matrix(1, 3).unwrap();
    let rows_out = ctx.host_matrix(3, cols).unwrap();
    let mut b = GpuBatch::replayable(ctx.clone()).unwrap();
    b.upload_host(&ids_in, &ids).unwrap();
    b.embed_rows(&table, &ids, &rows).unwrap();
    b.argmax_rows(&rows, &best).unwrap();
    b.download_host(&best, &best_out).unwrap();
    b.download_host(&rows, &rows_out).unwrap();
    let step = b.record().unwrap();
    assert_eq!(step.dispatches(), 2);
    for ids_host in [[3u32, 0, 36], [36, 36, 5], [vocab as u32, 1, 2]] {
        ids_in.write(&ids_host).unwrap();
        step.submit().unwrap();
        let got_rows: Vec<f32> = rows_out
            .read()
            .unwrap()
            .into_iter()
            .map(f32::from_bits)
            .collect();
        let got_best = best_out.read().unwrap();
        for (r, &id) in ids_host.iter().enumerate() {
            let want: Vec<f32> = match (id as usize) < vocab {
                true => table_host[id as usize * cols..][..cols].to_vec(),
                false => vec![0.0; cols], // an id past the table gathers zeros
            };
            let got = &got_rows[r * cols..][..cols];
            common::assert_same(&format!("row {r} of {ids_host:?}"), got, &want);
            let argmax = (0..cols).fold(0, |b, c| if want[c] > want[b] { c } else { b });
            assert_eq!(
                got_best[r], argmax as u32,
                "argmax of row {r} of {ids_host:?}"
            );
        }
    }
    // Ties go to the lower column, NaN is never chosen, a row of NaN has no answer.
    let nan = f32::NAN;
    let x = [
        [1.0, 5.0, 5.0, -1.0, 5.0],
        [nan, 2.0, nan, 3.0, 3.0],
        [nan, nan, nan, nan, nan],
        [-7.0, -3.0, -3.5, -3.0, -9.0],
    ];
    let flat: Vec<f32> = x.iter().flatten().copied().collect();
    let xm = ctx.upload_f32(&flat, 4, 5).unwrap();
    let out = ctx.alloc_matrix(1, 4, Elem::I32).unwrap();
    common::run_batch(&ctx, |b| b.argmax_rows(&xm, &out));
    let got = ctx.download_i32(&out).unwrap();
    assert_eq!(got, vec![1, 3, -1, 1]);
    // A recorded batch gives its results through host matrices, not reads.
    let mut b = GpuBatch::replayable(ctx.clone()).unwrap();
    b.read(&rows, 0..1).unwrap();
    assert!(matches!(b.record(), Err(GpuError::Shape { .. })));
    // A host matrix takes exactly its words.
    assert!(ids_in.write(&[1, 2]).is_err());
}

#[test]
fn one_dispatch_decode_layers_equal_their_five_dispatches_each() {
    // Six llama layers recorded as one dispatch (grid barriers between their stages and
    // between the layers) against the same layers as five dispatches each (q/k/v,
    // attention, o, gate/up, down), replayed at positions that split the attention into
    // one to three key runs (of 128 keys: with o a stage of its own, the last run's record
    // merged with the others'; with attention and o as one stage, every key in one run)
    // at the positions replayed: the stream, every layer's new cache row and the flags
    // agree. The products are summed in the same order by both (128 threads, a subgroup
    // sum) but for o as part of attention (its heads added in any order); attention walks
    // blocks of 128 keys against 64, so the stream's tolerance is attention's, `1e-5` of
    // the values' scale, widened by the products to 1e-4. Both widths of the kernel.
    at_both_widths(|ctx| layers_against_five_dispatches(ctx, Elem::F32));
}

#[test]
fn one_dispatch_decode_layers_with_f16_weights_equal_their_five_dispatches_each() {
    // As above with f16 weights: both ways round the products' inputs to f16 and sum in
    // f32 in the same order (the five dispatches' one-row f16 kernel), at the default
    // width. Attention's different order moves an input by an f32 ulp or so, which can
    // round it to the neighbouring f16: a step of 2^-11 of the value, so the tolerance is
    // f16's, 1e-3 of the stream's scale (1e-4 failed by 3.3e-4 at one position of six).
    let Some(ctx) = common::gpu_with(GpuOptions::default()) else {
        return;
    };
    if ctx.decode_layer_workgroups().is_none() {
        eprintln!("skipped: this device runs no one-dispatch decode layer");
        return;
    }
    layers_against_five_dispatches(Arc::new(ctx), Elem::F16);
}

/// The body of [`one_dispatch_decode_layers_equal_their_five_dispatches_each`] on `ctx`,
/// its weights of type `weights` (f32 or f16).
fn layers_against_five_dispatches(ctx: Arc<hetsched_gpu::GpuContext>, weights: Elem) {
    let mut rng = SeededRng::new(47);
    let (heads, kv_heads, d, hidden, ffn, capacity, n_layers) = (9, 3, 64, 576, 1536, 300, 6);
    let (qc, kvc) = (heads * d, kv_heads * d);
    let up = |data: &[f32], rows: usize, cols: usize| ctx.upload_f32(data, rows, cols).unwrap();
    let mut weight = |rows: usize, cols: usize, scale: f32| {
        let data: Vec<f32> = rng.f32s(rows * cols).iter().map(|v| v * scale).collect();
        match weights {
            Elem::F16 => ctx.upload_f32_as_f16(&data, rows, cols).unwrap(),
            _ => up(&data, rows, cols),
        }
    };
    let layer_weights: Vec<[GpuMatrix; 4]> = (0..n_layers)
        .map(|_| {
            [
                weight(qc + 2 * kvc, hidden, 0.2),
                weight(hidden, qc, 0.1),
                weight(2 * ffn, hidden, 0.2),
                weight(hidden, ffn, 0.1),
            ]
        })
        .collect();
    let table: Vec<usize> = (0..capacity).collect();
    let angles = ctx.rope_angles(&table, d, 10_000.0).unwrap();
    let k0 = rng.f32s(capacity * kvc);
    let v0 = rng.f32s(capacity * kvc);
    let zero_flags = vec![0.0f32; 16];
    // One recording per way, each over its own stream, caches and flags.
    let ways = [false, true].map(|at_once| {
        let x_in = ctx.host_matrix(1, hidden).unwrap();
        let x = ctx.alloc_matrix(1, hidden, Elem::F32).unwrap();
        let position_in = ctx.host_matrix(1, 1).unwrap();
        let position = ctx.alloc_matrix(1, 4, Elem::I32).unwrap();
        let caches: Vec<_> = (0..n_layers)
            .map(|l| {
                let shift =
                    |c: &[f32]| -> Vec<f32> { c.iter().map(|v| v + l as f32 * 0.1).collect() };
                (
                    up(&shift(&k0), capacity, kvc),
                    up(&shift(&v0), capacity, kvc),
                )
            })
            .collect();
        let q = ctx.alloc_matrix(1, qc, Elem::F32).unwrap();
        let attn = ctx.alloc_matrix(1, qc, Elem::F32).unwrap();
        let hid = ctx.alloc_matrix(1, ffn, Elem::F32).unwrap();
        let flags = up(&zero_flags, 4, 4);
        let x_out = ctx.host_matrix(1, hidden).unwrap();
        let caches_out: Vec<_> = (0..n_layers)
            .map(|_| ctx.host_matrix(capacity, kvc).unwrap())
            .collect();
        let mut b = GpuBatch::replayable(ctx.clone()).unwrap();
        b.upload_host(&x_in, &x).unwrap();
        b.upload_host(&position_in, &position).unwrap();
        let counters = b.decode_layer_counters(n_layers).unwrap();
        if at_once {
            let layers = layers_over(&layer_weights, &caches);
            let l = DecodeLayers {
                layers: &layers,
                x: &x,
                angles: &angles,
                positions: &position,
                keys: capacity,
                scratch: (&q, &attn, &hid),
                flags: (&flags, 0),
                heads: (heads, kv_heads),
                style: RopeStyle::Adjacent,
                eps: 1e-5,
            };
            b.decode_layers(&l, &counters).unwrap();
        }
        for (layer, ([qkv, o, gate_up, down], (kc, vc))) in layer_weights
            .iter()
            .zip(&caches)
            .enumerate()
            .filter(|_| !at_once)
        {
            let normed = |epilogue| FusedGemm {
                norm_eps: Some(1e-5),
                epilogue,
            };
            let residual = |block| FusedGemm {
                norm_eps: None,
                epilogue: GemmEpilogue::Residual {
                    flags: &flags,
                    slot: 2 * layer + block,
                },
            };
            let rope = GemmEpilogue::QkvRopeAt {
                angles: &angles,
                caches: (kc, vc),
                positions: &position,
                n_heads: heads,
                n_kv_heads: kv_heads,
                style: RopeStyle::Adjacent,
            };
            b.gemm_fused(&x, qkv, &q, normed(rope)).unwrap();
            let s = AttentionShape {
                n_tokens: 1,
                pos0: 0,
                kv_len: capacity,
                n_heads: heads,
                n_kv_heads: kv_heads,
                head_dim: d,
            };
            b.attention_at(&q, (kc, vc), &s, &position, &attn).unwrap();
            b.gemm_fused(&attn, o, &x, residual(0)).unwrap();
            b.gemm_fused(&x, gate_up, &hid, normed(GemmEpilogue::SiluMul))
                .unwrap();
            b.gemm_fused(&hid, down, &x, residual(1)).unwrap();
        }
        b.download_host(&x, &x_out).unwrap();
        for ((kc, _), out) in caches.iter().zip(&caches_out) {
            b.download_host(kc, out).unwrap();
        }
        let step = b.record().unwrap();
        (x_in, position_in, x_out, caches_out, flags, step)
    });
    let dispatches = ways.each_ref().map(|w| w.5.dispatches());
    let per_dispatch = ctx.decode_layers_per_dispatch().unwrap();
    assert_eq!(
        dispatches,
        [5 * n_layers, n_layers.div_ceil(per_dispatch)],
        "dispatches of the layers"
    );
    let read = |m: &hetsched_gpu::HostMatrix| -> Vec<f32> {
        m.read().unwrap().into_iter().map(f32::from_bits).collect()
    };
    for pos in [299usize, 5, 130, 299, 64, 255] {
        let x = rng.f32s(hidden);
        let words: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
        for (x_in, position_in, _, _, _, step) in &ways {
            x_in.write(&words).unwrap();
            position_in.write(&[pos as u32]).unwrap();
            step.submit().unwrap();
        }
        // A grid barrier that gave up leaves a stream of no meaning: say so first.
        let flags = ctx.download_f32(&ways[1].4).unwrap();
        assert!(
            !flags.contains(&hetsched_gpu::DECODE_LAYER_GAVE_UP),
            "at {pos}: a grid barrier gave up (flags {flags:?})"
        );
        let [want, got] = ways.each_ref().map(|w| read(&w.2));
        let scale = vec![want.iter().fold(1f32, |m, v| m.max(v.abs())); hidden];
        let tolerance = match weights {
            Elem::F16 => 1e-3,
            _ => 1e-4,
        };
        common::assert_close(&format!("stream at {pos}"), &got, &want, &scale, tolerance);
        for layer in 0..n_layers {
            let [want, got] = ways.each_ref().map(|w| read(&w.3[layer]));
            let row = pos * kvc..(pos + 1) * kvc;
            common::assert_close(
                &format!("layer {layer}'s cache row {pos}"),
                &got[row.clone()],
                &want[row],
                &vec![scale[0]; kvc],
                tolerance,
            );
        }
    }
    for (way, name) in ways.iter().zip(["five dispatches", "one dispatch"]) {
        let flags = ctx.download_f32(&way.4).unwrap();
        assert_eq!(flags, zero_flags, "{name}: no residual add raised its flag");
    }
}

#[test]
fn one_dispatch_decode_layers_are_refused_where_they_cannot_run() {
    let Some(ctx) = common::gpu_with(GpuOptions {
        five_dispatch_decode: true,
        ..GpuOptions::default()
    }) else {
        return;
    };
    assert_eq!(ctx.decode_layer_workgroups(), None);
    let ctx = Arc::new(ctx);
    let m = |rows, cols| ctx.alloc_matrix(rows, cols, Elem::F32).unwrap();
    let (x, w, angles, cache, flags) = (m(1, 8), m(8, 8), m(4, 4), m(4, 4), m(1, 4));
    let positions = ctx.alloc_matrix(1, 4, Elem::I32).unwrap();
    let layers = [DecodeLayerWeights {
        qkv: &w,
        o: &w,
        gate_up: &w,
        down: &w,
        caches: (&cache, &cache),
    }];
    let l = DecodeLayers {
        layers: &layers,
        x: &x,
        angles: &angles,
        positions: &positions,
        keys: 4,
        scratch: (&x, &x, &x),
        flags: (&flags, 0),
        heads: (1, 1),
        style: RopeStyle::Adjacent,
        eps: 1e-5,
    };
    let mut b = GpuBatch::replayable(ctx.clone()).unwrap();
    let counters = b.decode_layer_counters(1).unwrap();
    let err = b.decode_layers(&l, &counters);
    assert!(matches!(err, Err(GpuError::Shape { .. })), "{err:?}");
}

#[test]
fn batched_decode_layers_equal_each_row_stepped_alone() {
    // Up to eight sequences stepped in one dispatch over one cache per layer, whose rows
    // below a shared prefix every sequence reads and past it each sequence's own region
    // (parallel samples of one prompt), against each sequence stepped alone by the
    // one-row kernel over a cache laid out as that sequence sees it. The products sum each
    // row in the same order as the one-row kernel; attention may split its keys
    // differently (the key runs follow `keys`), so the tolerance is the one-dispatch
    // test's, 1e-4 of the stream's scale.
    at_both_widths(|ctx| {
        batched_rows_against_alone(&ctx, 3);
        batched_rows_against_alone(&ctx, hetsched_gpu::DECODE_LAYER_MAX_ROWS);
    });
}

/// The body of [`batched_decode_layers_equal_each_row_stepped_alone`] for `rows`
/// sequences on `ctx`.
fn batched_rows_against_alone(ctx: &Arc<hetsched_gpu::GpuContext>, rows: usize) {
    let mut rng = SeededRng::new(53 + rows as u64);
    let (heads, kv_heads, d, hidden, ffn, n_layers) = (9, 3, 64, 576, 1536, 2);
    // A prompt of `prefix` positions, then `own` rows of each sequence's own.
    let (prefix, own) = (150, 20);
    let capacity = prefix + rows * own;
    let keys = prefix + own;
    let (qc, kvc) = (heads * d, kv_heads * d);
    let up = |data: &[f32], r: usize, c: usize| ctx.upload_f32(data, r, c).unwrap();
    let layer_weights: Vec<[GpuMatrix; 4]> = (0..n_layers)
        .map(|_| {
            [
                (qc + 2 * kvc, hidden, 0.2),
                (hidden, qc, 0.1),
                (2 * ffn, hidden, 0.2),
                (hidden, ffn, 0.1),
            ]
            .map(|(r, c, scale)| {
                let data: Vec<f32> = rng.f32s(r * c).iter().map(|v| v * scale).collect();
                up(&data, r, c)
            })
        })
        .collect();
    let table: Vec<usize> = (0..keys).collect();
    let angles = ctx.rope_angles(&table, d, 10_000.0).unwrap();
    // The batch's caches, and each sequence's view of them: position j is cache row j
    // below the prefix and row j + r · own from there on.
    let shared: Vec<(Vec<f32>, Vec<f32>)> = (0..n_layers)
        .map(|_| (rng.f32s(capacity * kvc), rng.f32s(capacity * kvc)))
        .collect();
    let row_of = |r: usize, j: usize| if j < prefix { j } else { j + r * own };
    let view = |r: usize, cache: &[f32]| -> Vec<f32> {
        (0..keys)
            .flat_map(|j| cache[row_of(r, j) * kvc..][..kvc].to_vec())
            .collect()
    };
    // A step of `n` rows over `caches` (`cache_rows` rows each): its stream and cache
    // host matrices in, its recording.
    let record = |n: usize, caches: &[(GpuMatrix, GpuMatrix)], k: usize| {
        let x = ctx.alloc_matrix(n, hidden, Elem::F32).unwrap();
        let position = ctx.alloc_matrix(n, 4, Elem::I32).unwrap();
        let (x_in, position_in) = (
            ctx.host_matrix(n, hidden).unwrap(),
            ctx.host_matrix(n, 4).unwrap(),
        );
        let x_out = ctx.host_matrix(n, hidden).unwrap();
        let [q, attn] = [0; 2].map(|_| ctx.alloc_matrix(n, qc, Elem::F32).unwrap());
        let hid = ctx.alloc_matrix(n, ffn, Elem::F32).unwrap();
        let flags = up(&[0.0; 16], 4, 4);
        let mut b = GpuBatch::replayable(ctx.clone()).unwrap();
        b.upload_host(&x_in, &x).unwrap();
        b.upload_host(&position_in, &position).unwrap();
        let counters = b.decode_layer_counters(n_layers).unwrap();
        let layers = layers_over(&layer_weights, caches);
        let l = DecodeLayers {
            layers: &layers,
            x: &x,
            angles: &angles,
            positions: &position,
            keys: k,
            scratch: (&q, &attn, &hid),
            flags: (&flags, 0),
            heads: (heads, kv_heads),
            style: RopeStyle::Adjacent,
            eps: 1e-5,
        };
        b.decode_layers(&l, &counters).unwrap();
        b.download_host(&x, &x_out).unwrap();
        (x_in, position_in, x_out, flags, b.record().unwrap())
    };
    let batch_caches: Vec<(GpuMatrix, GpuMatrix)> = shared
        .iter()
        .map(|(k, v)| (up(k, capacity, kvc), up(v, capacity, kvc)))
        .collect();
    let batch = record(rows, &batch_caches, keys);
    let alone_caches: Vec<Vec<(GpuMatrix, GpuMatrix)>> = (0..rows)
        .map(|r| {
            shared
                .iter()
                .map(|(k, v)| (up(&view(r, k), keys, kvc), up(&view(r, v), keys, kvc)))
                .collect()
        })
        .collect();
    let alone: Vec<_> = alone_caches.iter().map(|c| record(1, c, keys)).collect();
    let read = |m: &hetsched_gpu::HostMatrix| -> Vec<f32> {
        m.read().unwrap().into_iter().map(f32::from_bits).collect()
    };
    // Two steps: each row at its own position past the prefix (different lengths), then
    // each one on (attending over the row the first step wrote).
    let first: Vec<usize> = (0..rows).map(|r| prefix + (r * 7) % (own - 1)).collect();
    for step in 0..2 {
        let x = rng.f32s(rows * hidden);
        let mut positions = Vec::new();
        for (r, &p) in first.iter().enumerate() {
            positions.extend([(p + step) as u32, prefix as u32, (r * own) as u32, 0]);
        }
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        batch.0.write(&bits(&x)).unwrap();
        batch.1.write(&positions).unwrap();
        batch.4.submit().unwrap();
        let flags = ctx.download_f32(&batch.3).unwrap();
        assert!(
            flags.iter().all(|&f| f == 0.0),
            "{rows} rows, step {step}: flags {flags:?} (2.0: the grid barrier gave up)"
        );
        let got = read(&batch.2);
        for (r, one) in alone.iter().enumerate() {
            one.0.write(&bits(&x[r * hidden..][..hidden])).unwrap();
            one.1.write(&[(first[r] + step) as u32, 0, 0, 0]).unwrap();
            one.4.submit().unwrap();
            let want = read(&one.2);
            let scale = vec![want.iter().fold(1f32, |m, v| m.max(v.abs())); hidden];
            let what = format!("{rows} rows, step {step}: row {r}'s stream");
            common::assert_close(&what, &got[r * hidden..][..hidden], &want, &scale, 1e-4);
        }
    }
    // The new rows landed in each sequence's own region (against the alone caches' rows
    // at the same positions), and the shared prefix is untouched.
    for (layer, (kc, _)) in batch_caches.iter().enumerate() {
        let got = ctx.download_f32(kc).unwrap();
        assert_eq!(
            got[..prefix * kvc],
            shared[layer].0[..prefix * kvc],
            "layer {layer}: the shared prefix is only read"
        );
        for (r, caches) in alone_caches.iter().enumerate() {
            let want = ctx.download_f32(&caches[layer].0).unwrap();
            for p in [first[r], first[r] + 1] {
                common::assert_close(
                    &format!("{rows} rows: layer {layer}, row {r}'s key at {p}"),
                    &got[row_of(r, p) * kvc..][..kvc],
                    &want[p * kvc..][..kvc],
                    &vec![1.0; kvc],
                    1e-4,
                );
            }
        }
    }
    for (name, flags) in
        std::iter::once(("batch", &batch.3)).chain(alone.iter().map(|a| ("alone", &a.3)))
    {
        let flags = ctx.download_f32(flags).unwrap();
        assert!(flags.iter().all(|&f| f == 0.0), "{name}: flags {flags:?}");
    }
}

/// The one-dispatch kernel's view of layers: each layer's [Wqkv, Wo, Wgate_up, Wdown]
/// and its (key, value) caches.
fn layers_over<'a>(
    weights: &'a [[GpuMatrix; 4]],
    caches: &'a [(GpuMatrix, GpuMatrix)],
) -> Vec<DecodeLayerWeights<'a>> {
    weights
        .iter()
        .zip(caches)
        .map(|([qkv, o, gate_up, down], (kc, vc))| DecodeLayerWeights {
            qkv,
            o,
            gate_up,
            down,
            caches: (kc, vc),
        })
        .collect()
}

/// Runs `body` on a device context at both widths of the one-dispatch kernel: every layer
/// in one dispatch (the default) with attention and o as one stage (the default where the
/// keys are few, as in every caller here), and one layer a dispatch (a CPU implementation
/// runs one a dispatch either way) with o a stage of its own after attention's key runs
/// are merged (`unfused_output_projection`): each width and each way of o once, not every
/// pair, for the test's time on lavapipe. Skips where the kernel does not run.
fn at_both_widths(body: impl Fn(Arc<hetsched_gpu::GpuContext>)) {
    for (per_dispatch, o_apart) in [(None, false), (Some(1), true)] {
        let options = GpuOptions {
            decode_layers_per_dispatch: per_dispatch,
            unfused_output_projection: o_apart,
            ..GpuOptions::default()
        };
        let Some(ctx) = common::gpu_with(options) else {
            return;
        };
        if ctx.decode_layer_workgroups().is_none() {
            eprintln!("skipped: this device runs no one-dispatch decode layer");
            return;
        }
        body(Arc::new(ctx));
    }
}
