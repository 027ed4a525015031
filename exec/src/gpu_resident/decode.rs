//! A decode step recorded once and replayed: the host writes the token and its position
//! into two host matrices, submits the recording, and reads back the token the device
//! chose (greedy), and the logits only when asked.
//!
//! The step is two recordings, the two stages of the step's plan
//! ([`hetsched_systems::PrefillPlan::decode_step`] with every decoder layer in one
//! stage): the layers (the token's embedding gathered on the device, then per layer the
//! few-row q/k/v GEMM writing the cache row the position names, attention over the keys
//! up to it, o, gate/up and down: one dispatch a llama layer where the device runs
//! [`GpuBatch::decode_layers`], five otherwise), submitted without waiting; and the head
//! (the few-row head GEMM, greedy sampling, the copies of the chosen token and the
//! non-finite flags to the host), submitted and waited for. Every value that changes
//! from step to step is read by the kernels from device buffers that the recordings fill
//! from the host matrices, so a recording holds for every position its caches have rows
//! for: it is made once per cache capacity (the session's context bucket: the caches
//! double when they fill) and dropped when the caches move.
//!
//! A step may feed several sequences at once (up to the rows the decoder was made for,
//! at most [`hetsched_gpu::DECODE_LAYER_MAX_ROWS`]; parallel samples of one prompt): one
//! token each, the layers as the one-dispatch kernel over all rows (each weight read once
//! for all of them), the head a GEMM of a few rows, greedy sampling per row. The
//! sequences share the layers' caches, each position mapped to a cache row by its
//! [`StepRow::shift`], so samples read their prompt's rows where the prefill wrote them.
//! A recording holds for one (cache capacity, rows, key bound); a batch whose live rows
//! change records again.

use std::sync::Arc;

use hetsched_gpu::{
    AttentionShape, DECODE_LAYER_GAVE_UP, DecodeLayerCounters, DecodeLayerWeights, DecodeLayers,
    Elem, FusedGemm, GemmEpilogue, GpuBatch, GpuContext, GpuMatrix, HostMatrix, QkvRows,
    RecordedBatch,
};
use hetsched_import::{Activation, EmbeddingScale};
use hetsched_systems::plan::InstanceKey;
use hetsched_systems::resources::Job;

use super::family::{
    FamilyScratch, QkvIo, gate_up_epilogue, local_angles, record_post_norm, record_projection,
    record_qkv, window,
};
use super::tensors::NonFiniteFlags;
use super::{GpuModel, gpu_err};
use crate::error::ExecError;
use crate::queues::{JobError, JobRunner};

/// One sequence's part of a decode step: its token, the token's position, and where the
/// sequence's positions live in the layers' caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRow {
    /// The token fed.
    pub token: u32,
    /// Its position.
    pub position: usize,
    /// `(from, by)`: positions from `from` on live `by` cache rows further on (a
    /// sequence's own region after a prefix it shares with others); below `from` a
    /// position is its own row. `(0, 0)`: every position its own row.
    pub shift: (usize, usize),
}

impl StepRow {
    /// The token of a sequence whose every position is its own cache row.
    pub fn alone(token: u32, position: usize) -> Self {
        Self {
            token,
            position,
            shift: (0, 0),
        }
    }

    /// The cache row of position `j` of this row's sequence.
    fn cache_row(&self, j: usize) -> usize {
        match j >= self.shift.0 {
            true => j + self.shift.1,
            false => j,
        }
    }
}

/// The device buffers of a step of up to `rows` sequences and the host matrices around
/// them (a step of fewer rows records over their first rows).
struct StepTensors {
    rows: usize,
    /// Token ids in (`[1, rows]`), and per row (position, shift from, shift by, 0)
    /// (`[rows, 4]`): host side, written before each replay.
    token_in: HostMatrix,
    position_in: HostMatrix,
    /// The ids' device copy, `[⌈rows / 4⌉, 4]` u32.
    token: GpuMatrix,
    /// The matrices of a row per sequence, the positions' device copy among them.
    per_row: RowViews,
    /// The chosen tokens on the device and on the host.
    next: GpuMatrix,
    next_out: HostMatrix,
    /// Non-finite flags of the step's residual adds, and their host copy.
    flags: GpuMatrix,
    flags_out: HostMatrix,
    /// The buffers of the family's steps (none for llama).
    family: FamilyScratch,
}

