//! Raw samples of `hetsched profile` (one per subgraph instance of a real prefill) and
//! the fits over them, one per (precision, stage kind, processor).

use std::collections::BTreeMap;

use hetsched::engine::RunOutcome;
use hetsched::systems::{
    DeviceProfile, StageCost, StageSample, fit_stage_cost, has_attention, precision_label,
    stage_kind,
};
use serde::Serialize;

/// One measured subgraph instance (a row of the samples CSV).
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// The linears' precision (`w8a8`, `f32`, `w8a8-shadow`).
    pub precision: String,
    /// The stage kind (its operators' names joined by `+`).
    pub stage: String,
    /// The processor (lane) that ran it.
    pub processor: String,
    /// Tokens in its chunk.
    pub tokens: u64,
    /// Tokens before its chunk.
    pub past: u64,
    /// Measured compute time, ns.
    pub ns: u64,
    /// Whether the stage holds attention (its cost grows with the attended pairs).
    pub attention: bool,
    /// The prefill it came from: prompt length, chunk length, repetition.
    pub prompt_len: u32,
    /// Chunk length of that prefill.
    pub chunk_len: u32,
    /// Repetition of that setting.
    pub rep: u32,
}

/// Every instance of a finished run as samples.
pub fn samples_of(run: &RunOutcome, rep: u32) -> Vec<Sample> {
    let plan = &run.plan;
    let (prompt, chunk_len) = (plan.workload.prompt_len, plan.workload.chunk_len);
    let precision = precision_label(&plan.model);
    run.timeline
        .slices
        .iter()
        .map(|s| {
            let ops = &plan.stages[s.key.stage as usize].ops;
            let past = s.key.chunk * chunk_len;
            Sample {
                precision: precision.clone(),
                stage: stage_kind(ops),
                processor: plan.device.processors[s.processor].name.clone(),
                tokens: u64::from(chunk_len.min(prompt - past)),
                past: u64::from(past),
                ns: s.end_ns.saturating_sub(s.start_ns),
                attention: has_attention(ops),
                prompt_len: prompt,
                chunk_len,
                rep,
            }
        })
        .collect()
}

/// One fit, as `profile --json` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    /// Processor name.
    pub processor: String,
    /// The fitted cost (coefficients, samples, relative RMS error).
    #[serde(flatten)]
    pub cost: StageCost,
}

/// Fits every (precision, stage kind, processor) of `samples` and puts the costs into
/// `device`'s processors (replacing what they had). Groups whose durations are not all
/// positive are skipped: those stages keep the roofline.
pub fn fit_into(device: &mut DeviceProfile, samples: &[Sample]) -> Vec<Fit> {
    let mut groups: BTreeMap<(String, String, String), (bool, Vec<StageSample>)> = BTreeMap::new();
    for s in samples {
        let key = (s.processor.clone(), s.precision.clone(), s.stage.clone());
        let group = groups.entry(key).or_insert((s.attention, Vec::new()));
        group.1.push(StageSample {
            tokens: s.tokens,
            past: s.past,
            ns: s.ns as f64,
        });
    }
    for p in &mut device.processors {
        p.cost.stages.clear();
    }
    let mut fits = Vec::new();
    for ((processor, precision, stage), (attention, group)) in groups {
        let Some(cost) = fit_stage_cost(&stage, &precision, attention, &group) else {
            continue;
        };
        if let Some(p) = device.processors.iter_mut().find(|p| p.name == processor) {
            p.cost.stages.push(cost.clone());
        }
        fits.push(Fit { processor, cost });
    }
    fits
}

/// The samples as CSV text.
pub fn to_csv(samples: &[Sample]) -> Result<String, csv::Error> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for s in samples {
        writer.serialize(s)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|e| csv::Error::from(e.into_error()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
