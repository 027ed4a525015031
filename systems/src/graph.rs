//! Graph builder: a decoder layer's operator graph (petgraph) cut into subgraph stages at
//! processor boundaries, each classified static (shared across chunks) or dynamic.
//!
//! The stages of one chunk form a chain: stage `j` reads what stage `j - 1` wrote. A stage
//! holding a cross-chunk operator (attention reads the KV cache of earlier chunks) also
//! waits for stage `j - 1` of every earlier chunk (seed 000, Eq. 2).
//!
//! The one exception is the outlier shadow (seed 000, section 3.3; [`crate::shadow`]): a
//! shadow stage sits right after the INT8 stage it shadows and runs *beside* it (it waits
//! for what that stage waits for), and the stage after the pair waits for both. So a
//! stage's [`StageTemplate::after`] lists one stage, or two after a shadow.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::error::PlanError;
use crate::model::{
    ExecClass, ModelConfig, OpDecl, OpKind, epilogue_ops, layer_carry_ops, llama_layer,
    prologue_ops,
};
use crate::op::{OpRole, Projection};
use crate::shadow::{ShadowSite, site_shape};

/// Whether a subgraph can be shared across chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Depends on the chunk length only: built once, shared by every chunk.
    Static,
    /// Depends on the chunk's position (attention): one per chunk.
    Dynamic,
}

/// What a stage waits for before it may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StageDependency {
    /// The first stage of a chunk: nothing.
    None,
    /// G(i, j) <- G(i, j-1) (seed 000, Eq. 3).
    IntraChunk,
    /// G(i, j) <- G(0, j-1) .. G(i, j-1) (seed 000, Eq. 2).
    CrossChunk,
}

/// One subgraph of the per-chunk chain: the template every chunk's instance is made from.
#[derive(Clone, Debug, PartialEq)]
pub struct StageTemplate {
    /// Readable name, e.g. `L3.qkv_proj` (layer and first operator).
    pub name: String,
    /// Decoder layer, or `None` for the model head.
    pub layer: Option<u32>,
    /// Consecutive decoder layers the stage holds operators of, from `layer`: 1, except
    /// for a decode step's grouped stages ([`crate::decode_plan::group_layers`]).
    pub layer_span: u32,
    /// Operators in execution order.
    pub ops: Vec<OpDecl>,
    /// Processor class of every operator in the stage.
    pub class: ExecClass,
    /// Static (shared) or dynamic (per chunk).
    pub sharing: Sharing,
    /// What the stage waits for: nothing, or the stages in [`StageTemplate::after`] of
    /// the same chunk (`IntraChunk`) or of this and every earlier chunk (`CrossChunk`).
    pub dependency: StageDependency,
    /// The stages (indices, all earlier) this one waits for: `[j - 1]`, except beside and
    /// after an outlier shadow (module doc). Empty for the first stage.
    pub after: Vec<u32>,
    /// Runs for the last chunk only (the LM head needs the last token only).
    pub last_chunk_only: bool,
}

/// Builds the per-chunk stage chain of `model`: the layer graph is validated (unique
/// names, known inputs, no cycle), ordered, and cut wherever the processor class changes.
pub fn build_stages(model: &ModelConfig) -> Result<Vec<StageTemplate>, PlanError> {
    model.validate()?;
    let (layer, carry) = match &model.layer_ops {
        Some(ops) => (ops.clone(), Vec::new()),
        None => (llama_layer(model), layer_carry_ops(model)),
    };
    let layer = ordered_layer(&layer)?;
    let kept = model
        .shadow
        .as_ref()
        .map(|s| s.kept_sites(model.layers))
        .unwrap_or_default();

    let mut stages: Vec<StageTemplate> = Vec::new();
    for l in 0..model.layers {
        let lead = if l == 0 {
            prologue_ops(model)
        } else {
            carry.clone()
        };
        let sites: Vec<ShadowSite> = kept
            .iter()
            .filter(|k| k.layer == l)
            .map(|k| k.site)
            .collect();
        let ops = if sites.is_empty() {
            layer.clone()
        } else {
            shadowed_layer(model, &layer, &sites)
        };
        let window = model.attention_window(l);
        for op in lead.into_iter().chain(ops) {
            push_op(&mut stages, Some(l), windowed(op, window), false);
        }
    }
    let head: Vec<OpDecl> = carry.into_iter().chain(epilogue_ops()).collect();
    let first_head = stages.len();
    for op in head {
        // The head never merges into the last layer's stage: it runs for the last chunk only.
        if stages.len() == first_head {
            stages.push(new_stage(None, op, true));
        } else {
            push_op(&mut stages, None, op, true);
        }
    }
    link_stages(&mut stages);
    Ok(stages)
}