/// The matrices of a step with a row per sequence (of [`StepTensors`], or a view of their
/// first rows).
struct RowViews {
    position: GpuMatrix,
    x: GpuMatrix,
    q: GpuMatrix,
    attn: GpuMatrix,
    hidden: GpuMatrix,
    logits: GpuMatrix,
}

impl StepTensors {
    fn views(&self, rows: usize) -> Result<RowViews, ExecError> {
        let first = |m: &GpuMatrix| m.first_rows(rows).map_err(gpu_err);
        let all = &self.per_row;
        Ok(RowViews {
            position: first(&all.position)?,
            x: first(&all.x)?,
            q: first(&all.q)?,
            attn: first(&all.attn)?,
            hidden: first(&all.hidden)?,
            logits: first(&all.logits)?,
        })
    }
}

/// The recordings of one (cache capacity, rows, key bound).
struct Recorded {
    capacity: usize,
    rows: usize,
    keys: usize,
    views: RowViews,
    layers: RecordedBatch,
    head: RecordedBatch,
    /// The head that also copies the logits out, and their host copy, recorded on
    /// first use.
    head_logits: Option<(RecordedBatch, HostMatrix)>,
}

/// What one step produced.
#[derive(Debug)]
pub struct DecodeOutput {
    /// Per row, the greedy next token (the largest logit, the lower id on a tie).
    pub next: Vec<u32>,
    /// The logits, `[rows, vocab]` row after row, when asked for.
    pub logits: Option<Vec<f32>>,
}

/// Replays decode steps of one session on the device; see the module note.
pub struct GpuDecode {
    model: Arc<GpuModel>,
    /// The token embeddings, `[vocab, hidden]` f32.
    embeddings: GpuMatrix,
    t: StepTensors,
    recorded: Option<Recorded>,
    /// What the step's stages ran: set by [`JobRunner::run`] of the head.
    out: parking_lot::Mutex<Option<Result<DecodeOutput, ExecError>>>,
    /// Whether this step's head reads the logits.
    want_logits: bool,
}

impl std::fmt::Debug for GpuDecode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecode")
            .field("capacity", &self.recorded.as_ref().map(|r| r.capacity))
            .finish()
    }
}

fn alloc(ctx: &GpuContext, rows: usize, cols: usize, elem: Elem) -> Result<GpuMatrix, ExecError> {
    ctx.alloc_matrix(rows, cols, elem).map_err(gpu_err)
}

impl GpuDecode {
    /// Uploads the token embeddings and allocates the buffers of one sequence's steps.
    pub fn new(model: Arc<GpuModel>) -> Result<Self, ExecError> {
        let c = &model.host.config;
        // The family's scale on the table itself: the rows the step gathers are scaled.
        let mut table = std::borrow::Cow::from(&model.host.token_embd);
        if c.family.embedding_scale != EmbeddingScale::One {
            crate::family::scale_embeddings(c, table.to_mut());
        }
        let embeddings = model
            .context
            .upload_f32(&table, c.vocab_size, c.hidden)
            .map_err(gpu_err)?;
        drop(table);
        Self::over(model, embeddings, 1)
    }

    /// A decoder of steps of up to `rows` sequences of the same model, sharing this one's
    /// embedding table ([`Self::batched_rows`] says how many it may take).
    pub fn with_rows(&self, rows: usize) -> Result<Self, ExecError> {
        Self::over(self.model.clone(), self.embeddings.clone(), rows)
    }

    /// The most sequences one step takes on this device and model: one, or up to
    /// [`hetsched_gpu::DECODE_LAYER_MAX_ROWS`] where the layers run as the one-dispatch
    /// kernel and the device runs its several-row variants.
    pub fn batched_rows(&self) -> usize {
        Self::batched_rows_of(&self.model)
    }

    /// [`Self::batched_rows`] of a decoder of `model`, without one.
    pub fn batched_rows_of(model: &GpuModel) -> usize {
        match layers_in_one_dispatch(model) {
            true => model.context.decode_layer_max_rows().max(1),
            false => 1,
        }
    }

