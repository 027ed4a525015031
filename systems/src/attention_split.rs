//! Attention cut by query heads: a chunk's attention stage as several short jobs.
//!
//! A prefill chunk's float stage holding attention runs for tens of milliseconds at a
//! long context (its work grows with the keys before the chunk). A request policy that
//! lends a processor's idle gaps to less urgent work (`slack`, docs/requests.md) can
//! place only a job shorter than the gap; a stage that long never fits. Cut by query
//! heads, the same work becomes jobs of a few milliseconds that can.
//!
//! [`split_attention_stages`] replaces every stage holding an attention operator by
//!
//! - a **prep** stage: the stage's operators before attention (the dequantize of the
//!   Q, K and V linears' outputs, biases, QK-norm, RoPE), whole: they write the chunk's
//!   keys and values into the KV cache for every head;
//! - **parts**: one stage per group of query heads ([`HeadRange`]), each the attention
//!   operator over its heads only (scores, softmax and values of those heads, reading the
//!   KV heads they share). A part waits for the prep of its chunk and of every earlier
//!   chunk (the keys it reads; seed 000, Eq. 2), as the whole stage did. Parts do not
//!   wait for each other: they may run at once on different processors, or between
//!   other work on one;
//! - a **merge** stage: the operators after attention (the attention output's per-tensor
//!   quantize, whose scale is the maximum over every head), waiting for every part.
//!
//! Each stage is priced by the processor's cost model as any stage is: a part's
//! attention is the work of its heads ([`crate::model::OpDecl::work`]: the operations
//! of its query heads, the bytes of the KV heads it reads), plus a subgraph launch and
//! an operator's overhead per job. So the parts cost their whole plus one launch and
//! one operator overhead per extra job, and a part of a group that shares its KV head
//! with other groups (Gemma-2B's one KV head) reads that head again.
//!
//! The cut is a plan option ([`crate::PrefillPlan::with_attention_split`]), not the
//! default: the simulated request mix applies it to its prefills only when asked
//! (`simulate --requests ... --attention-part-ms MS`), since in the simulated agent burst
//! it made the background request end later (docs/requests.md); single-request plans,
//! and real runs, keep attention whole.

use crate::graph::{Sharing, StageDependency, StageTemplate};
use crate::model::{ExecClass, ModelConfig, OpKind};
pub use crate::op::HeadRange;

/// The query heads of `model` cut into groups of `heads / parts` heads (rounded down, at
/// least one; the last group may hold fewer), in head order: at least `parts` groups, so
/// that no group is longer than asked for, and at most one a head. One group of every
/// head for `parts` 0 or 1.
pub fn head_groups(model: &ModelConfig, parts: u32) -> Vec<HeadRange> {
    let heads = model.heads.max(1);
    let per = (heads / parts.clamp(1, heads)).max(1);
    (0..heads)
        .step_by(per as usize)
        .map(|first| HeadRange {
            first,
            count: per.min(heads - first),
        })
        .collect()
}

/// Whether `stage` is a stage [`split_attention_stages`] cuts: a whole stage holding an
/// attention operator (not already a part).
pub fn is_splittable(stage: &StageTemplate) -> bool {
    // A stage merged for one processor (linears and attention in one job) is not cut:
    // its prep would hold the linears.
    !stage.is_shadow()
        && stage.class == ExecClass::Float
        && stage.ops.iter().all(|op| op.class() == ExecClass::Float)
        && stage
            .ops
            .iter()
            .any(|op| op.kind == OpKind::Attention && op.heads.is_none())
}

/// `stages` (a linked per-chunk chain, [`crate::graph::build_stages`]) with every
/// splittable stage cut into a prep, one part per head group of `groups` and a merge
/// (module doc); other stages are kept, their waits renumbered. `groups` of one range
/// (or none) returns `stages` unchanged.
pub fn split_attention_stages(
    stages: Vec<StageTemplate>,
    groups: &[HeadRange],
) -> Vec<StageTemplate> {
    if groups.len() <= 1 {
        return stages;
    }
    let mut out: Vec<StageTemplate> = Vec::with_capacity(stages.len() * 2);
    // For each old stage, the new stages a stage waiting for it now waits for.
    let mut exits: Vec<Vec<u32>> = Vec::with_capacity(stages.len());
    for stage in stages {
        let after: Vec<u32> = stage
            .after
            .iter()
            .flat_map(|&j| exits[j as usize].iter().copied())
            .collect();
        if !is_splittable(&stage) {
            exits.push(vec![out.len() as u32]);
            out.push(StageTemplate { after, ..stage });
            continue;
        }
        exits.push(split_one(stage, after, groups, &mut out));
    }
    out
}