/// `op` with its layer's sliding `window` if it is an attention operator: a local layer's
/// attention stage is priced by the pairs its window lets it score, and is a stage kind
/// of its own ([`crate::stage_kind`]).
fn windowed(mut op: OpDecl, window: Option<u32>) -> OpDecl {
    if op.kind == OpKind::Attention && op.window.is_none() {
        op.window = window;
    }
    op
}

/// Sets every stage's dependency: the previous stage; a shadow stage waits for what the
/// INT8 stage it shadows waits for; the stage after a shadow waits for both.
fn link_stages(stages: &mut [StageTemplate]) {
    for j in 0..stages.len() {
        let (dependency, after) = if j == 0 {
            (StageDependency::None, Vec::new())
        } else if stages[j].is_shadow() {
            (stages[j - 1].dependency, stages[j - 1].after.clone())
        } else {
            let cross = stages[j].ops.iter().any(|op| op.kind.is_cross_chunk());
            let after = if j >= 2 && stages[j - 1].is_shadow() {
                vec![j as u32 - 2, j as u32 - 1]
            } else {
                vec![j as u32 - 1]
            };
            let scope = if cross {
                StageDependency::CrossChunk
            } else {
                StageDependency::IntraChunk
            };
            (scope, after)
        };
        stages[j].dependency = dependency;
        stages[j].after = after;
    }
}

/// One llama layer with the shadows of `sites`: each site's shadow operator follows the
/// last linear reading the site, and the operator consuming those linears' outputs also
/// reads the shadow (the merge, Eq. 1). SiLU-mul moves to float work when the gate/up or
/// down site is shadowed: gate/up's shadow must be merged before it, and down's shadow
/// reads its float output.
fn shadowed_layer(model: &ModelConfig, layer: &[OpDecl], sites: &[ShadowSite]) -> Vec<OpDecl> {
    let ffn_shadowed = sites
        .iter()
        .any(|s| matches!(s, ShadowSite::GateUp | ShadowSite::Down));
    let mut ops: Vec<OpDecl> = Vec::with_capacity(layer.len() + sites.len());
    for op in layer {
        let mut op = op.clone();
        if op.kind == OpKind::SiluMul && ffn_shadowed {
            op.class = Some(ExecClass::Float);
        }
        // Down's output is merged by the next layer's carry (see `chain_inputs` in
        // memory::tensors), which is not in `layer`.
        if let Some(site) = op.role.and_then(OpRole::merges_site)
            && sites.contains(&site)
        {
            op.inputs.push(site.op_name());
        }
        let last_linear_of = |site: ShadowSite| {
            let last = Projection::of_site(site).last().copied();
            op.role == last.map(OpRole::Linear)
        };
        let shadows: Vec<ShadowSite> = sites
            .iter()
            .copied()
            .filter(|&s| last_linear_of(s))
            .collect();
        ops.push(op);
        for site in shadows {
            let input = layer
                .iter()
                .find(|w| w.role.and_then(OpRole::writes_site) == Some(site))
                .map(|w| w.name.clone());
            ops.push(shadow_op(model, site, input));
        }
    }
    ops
}

/// The shadow operator of `site`, reading `input` (the operator writing the site's
/// activation): in-features of its linears, their out-features summed.
fn shadow_op(model: &ModelConfig, site: ShadowSite, input: Option<String>) -> OpDecl {
    let (k, n) = site_shape(model, site);
    let count = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    OpDecl {
        in_features: Some(count(k)),
        out_features: Some(count(n)),
        class: Some(ExecClass::Float),
        inputs: input.into_iter().collect(),
        ..OpDecl::of_role(&site.op_name(), OpRole::Shadow(site), &[])
    }
}