    fn over(model: Arc<GpuModel>, embeddings: GpuMatrix, rows: usize) -> Result<Self, ExecError> {
        let ctx = &model.context;
        let c = &model.host.config;
        let flag_rows = NonFiniteFlags::rows(1, model.layers.len());
        let host = |rows, cols| ctx.host_matrix(rows, cols).map_err(gpu_err);
        let t = StepTensors {
            rows,
            token_in: host(1, rows)?,
            position_in: host(rows, 4)?,
            token: alloc(ctx, rows.div_ceil(4), 4, Elem::I32)?,
            per_row: RowViews {
                position: alloc(ctx, rows, 4, Elem::I32)?,
                x: alloc(ctx, rows, c.hidden, Elem::F32)?,
                q: alloc(ctx, rows, c.n_heads * c.head_dim, Elem::F32)?,
                attn: alloc(ctx, rows, c.n_heads * c.head_dim, Elem::F32)?,
                hidden: alloc(ctx, rows, c.ffn, Elem::F32)?,
                logits: alloc(ctx, rows, c.vocab_size, Elem::F32)?,
            },
            next: alloc(ctx, rows.div_ceil(4), 4, Elem::I32)?,
            next_out: host(1, rows)?,
            flags: ctx
                .upload_f32(
                    &vec![0.0; flag_rows * NonFiniteFlags::COLS],
                    flag_rows,
                    NonFiniteFlags::COLS,
                )
                .map_err(gpu_err)?,
            flags_out: host(flag_rows, NonFiniteFlags::COLS)?,
            family: FamilyScratch::alloc(ctx, c, rows)?,
        };
        Ok(Self {
            model,
            embeddings,
            t,
            recorded: None,
            out: parking_lot::Mutex::new(None),
            want_logits: true,
        })
    }

    /// Forgets the recordings (the caches they write moved); the next step records anew.
    pub fn invalidate(&mut self) {
        self.recorded = None;
    }

    /// Dispatches one step replays (layers and head), once recorded.
    pub fn dispatches(&self) -> Option<usize> {
        let r = self.recorded.as_ref()?;
        Some(r.layers.dispatches() + r.head.dispatches())
    }

    /// Prepares the step of `rows` (one token of each sequence) over `caches` (one key
    /// and value cache per layer, with a row for each token's position) with every
    /// position below `keys` (at most the caches' rows): records for this (capacity,
    /// rows, keys) if not yet done, and writes the tokens and positions for the replay.
    /// Run the step's stages next ([`JobRunner::run`]), then [`Self::finish`]; or
    /// [`Self::run_now`].
    pub fn prepare(
        &mut self,
        caches: &[(GpuMatrix, GpuMatrix)],
        (rows, keys): (&[StepRow], usize),
        want_logits: bool,
    ) -> Result<(), ExecError> {
        let c = &self.model.host.config;
        let capacity = caches.first().map_or(0, |(k, _)| k.rows());
        if rows.is_empty() || rows.len() > self.t.rows {
            return Err(ExecError::Kernel(format!(
                "a decode step of {} sequences on a decoder of at most {}",
                rows.len(),
                self.t.rows
            )));
        }
        if let Some(r) = rows.iter().find(|r| r.token as usize >= c.vocab_size) {
            return Err(ExecError::TokenOutOfRange {
                id: r.token,
                vocab: c.vocab_size,
            });
        }
        let outside = |r: &&StepRow| r.position >= keys || r.cache_row(r.position) >= capacity;
        if caches.len() != self.model.layers.len()
            || keys > capacity
            || rows.iter().any(|r| outside(&r))
        {
            let row = rows.iter().find(outside).unwrap_or(&rows[0]);
            return Err(ExecError::Kernel(format!(
                "a decode step at position {} (cache row {}, positions below {keys}) needs {} \
                 layer caches with a row for it ({} of {capacity} rows given)",
                row.position,
                row.cache_row(row.position),
                self.model.layers.len(),
                caches.len()
            )));
        }
        // The five dispatches a layer read and write each position at its own row.
        let shifted = |r: &StepRow| r.shift.1 != 0 && r.shift.0 <= r.position;
        if rows.iter().any(shifted) && !layers_in_one_dispatch(&self.model) {
            return Err(ExecError::Kernel(
                "a decode step whose positions are shifted into their own cache region needs \
                 the one-dispatch llama layers (f32 weights, a GPU that keeps the kernel's grid \
                 resident); the five dispatches a layer keep every position at its own row"
                    .into(),
            ));
        }
        let key = (capacity, rows.len(), keys);
        if self.recorded.as_ref().map(|r| (r.capacity, r.rows, r.keys)) != Some(key) {
            self.recorded = None; // its views and recordings go before the new ones
            self.recorded = Some(self.record(caches, key)?);
        }
        if want_logits {
            let r = self.recorded.as_mut().ok_or_else(not_recorded)?;
            if r.head_logits.is_none() {
                let logits = &r.views.logits;
                let out = (self.model.context)
                    .host_matrix(logits.rows(), logits.cols())
                    .map_err(gpu_err)?;
                let head = record_head(&self.model, &self.t, &r.views, Some(&out))?;
                r.head_logits = Some((head, out));
            }
        }
        self.want_logits = want_logits;
        let mut tokens = vec![0u32; self.t.rows];
        let mut positions = vec![0u32; 4 * self.t.rows];
        for (i, r) in rows.iter().enumerate() {
            tokens[i] = r.token;
            positions[4 * i..4 * i + 3].copy_from_slice(&[
                r.position as u32,
                r.shift.0 as u32,
                r.shift.1 as u32,
            ]);
        }
        self.t.token_in.write(&tokens).map_err(gpu_err)?;
        self.t.position_in.write(&positions).map_err(gpu_err)?;
        *self.out.lock() = None;
        Ok(())
    }

