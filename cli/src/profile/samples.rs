//! The fits over the raw samples of `hetsched profile` (history records: one per subgraph
//! instance of a real prefill), one per (precision, stage kind, processor).

use std::collections::BTreeMap;

use hetsched::history::HistoryRecord;
use hetsched::systems::{DeviceProfile, StageCost, StageSample, fit_stage_cost};
use serde::Serialize;

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
pub fn fit_into(device: &mut DeviceProfile, samples: &[HistoryRecord]) -> Vec<Fit> {
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
pub fn to_csv(samples: &[HistoryRecord]) -> Result<String, csv::Error> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for s in samples {
        writer.serialize(s)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|e| csv::Error::from(e.into_error()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
