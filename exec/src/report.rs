//! The report of a real prefill (`hetsched run --json`).

use serde::Serialize;

use super::shadow::ShadowReport;
use super::{ActivationBytes, ExecModel, PrefillResult, wait_per_lane};
use hetsched_import::{GgufTokenizer, top_k};
use hetsched_runtime::decision::DecisionChoice;
use hetsched_runtime::prediction::{CostModelUse, Prediction};
use hetsched_runtime::report::RunReport;

/// One candidate next token.
#[derive(Debug, Clone, Serialize)]
pub struct TopToken {
    /// Token id.
    pub id: u32,
    /// Its text.
    pub text: String,
    /// Softmax probability.
    pub prob: f32,
}

/// What `hetsched run` prints.
#[derive(Debug, Clone, Serialize)]
pub struct PrefillReport {
    /// Model name.
    pub model: String,
    /// Linear precision (`f32` or `w8a8`).
    pub precision: &'static str,
    /// Compute threads.
    pub threads: usize,
    /// Prompt tokens (BOS included when the model adds one).
    pub prompt_tokens: usize,
    /// Time to load and prepare the weights, in ms.
    pub load_ms: f64,
    /// Bytes of the decoder layers' linear weights as the products read them
    /// ([`ExecModel::linear_weight_bytes`]): 4 per weight in f32, about 1 in W8A8, 17/32
    /// in W4A8.
    pub linear_weight_bytes: u64,
    /// Prefill wall time, first dispatch to last completion, in ms.
    pub prefill_ms: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tokens_per_s: f64,
    /// The most likely next tokens.
    pub top_tokens: Vec<TopToken>,
    /// The outlier shadow (w8a8-shadow only): resident bytes, hits and misses, time.
    pub shadow: Option<ShadowReport>,
    /// Device bytes of the chunk activations (every stage resident on a GPU only).
    pub gpu_activations: Option<ActivationBytes>,
    /// The weights the resident GPU path ran with (f32 or f16; every stage resident only).
    pub gpu_weights: Option<crate::GpuWeights>,
    /// The schedule that ran (real timestamps; its `lower_bound_ms` from the run's own
    /// measured durations, the cost model's in `model_lower_bound`).
    pub schedule: RunReport,
    /// Which cost model the policy's plan used (measured stage costs or the roofline).
    pub cost_model: CostModelUse,
    /// With a measured profile: whether the policy decided with the measured or the
    /// roofline costs, and the two predicted makespans the choice rests on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_costs: Option<DecisionChoice>,
    /// `run --predict`: the simulated makespan of the same plan, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_makespan_ms: Option<f64>,
    /// `run --predict`: (predicted - measured) / measured makespan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction_error: Option<f64>,
    /// `run --predict`: busy times and stage kinds, predicted against measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
}

impl PrefillReport {
    /// Builds the report of `result`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: &ExecModel,
        threads: usize,
        load_ms: f64,
        result: &PrefillResult,
        tokenizer: &GgufTokenizer,
    ) -> Self {
        let (name, precision) = (&model.name, model.precision.as_str());
        let lanes = result.outcome.plan.lanes();
        let schedule = RunReport::measured(
            &format!("{name} (real)"),
            &result.outcome,
            &wait_per_lane(&result.queue_waits, lanes),
        );
        let prompt_tokens = schedule.prompt_len as usize;
        let top_tokens = top_k(&result.logits, 5)
            .into_iter()
            .map(|(id, prob)| TopToken {
                id,
                text: tokenizer
                    .decode(&[id])
                    .unwrap_or_else(|_| format!("<{id}>")),
                prob,
            })
            .collect();
        let shadow = model.shadow_report(result.shadow).map(|mut s| {
            s.prefill_share = s.shadow_ms / schedule.makespan_ms.max(1e-9);
            s
        });
        Self {
            model: name.to_string(),
            shadow,
            gpu_activations: result.gpu_activations,
            gpu_weights: result.gpu_weights,
            precision,
            threads,
            prompt_tokens,
            load_ms,
            linear_weight_bytes: model.linear_weight_bytes(),
            prefill_ms: schedule.makespan_ms,
            prefill_tokens_per_s: schedule.prefill_tokens_per_s,
            top_tokens,
            cost_model: CostModelUse::of(&result.outcome.plan),
            decision_costs: result.decision.clone(),
            schedule,
            predicted_makespan_ms: None,
            prediction_error: None,
            prediction: None,
        }
    }

    /// Adds the simulation of the same plan (`run --predict`).
    pub fn set_prediction(&mut self, prediction: Prediction) {
        self.predicted_makespan_ms = Some(prediction.predicted_makespan_ms);
        self.prediction_error = Some(prediction.prediction_error);
        self.prediction = Some(prediction);
    }

    /// A few human-readable lines.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} ({}), {} threads, policy {}, chunk {}\n\
             prompt tokens: {}\n\
             prefill: {:.1} ms ({:.0} tok/s); weights loaded in {:.0} ms \
             ({:.1} MiB of linear weights)\n",
            self.model,
            self.precision,
            self.threads,
            self.schedule.policy,
            self.schedule.chunk_len,
            self.prompt_tokens,
            self.prefill_ms,
            self.prefill_tokens_per_s,
            self.load_ms,
            self.linear_weight_bytes as f64 / (1u64 << 20) as f64
        );
        s.push_str(&self.bound_lines());
        s.push_str(&self.cost_model_line());
        if let Some(p) = &self.prediction {
            s.push_str(&p.summary(3));
        }
        if let Some(sh) = &self.shadow {
            s.push_str(&shadow_summary(sh));
            s.push('\n');
        }
        if let Some(st) = &self.schedule.shadow {
            s.push_str(&format!(
                "shadow stages: {} beside their INT8 stage, {:.1} ms, {:.1}% hidden ({:.1}% while \
                 it ran, {:.1} ms after it ended)\n",
                st.subgraphs,
                st.busy_ms,
                100.0 * st.hidden_share,
                100.0 * st.concurrent_share,
                st.exposed_ms
            ));
        }
        if let Some(w) = self.gpu_weights {
            s.push_str(&format!("GPU weights: {w:?}\n"));
        }
        if let Some(a) = &self.gpu_activations {
            s.push_str(&format!(
                "GPU activations: {:.2} MiB ({} of {} chunks in one arena at the memory planner's \
                 offsets; {:.2} MiB with one buffer per value)\n",
                a.allocated as f64 / f64::from(1u32 << 20),
                a.chunks_in_arena,
                a.chunks,
                a.separate as f64 / f64::from(1u32 << 20)
            ));
        }
        s.push_str("next token:\n");
        for t in &self.top_tokens {
            s.push_str(&format!(
                "  {:>6}  {:>6.2}%  {:?}\n",
                t.id,
                100.0 * t.prob,
                t.text
            ));
        }
        s
    }
}