    /// Runs the prepared step here (the layers, then the head), outside any plan.
    pub fn run_now(&self) -> Result<DecodeOutput, ExecError> {
        self.run_layers()?;
        self.run_head()
    }

    /// What the step's head produced, after the step's stages ran.
    pub fn finish(&self) -> Result<DecodeOutput, ExecError> {
        self.out.lock().take().unwrap_or_else(|| {
            Err(ExecError::MissingValue {
                op: "decode step".into(),
                chunk: 0,
                value: "next token",
            })
        })
    }

    fn record(
        &self,
        caches: &[(GpuMatrix, GpuMatrix)],
        (capacity, rows, keys): (usize, usize, usize),
    ) -> Result<Recorded, ExecError> {
        let m = &self.model;
        let c = &m.host.config;
        let t = &self.t;
        let ctx = &m.context;
        let at_once = layers_in_one_dispatch(m);
        if rows > 1 && !at_once {
            return Err(ExecError::Kernel(
                "a decode step of several sequences needs the one-dispatch llama layers (f32 \
                 weights, a GPU that keeps the kernel's grid resident)"
                    .into(),
            ));
        }
        let views = t.views(rows)?;
        let positions: Vec<usize> = (0..capacity).collect();
        let angles = ctx
            .rope_angles(&positions, c.head_dim, c.rope_base)
            .map_err(gpu_err)?;
        let local = local_angles(ctx, c, &positions)?;
        let mut b = GpuBatch::replayable(ctx.clone()).map_err(gpu_err)?;
        b.upload_host(&t.token_in, &t.token).map_err(gpu_err)?;
        b.upload_host(&t.position_in, &t.per_row.position)
            .map_err(gpu_err)?;
        let counters = match at_once {
            true => Some(b.decode_layer_counters(caches.len()).map_err(gpu_err)?),
            false => None,
        };
        b.embed_rows(&self.embeddings, &t.token, &views.x)
            .map_err(gpu_err)?;
        match &counters {
            Some(counters) => {
                self.record_layers_at_once(&mut b, caches, (&angles, keys), &views, counters)?
            }
            None => {
                for (layer, caches) in caches.iter().enumerate() {
                    let angles = match &local {
                        Some(local) if c.family.is_local(layer) => local,
                        _ => &angles,
                    };
                    self.record_layer(&mut b, layer, (caches, capacity), (angles, &views))?;
                }
            }
        }
        Ok(Recorded {
            capacity,
            rows,
            keys,
            layers: b.record().map_err(gpu_err)?,
            head: record_head(m, t, &views, None)?,
            head_logits: None,
            views,
        })
    }

    /// Records the step's llama layers in one dispatch ([`GpuBatch::decode_layers`]) over
    /// the rows of `views`, every position below `keys`.
    fn record_layers_at_once(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        caches: &[(GpuMatrix, GpuMatrix)],
        (angles, keys): (&GpuMatrix, usize),
        views: &RowViews,
        counters: &DecodeLayerCounters,
    ) -> Result<(), ExecError> {
        let m = &self.model;
        let (c, t) = (&m.host.config, &self.t);
        let layers: Vec<DecodeLayerWeights<'_>> = m
            .layers
            .iter()
            .zip(caches)
            .map(|(w, (kc, vc))| DecodeLayerWeights {
                qkv: &w.qkv,
                o: &w.o,
                gate_up: &w.gate_up,
                down: &w.down,
                caches: (kc, vc),
            })
            .collect();
        let flags = NonFiniteFlags {
            layers: m.layers.len(),
        };
        let l = DecodeLayers {
            layers: &layers,
            x: &views.x,
            angles,
            positions: &views.position,
            keys,
            scratch: (&views.q, &views.attn, &views.hidden),
            flags: (&t.flags, flags.slot(0, 0, 0)),
            heads: (c.n_heads, c.n_kv_heads),
            style: c.rope_style,
            eps: c.norm_eps,
        };
        b.decode_layers(&l, counters).map_err(gpu_err)
    }

