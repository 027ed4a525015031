//! Where a stage may run: the scene's optional `[placement]` table, resolved to processor
//! lanes per stage.
//!
//! Without the table every stage has one processor (its *home*): INT8 stages the first
//! NPU (else the first CPU), float stages the workload's `float_processor` (else the first
//! CPU, else the first GPU). A rule lists the processors a kind of stage may run on; the
//! first listed is the stage's home (where `inorder` and `peer` run it and where its
//! tensors are accounted), the others are alternates a placement-aware policy may choose
//! at dispatch time. Each eligible processor prices the stage with its own cost model.

use serde::{Deserialize, Serialize};

use crate::device::{DeviceProfile, ProcessorKind};
use crate::error::PlanError;
use crate::graph::StageTemplate;
use crate::model::{ExecClass, OpKind};

/// The kinds of stage a `[placement]` rule can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StageKind {
    /// An INT8 stage (per-tensor W8A8 linears, and the SiLU-mul between them).
    Int8Linear,
    /// A float stage holding attention (with the dequantise, RoPE and quantise around it).
    Attention,
    /// Every other float stage (norms, residual adds, (de)quantisation, the embedding).
    Float,
    /// An outlier shadow stage (float multiplies beside an INT8 stage).
    Shadow,
}

impl StageKind {
    /// The stage kind of `stage`.
    pub fn of(stage: &StageTemplate) -> StageKind {
        match stage.class {
            _ if stage.is_shadow() => StageKind::Shadow,
            ExecClass::Int8 => StageKind::Int8Linear,
            ExecClass::Float if stage.ops.iter().any(|op| op.kind == OpKind::Attention) => {
                StageKind::Attention
            }
            ExecClass::Float => StageKind::Float,
        }
    }

    /// The key naming this kind in a `[placement]` table.
    pub fn key(self) -> &'static str {
        match self {
            StageKind::Int8Linear => "int8_linear",
            StageKind::Attention => "attention",
            StageKind::Float => "float",
            StageKind::Shadow => "shadow",
        }
    }
}

/// The scene's `[placement]` table: for each kind of stage, the processors (by name, or
/// by kind meaning every processor of that kind) it may run on, home first.
///
/// ```toml
/// [placement]
/// attention = ["gpu", "cpu"]      # home: the GPU; the CPU may take it
/// int8_linear = ["hexagon", "cpu"]
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// Processors for INT8 stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8_linear: Option<Vec<String>>,
    /// Processors for float stages holding attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<Vec<String>>,
    /// Processors for the other float stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float: Option<Vec<String>>,
    /// Processors for outlier shadow stages (default: the first CPU, as in seed 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Vec<String>>,
}

impl PlacementConfig {
    /// The rule for `kind`, if the table has one.
    pub fn rule(&self, kind: StageKind) -> Option<&[String]> {
        match kind {
            StageKind::Int8Linear => self.int8_linear.as_deref(),
            StageKind::Attention => self.attention.as_deref(),
            StageKind::Float => self.float.as_deref(),
            StageKind::Shadow => self.shadow.as_deref(),
        }
    }

    /// The same table with every rule cut to its home processor (by name): fixed
    /// placement, each stage where this table would put it by default. `hetsched compare`
    /// measures what placement choice buys against it. Rules that do not resolve on
    /// `device` are kept as they are (building the plan reports them).
    pub fn homes_only(&self, device: &DeviceProfile) -> PlacementConfig {
        let home = |kind: StageKind| {
            let rule = self.rule(kind)?;
            let home = rule
                .first()
                .and_then(|entry| resolve_entry(device, kind, entry).ok())
                .and_then(|lanes| lanes.first().copied());
            Some(match home {
                Some(lane) => vec![device.processors[lane].name.clone()],
                None => rule.to_vec(),
            })
        };
        PlacementConfig {
            int8_linear: home(StageKind::Int8Linear),
            attention: home(StageKind::Attention),
            float: home(StageKind::Float),
            shadow: home(StageKind::Shadow),
        }
    }

    /// The lanes `stage` may run on, home first: the rule for its kind, or `default`.
    ///
    /// # Errors
    /// [`PlanError::InvalidWorkload`] for an empty rule, or an entry that is neither a
    /// processor name nor a kind of processor the device has.
    pub fn lanes(
        &self,
        device: &DeviceProfile,
        stage: &StageTemplate,
        default: usize,
    ) -> Result<Vec<usize>, PlanError> {
        let kind = StageKind::of(stage);
        let Some(rule) = self.rule(kind) else {
            return Ok(vec![default]);
        };
        if rule.is_empty() {
            return Err(PlanError::InvalidWorkload(format!(
                "[placement] {} is empty; list at least one processor",
                kind.key()
            )));
        }
        let mut lanes = Vec::new();
        for entry in rule {
            for lane in resolve_entry(device, kind, entry)? {
                if !lanes.contains(&lane) {
                    lanes.push(lane);
                }
            }
        }
        Ok(lanes)
    }
}

/// The lanes one rule entry names: the processor of that name, else every processor of
/// that kind.
fn resolve_entry(
    device: &DeviceProfile,
    kind: StageKind,
    entry: &str,
) -> Result<Vec<usize>, PlanError> {
    if let Some(lane) = device.processors.iter().position(|p| p.name == entry) {
        return Ok(vec![lane]);
    }
    let names = || device.processor_names();
    let wanted = ProcessorKind::from_name(entry).ok_or_else(|| {
        PlanError::InvalidWorkload(format!(
            "[placement] {}: `{entry}` is neither a processor of {} ({}) nor a processor \
                 kind (cpu, gpu, npu)",
            kind.key(),
            device.name,
            names()
        ))
    })?;
    let lanes: Vec<usize> = (0..device.processors.len())
        .filter(|&i| device.processors[i].kind == wanted)
        .collect();
    if lanes.is_empty() {
        return Err(PlanError::InvalidWorkload(format!(
            "[placement] {}: {} has no {entry} processor (it has: {})",
            kind.key(),
            device.name,
            names()
        )));
    }
    Ok(lanes)
}