/// `run --adapt`'s line: how many stage kinds it scaled and the range of the factors.
fn adaptation_line(adapted: &[hetsched_systems::CostAdaptation]) -> Option<String> {
    let factors = adapted.iter().map(|a| a.factor);
    let low = factors.clone().fold(f64::INFINITY, f64::min);
    let high = factors.fold(0.0, f64::max);
    (!adapted.is_empty()).then(|| {
        format!(
            "costs adapted to the run history: {} stage kinds, x{low:.2} to x{high:.2}\n",
            adapted.len()
        )
    })
}

impl PrefillReport {
    /// Which cost model priced the plan's stages.
    fn cost_model_line(&self) -> String {
        let c = &self.cost_model;
        let mut s = format!(
            "cost model: {} ({} stage kinds measured",
            c.model, c.measured_stage_kinds
        );
        if !c.roofline_stage_kinds.is_empty() {
            s.push_str(&format!(
                "; roofline for {}",
                c.roofline_stage_kinds.join(", ")
            ));
        }
        s.push_str(")\n");
        if let Some(line) = adaptation_line(&c.adapted) {
            s.push_str(&line);
        }
        if let Some(d) = &self.decision_costs {
            s.push_str(&format!("policy {}\n", d.summary()));
        }
        s
    }

    /// The measured lower bound (and the model's), then each lane's busy time and wait.
    fn bound_lines(&self) -> String {
        let r = &self.schedule;
        let mut s = format!(
            "bound: {:.1} ms from measured durations (busiest lane {:.1}, critical path {:.1}); \
             makespan is {:.3}x it",
            r.lower_bound_ms, r.busiest_processor_ms, r.critical_path_ms, r.ratio_to_lower_bound
        );
        if let Some(m) = &r.model_lower_bound {
            s.push_str(&format!(
                "; the cost model's bound {:.1} ms",
                m.lower_bound_ms
            ));
        }
        s.push('\n');
        for p in &r.processors {
            s.push_str(&format!(
                "  {:<8} busy {:>9.1} ms ({:>5.1}%), {} subgraphs, queue wait {:.1} ms\n",
                p.name,
                p.busy_ms,
                100.0 * p.utilization,
                p.subgraphs,
                p.queue_wait_ms.unwrap_or(0.0)
            ));
        }
        s
    }
}

/// One line on the outlier shadow: sites kept, resident float rows against a full copy,
/// hits and misses, time.
pub fn shadow_summary(sh: &ShadowReport) -> String {
    format!(
        "shadow: {}/{} sites kept ({}), float rows resident {:.2} MiB of a {:.2} MiB full copy ({:.1}%; \
         {:.2} MiB of them cold rows kept once read), {} hits / {} misses, {} outliers, {:.1} ms in shadow multiplies",
        sh.kept_sites,
        sh.sites,
        sh.calibration.as_deref().map_or_else(
            || "no calibration: every site, every row".to_string(),
            |c| format!("calibration {c}")
        ),
        sh.resident_bytes as f64 / (1 << 20) as f64,
        sh.full_copy_bytes as f64 / (1 << 20) as f64,
        100.0 * sh.resident_share,
        sh.cold_kept_bytes as f64 / (1 << 20) as f64,
        sh.hits,
        sh.misses,
        sh.outliers,
        sh.shadow_ms
    )
}