    /// Records decoder layer `layer` of the step (its one row in `v`) over its caches
    /// (`capacity` rows) with its RoPE table of every position, as five dispatches (or
    /// more, for the families' steps).
    fn record_layer(
        &self,
        b: &mut GpuBatch<Arc<GpuContext>>,
        layer: usize,
        ((kc, vc), capacity): (&(GpuMatrix, GpuMatrix), usize),
        (angles, v): (&GpuMatrix, &RowViews),
    ) -> Result<(), ExecError> {
        let m = &self.model;
        let (c, t, w) = (&m.host.config, &self.t, &m.layers[layer]);
        let flags = NonFiniteFlags {
            layers: m.layers.len(),
        };
        let shape = AttentionShape {
            n_tokens: 1,
            pos0: 0,
            kv_len: capacity,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let io = QkvIo {
            x: &v.x,
            q: &v.q,
            scratch: &t.family,
            angles,
            caches: (kc, vc),
            rows: QkvRows::At(&v.position),
        };
        record_qkv(b, c, (&w.qkv, &w.family), io)?;
        let at = (&v.position, window(c, layer));
        b.attention_at_windowed(&v.q, (kc, vc), &shape, at, &v.attn)
            .map_err(gpu_err)?;
        let stream = (&v.x, &t.family);
        let post = w.family.post_norms.as_ref();
        for (block, input, weights) in [(0, &v.attn, &w.o), (1, &v.hidden, &w.down)] {
            if block == 1 {
                let gate_up = FusedGemm {
                    norm_eps: Some(c.norm_eps),
                    epilogue: gate_up_epilogue(c.family.activation),
                };
                b.gemm_fused(&v.x, &w.gate_up, &v.hidden, gate_up)
                    .map_err(gpu_err)?;
            }
            let check = (&t.flags, flags.slot(0, layer, block));
            record_projection(b, (input, weights), post.is_some(), stream, check)?;
            if let Some(post) = post {
                record_post_norm(b, (&post[block], c.norm_eps), stream, check)?;
            }
        }
        Ok(())
    }

    /// Runs the decoder layers' recording, without waiting.
    fn run_layers(&self) -> Result<(), ExecError> {
        let r = self.recorded.as_ref().ok_or_else(not_recorded)?;
        r.layers.submit_async().map_err(gpu_err)
    }

    /// Runs the head's recording, waits, and reads the tokens (and the logits).
    fn run_head(&self) -> Result<DecodeOutput, ExecError> {
        let r = self.recorded.as_ref().ok_or_else(not_recorded)?;
        let (head, logits_out) = match (self.want_logits, &r.head_logits) {
            (true, Some((h, out))) => (h, Some(out)),
            (true, None) => return Err(not_recorded()),
            (false, _) => (&r.head, None),
        };
        head.submit().map_err(gpu_err)?;
        let flags = self.t.flags_out.read().map_err(gpu_err)?;
        let flags: Vec<f32> = flags.into_iter().map(f32::from_bits).collect();
        let layers = self.model.layers.len();
        let located = NonFiniteFlags { layers };
        if let Some(slot) = flags.iter().position(|&f| f == DECODE_LAYER_GAVE_UP) {
            // A step of one row has the five dispatches to fall back on; several rows
            // only a smaller grid.
            let instead = match r.rows {
                1 => "HETSCHED_GPU_FIVE_DISPATCH_DECODE=1 records five dispatches a layer instead",
                _ => "HETSCHED_GPU_DECODE_GROUPS_PER_SM=1 runs a smaller grid",
            };
            return Err(ExecError::Kernel(format!(
                "decode layer {}: the device did not run the layer kernel's workgroups all \
                 at once, so its grid barrier gave up ({instead})",
                located.locate(slot).1
            )));
        }
        if let Some((_, layer, block)) = located.first_raised(&flags) {
            return Err(ExecError::NonFiniteOnDevice {
                layer,
                block,
                chunk: 0,
            });
        }
        let mut next = self.t.next_out.read().map_err(gpu_err)?;
        next.truncate(r.rows);
        let logits = match logits_out {
            Some(out) => Some(
                out.read()
                    .map_err(gpu_err)?
                    .into_iter()
                    .map(f32::from_bits)
                    .collect(),
            ),
            None => None,
        };
        let vocab = self.model.host.config.vocab_size;
        if next.iter().any(|&n| n as usize >= vocab) {
            return Err(ExecError::Kernel(
                "the decode step's logits hold no number (greedy sampling found none)".into(),
            ));
        }
        Ok(DecodeOutput { next, logits })
    }
}

/// Whether `m`'s decode layers record as the one-dispatch kernel
/// ([`GpuBatch::decode_layers`]): the device runs that kernel, and every layer is a llama
/// layer (SiLU gate, no window, no QKV bias, QK-norm or post-norms) with f32 or f16
/// weights.
fn layers_in_one_dispatch(m: &GpuModel) -> bool {
    let c = &m.host.config;
    m.context.decode_layer_workgroups().is_some()
        && c.family.activation == Activation::SiluGlu
        && m.layers.iter().enumerate().all(|(layer, w)| {
            window(c, layer) == 0
                && !c.family.is_local(layer)
                && !w.family.finishes_qkv()
                && w.family.post_norms.is_none()
                && [&w.o, &w.gate_up, &w.down]
                    .iter()
                    .all(|m| m.elem() == w.qkv.elem())
                && matches!(w.qkv.elem(), Elem::F32 | Elem::F16)
        })
}

/// The head's recording over the rows of `v`: the final norm and the head GEMM, greedy
/// sampling, and the copies of the chosen tokens and the flags (and the logits, into
/// `logits_out` when given) to the host.
fn record_head(
    m: &GpuModel,
    t: &StepTensors,
    v: &RowViews,
    logits_out: Option<&HostMatrix>,
) -> Result<RecordedBatch, ExecError> {
    let mut b = GpuBatch::replayable(m.context.clone()).map_err(gpu_err)?;
    let head = FusedGemm {
        norm_eps: Some(m.host.config.norm_eps),
        epilogue: GemmEpilogue::Store,
    };
    b.gemm_fused(&v.x, &m.output, &v.logits, head)
        .map_err(gpu_err)?;
    b.argmax_rows(&v.logits, &t.next).map_err(gpu_err)?;
    b.download_host(&t.next, &t.next_out).map_err(gpu_err)?;
    b.download_host(&t.flags, &t.flags_out).map_err(gpu_err)?;
    if let Some(out) = logits_out {
        b.download_host(&v.logits, out).map_err(gpu_err)?;
    }
    b.record().map_err(gpu_err)
}

fn not_recorded() -> ExecError {
    ExecError::Kernel("the decode step ran before it was prepared".into())
}

/// The step's stages: a stage of decoder layers replays the layers' recording, the head
/// the head's (and keeps what it produced for [`GpuDecode::finish`]). The step's plan must
/// hold every layer in one stage (the recording is one piece).
pub struct DecodeStages {
    /// The step.
    pub decode: Arc<GpuDecode>,
    /// Per stage of the plan, its first layer (`None`: the head).
    pub stage_layers: Vec<Option<u32>>,
}

impl JobRunner for DecodeStages {
    fn run(&self, job: &Job) -> Result<(), JobError> {
        let InstanceKey { stage, .. } = job.key;
        let layer = self
            .stage_layers
            .get(stage as usize)
            .ok_or_else(|| format!("no stage {stage} in this decode step's plan"))?;
        match layer {
            Some(0) => Ok(self.decode.run_layers()?),
            Some(first) => Err(format!(
                "the recorded decode step runs every layer in one stage, and stage {stage} \
                 starts at layer {first}"
            )
            .into()),
            None => {
                let out = self.decode.run_head();
                let failed = out.as_ref().err().map(ToString::to_string);
                *self.decode.out.lock() = Some(out);
                match failed {
                    Some(e) => Err(e.into()),
                    None => Ok(()),
                }
            }
        }
    }

    fn uses_pool(&self) -> bool {
        false
    }
}