/// Merges the stages of one processor: within a decoder layer (or the head), stage `j` joins
/// stage `j - 1` unless it holds a cross-chunk operator, whose wait for earlier chunks must
/// stay a subgraph boundary (seed 000, Eq. 2). For a device whose one processor runs every
/// class (the all-GPU executor): cutting at class changes would only add jobs there (a
/// llama layer becomes 2 subgraphs instead of 6). A merged stage keeps its first
/// operator's class.
pub fn merge_for_one_processor(stages: Vec<StageTemplate>) -> Vec<StageTemplate> {
    merge_stages(stages, false)
}

/// [`merge_for_one_processor`] for a plan of a single chunk (a decode step, a short
/// prompt): there are no earlier chunks to wait for, so a cross-chunk stage joins the one
/// before it too and each decoder layer is one subgraph.
pub fn merge_for_one_chunk_one_processor(stages: Vec<StageTemplate>) -> Vec<StageTemplate> {
    merge_stages(stages, true)
}

fn merge_stages(stages: Vec<StageTemplate>, across_chunks: bool) -> Vec<StageTemplate> {
    let mut merged: Vec<StageTemplate> = Vec::with_capacity(stages.len());
    for stage in stages {
        match merged.last_mut() {
            Some(prev)
                if prev.layer == stage.layer
                    && prev.last_chunk_only == stage.last_chunk_only
                    && (across_chunks || stage.dependency != StageDependency::CrossChunk) =>
            {
                if stage.sharing == Sharing::Dynamic {
                    prev.sharing = Sharing::Dynamic;
                }
                prev.ops.extend(stage.ops);
            }
            _ => merged.push(stage),
        }
    }
    // A shadow never stays a stage of its own here (it is never cross-chunk), so every
    // merged stage waits for the one before it.
    for (j, stage) in merged.iter_mut().enumerate() {
        stage.after = j.checked_sub(1).map(|p| p as u32).into_iter().collect();
    }
    merged
}

fn new_stage(layer: Option<u32>, op: OpDecl, last_chunk_only: bool) -> StageTemplate {
    StageTemplate {
        name: String::new(),
        layer,
        layer_span: 1,
        class: op.class(),
        sharing: Sharing::Static,
        dependency: StageDependency::None,
        after: Vec::new(),
        last_chunk_only,
        ops: vec![op],
    }
    .named()
}

impl StageTemplate {
    /// The stage named after its layer and first operator (`L3.qkv_proj`).
    pub(crate) fn named(mut self) -> Self {
        let first = &self.ops[0].name;
        self.name = match self.layer {
            Some(l) => format!("L{l}.{first}"),
            None => format!("head.{first}"),
        };
        self
    }

    /// Whether this stage is an outlier shadow (it runs beside the stage before it). A
    /// stage that merely holds a shadow operator among others (a one-processor device's
    /// merged stage) is not.
    pub fn is_shadow(&self) -> bool {
        self.ops.iter().all(|op| op.kind == OpKind::Shadow)
    }

    /// Operator names, in order.
    pub fn op_names(&self) -> Vec<&str> {
        self.ops.iter().map(|op| op.name.as_str()).collect()
    }
}

fn push_op(stages: &mut Vec<StageTemplate>, layer: Option<u32>, op: OpDecl, last_only: bool) {
    // A shadow is a stage of its own: it runs beside the INT8 stage before it, and the
    // stage after waits for both.
    let shadow = op.kind == OpKind::Shadow;
    match stages.last_mut() {
        Some(stage) if stage.class == op.class() && !shadow && !stage.is_shadow() => {
            if op.kind.is_dynamic() {
                stage.sharing = Sharing::Dynamic;
            }
            stage.ops.push(op);
        }
        _ => {
            let mut stage = new_stage(layer, op, last_only);
            if stage.ops[0].kind.is_dynamic() {
                stage.sharing = Sharing::Dynamic;
            }
            stages.push(stage);
        }
    }
}