/// Appends the prep, parts and merge of `stage` (waiting for `after`) to `out`; the
/// stages a successor of `stage` waits for.
fn split_one(
    stage: StageTemplate,
    after: Vec<u32>,
    groups: &[HeadRange],
    out: &mut Vec<StageTemplate>,
) -> Vec<u32> {
    let at = stage
        .ops
        .iter()
        .position(|op| op.kind == OpKind::Attention)
        .expect("a splittable stage holds attention");
    let attention = stage.ops[at].clone();
    let (before, rest) = stage.ops.split_at(at);
    let behind = &rest[1..];
    let base = StageTemplate {
        ops: Vec::new(),
        after: Vec::new(),
        ..stage.clone()
    };
    let mut part_after = after.clone();
    let mut part_dependency = stage.dependency;
    if !before.is_empty() {
        out.push(
            StageTemplate {
                ops: before.to_vec(),
                sharing: Sharing::Static,
                dependency: match stage.dependency {
                    StageDependency::None => StageDependency::None,
                    _ => StageDependency::IntraChunk,
                },
                after,
                ..base.clone()
            }
            .named(),
        );
        part_after = vec![out.len() as u32 - 1];
        part_dependency = StageDependency::CrossChunk;
    }
    let names: Vec<String> = groups
        .iter()
        .map(|g| part_name(&attention.name, *g))
        .collect();
    let mut parts = Vec::with_capacity(groups.len());
    for (group, name) in groups.iter().zip(&names) {
        parts.push(out.len() as u32);
        let mut op = attention.clone();
        op.name = name.clone();
        op.heads = Some(*group);
        out.push(
            StageTemplate {
                ops: vec![op],
                sharing: Sharing::Dynamic,
                dependency: part_dependency,
                after: part_after.clone(),
                ..base.clone()
            }
            .named(),
        );
    }
    if behind.is_empty() {
        return parts;
    }
    // The operators after attention read every part's output.
    let ops = behind
        .iter()
        .cloned()
        .map(|mut op| {
            if op.inputs.contains(&attention.name) {
                op.inputs.retain(|i| *i != attention.name);
                op.inputs.extend(names.iter().cloned());
            }
            op
        })
        .collect();
    out.push(
        StageTemplate {
            ops,
            sharing: Sharing::Static,
            dependency: StageDependency::IntraChunk,
            after: parts,
            last_chunk_only: stage.last_chunk_only,
            ..base
        }
        .named(),
    );
    vec![out.len() as u32 - 1]
}

/// The name of the part of attention operator `name` over `group`: `attention[h0-3]`.
fn part_name(name: &str, group: HeadRange) -> String {
    format!("{name}[h{}-{}]", group.first, group.first + group.count - 1)
}

impl StageTemplate {
    /// The query heads this stage's attention covers, when it is a part of a split
    /// attention stage ([`crate::attention_split`]).
    pub fn head_range(&self) -> Option<HeadRange> {
        self.ops.iter().find_map(|op| op.heads)
    }

    /// Whether this stage runs beside the stage before it in its chunk, sharing its
    /// memory step: an outlier shadow, or a part of split attention after the first.
    pub fn runs_beside_previous(&self) -> bool {
        self.is_shadow() || self.head_range().is_some_and(|r| r.first > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::build_stages;
    use crate::testing::tiny_model;

    #[test]
    fn head_groups_cover_every_head_once() {
        let model = ModelConfig {
            heads: 16,
            kv_heads: 4,
            ..tiny_model(1)
        };
        for parts in 0..=20 {
            let groups = head_groups(&model, parts);
            let mut next = 0;
            for g in &groups {
                assert_eq!(g.first, next, "{parts}");
                assert!(g.count >= 1);
                next += g.count;
            }
            assert_eq!(next, 16);
            assert!(groups.len() as u32 >= parts.clamp(1, 16), "{parts}");
            // Groups of one size, the last aside.
            assert!(groups.iter().all(|g| g.count <= groups[0].count));
        }
        let groups = head_groups(&model, 8);
        assert_eq!(groups[0].kv_heads(16, 4), 1);
        assert_eq!(head_groups(&model, 2)[1].kv_heads(16, 4), 2);
    }

    #[test]
    fn a_split_stage_becomes_prep_parts_and_merge() {
        let model = tiny_model(2);
        let stages = build_stages(&model).unwrap();
        let groups = head_groups(&model, 2);
        let split = split_attention_stages(stages.clone(), &groups);
        let attention = stages.iter().filter(|s| is_splittable(s)).count();
        assert_eq!(split.len(), stages.len() + attention * (groups.len() + 1));
        for (j, stage) in split.iter().enumerate() {
            assert!(
                stage.after.iter().all(|&a| (a as usize) < j),
                "{}",
                stage.name
            );
            if let Some(range) = stage.head_range() {
                assert_eq!(stage.dependency, StageDependency::CrossChunk);
                assert_eq!(stage.after.len(), 1);
                assert!(split[stage.after[0] as usize].head_range().is_none());
                assert_eq!(range.count, model.heads / 2);
            }
        }
        // The merge waits for every part of its layer.
        let merge = split
            .iter()
            .find(|s| s.ops[0].name == "o_quant")
            .expect("a merge");
        assert_eq!(merge.after.len(), groups.len());
        assert!(
            merge.ops[0]
                .inputs
                .iter()
                .all(|i| i.starts_with("attention["))
        );
    }
}
