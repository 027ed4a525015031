//! Graph builder: a decoder layer's operator graph (petgraph) cut into subgraph stages at
//! processor boundaries, each classified static (shared across chunks) or dynamic.
//!
//! The stages of one chunk form a chain: stage `j` reads what stage `j - 1` wrote. A stage
//! holding a cross-chunk operator (attention reads the KV cache of earlier chunks) also
//! waits for stage `j - 1` of every earlier chunk (seed 000, Eq. 2).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::error::PlanError;
use crate::model::{
    ExecClass, ModelConfig, OpDecl, epilogue_ops, layer_carry_ops, llama_layer, prologue_ops,
};

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
    /// Operators in execution order.
    pub ops: Vec<OpDecl>,
    /// Processor class of every operator in the stage.
    pub class: ExecClass,
    /// Static (shared) or dynamic (per chunk).
    pub sharing: Sharing,
    /// What the stage waits for.
    pub dependency: StageDependency,
    /// Runs for the last chunk only (the LM head needs the last token only).
    pub last_chunk_only: bool,
}

/// Builds the per-chunk stage chain of `model`: the layer graph is validated (unique
/// names, known inputs, no cycle), ordered, and cut wherever the processor class changes.
pub fn build_stages(model: &ModelConfig) -> Result<Vec<StageTemplate>, PlanError> {
    model.validate()?;
    let (layer, carry) = match &model.layer_ops {
        Some(ops) => (ops.clone(), Vec::new()),
        None => (llama_layer(model), layer_carry_ops()),
    };
    let layer = ordered_layer(&layer)?;

    let mut stages: Vec<StageTemplate> = Vec::new();
    for l in 0..model.layers {
        let lead = if l == 0 {
            prologue_ops()
        } else {
            carry.clone()
        };
        for op in lead.into_iter().chain(layer.iter().cloned()) {
            push_op(&mut stages, Some(l), op, false);
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
    for (j, stage) in stages.iter_mut().enumerate() {
        stage.dependency = if j == 0 {
            StageDependency::None
        } else if stage.ops.iter().any(|op| op.kind.is_cross_chunk()) {
            StageDependency::CrossChunk
        } else {
            StageDependency::IntraChunk
        };
    }
    Ok(stages)
}

/// Merges the stages of one processor: within a decoder layer (or the head), stage `j` joins
/// stage `j - 1` unless it holds a cross-chunk operator, whose wait for earlier chunks must
/// stay a subgraph boundary (seed 000, Eq. 2). For a device whose one processor runs every
/// class (the all-GPU executor): cutting at class changes would only add jobs there (a
/// llama layer becomes 2 subgraphs instead of 6). A merged stage keeps its first
/// operator's class.
pub fn merge_for_one_processor(stages: Vec<StageTemplate>) -> Vec<StageTemplate> {
    let mut merged: Vec<StageTemplate> = Vec::with_capacity(stages.len());
    for stage in stages {
        match merged.last_mut() {
            Some(prev)
                if prev.layer == stage.layer
                    && prev.last_chunk_only == stage.last_chunk_only
                    && stage.dependency != StageDependency::CrossChunk =>
            {
                if stage.sharing == Sharing::Dynamic {
                    prev.sharing = Sharing::Dynamic;
                }
                prev.ops.extend(stage.ops);
            }
            _ => merged.push(stage),
        }
    }
    merged
}

fn new_stage(layer: Option<u32>, op: OpDecl, last_chunk_only: bool) -> StageTemplate {
    StageTemplate {
        name: String::new(),
        layer,
        class: op.class(),
        sharing: Sharing::Static,
        dependency: StageDependency::None,
        last_chunk_only,
        ops: vec![op],
    }
    .named()
}

impl StageTemplate {
    fn named(mut self) -> Self {
        let first = &self.ops[0].name;
        self.name = match self.layer {
            Some(l) => format!("L{l}.{first}"),
            None => format!("head.{first}"),
        };
        self
    }

    /// Operator names, in order.
    pub fn op_names(&self) -> Vec<&str> {
        self.ops.iter().map(|op| op.name.as_str()).collect()
    }
}

fn push_op(stages: &mut Vec<StageTemplate>, layer: Option<u32>, op: OpDecl, last_only: bool) {
    match stages.last_mut() {
        Some(stage) if stage.class == op.class() => {
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