/// Validates the layer graph with petgraph and returns its operators in a stable
/// topological order (declaration order wherever the dependencies allow it).
pub fn ordered_layer(ops: &[OpDecl]) -> Result<Vec<OpDecl>, PlanError> {
    if ops.is_empty() {
        return Err(PlanError::InvalidModel(
            "the layer graph has no operators".into(),
        ));
    }
    let mut graph: DiGraph<usize, ()> = DiGraph::new();
    let mut by_name: HashMap<&str, NodeIndex> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        let node = graph.add_node(i);
        if by_name.insert(op.name.as_str(), node).is_some() {
            return Err(PlanError::DuplicateOp(op.name.clone()));
        }
    }
    for (i, op) in ops.iter().enumerate() {
        for input in &op.inputs {
            let Some(&from) = by_name.get(input.as_str()) else {
                return Err(PlanError::UnknownInput {
                    op: op.name.clone(),
                    input: input.clone(),
                });
            };
            graph.add_edge(from, NodeIndex::new(i), ());
        }
    }
    if let Err(cycle) = toposort(&graph, None) {
        return Err(PlanError::Cycle(ops[graph[cycle.node_id()]].name.clone()));
    }
    // Kahn's algorithm, smallest declaration index first, for a deterministic order.
    let mut indegree: Vec<usize> = graph
        .node_indices()
        .map(|n| graph.neighbors_directed(n, petgraph::Incoming).count())
        .collect();
    let mut ready: BinaryHeap<Reverse<usize>> = (0..ops.len())
        .filter(|&i| indegree[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(ops.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(ops[i].clone());
        for next in graph.neighbors_directed(NodeIndex::new(i), petgraph::Outgoing) {
            indegree[next.index()] -= 1;
            if indegree[next.index()] == 0 {
                ready.push(Reverse(next.index()));
            }
        }
    }
    Ok(order)
}

/// Joins each run of `per_stage` consecutive decoder-layer stages of `stages` (a plan of
/// one chunk on one processor: one stage per layer, then the head) into one stage; the
/// last group holds what is left. The head and any stage not of one whole layer stay as
/// they are; `per_stage` 1 returns `stages` unchanged.
///
/// # Errors
/// [`PlanError::InvalidWorkload`] for `per_stage` 0, or for stages that are not one per
/// layer (a layer cut into several stages cannot be grouped without reordering them).
pub fn group_layers(
    stages: Vec<StageTemplate>,
    per_stage: u32,
) -> Result<Vec<StageTemplate>, PlanError> {
    if per_stage == 0 {
        return Err(PlanError::InvalidWorkload(
            "0 decoder layers per decode stage; give at least 1".into(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(cut) = stages
        .iter()
        .find_map(|s| s.layer.filter(|&l| !seen.insert(l)))
    {
        return Err(PlanError::InvalidWorkload(format!(
            "layer {cut} is cut into several stages: only a plan of one stage per layer (one \
             chunk on one processor) can group layers"
        )));
    }
    if per_stage == 1 {
        return Ok(stages);
    }
    let mut grouped: Vec<StageTemplate> = Vec::with_capacity(stages.len());
    for stage in stages {
        match grouped.last_mut() {
            Some(prev) if joins(prev, &stage, per_stage) => {
                if stage.sharing == Sharing::Dynamic {
                    prev.sharing = Sharing::Dynamic;
                }
                prev.layer_span += stage.layer_span;
                prev.ops.extend(stage.ops);
            }
            _ => grouped.push(stage),
        }
    }
    for (j, stage) in grouped.iter_mut().enumerate() {
        stage.after = j.checked_sub(1).map(|p| p as u32).into_iter().collect();
        stage.dependency = match j {
            0 => StageDependency::None,
            _ => StageDependency::IntraChunk,
        };
        if let (Some(first), true) = (stage.layer, stage.layer_span > 1) {
            let last = first + stage.layer_span - 1;
            stage.name = format!("L{first}-{last}.{}", stage.ops[0].name);
        }
    }
    Ok(grouped)
}

/// Whether layer stage `next` joins the group `prev` (of fewer than `per_stage` layers).
fn joins(prev: &StageTemplate, next: &StageTemplate, per_stage: u32) -> bool {
    match (prev.layer, next.layer) {
        (Some(a), Some(b)) => b == a + prev.layer_span && prev.layer_span < per_stage,
        _ => false,
    }
}
