//! The prefills a profile runs: the grid (every chunk length x prompt length, `reps`
//! times), the sharing runs (how two jobs share the pool, what cached weights save) and
//! the one-thread pass.

use hetsched_runtime::history::{HistoryRecord, records_on};
use hetsched_runtime::profiling::{job_gap_ns, two_job_rate};
use hetsched_runtime::progress::Progress;
use hetsched_runtime::weight_reuse::warm_saving_per_byte;
use hetsched_systems::{DeviceProfile, OneThreadCost, PrecisionWarm, precision_label};

use super::{PrefillGap, ProfileError, ProfileSetup, median, one_thread_costs, prompt_tokens};
use crate::{ExecModel, PrefillOptions, prefill};

/// The prefills a profile runs: every chunk length x prompt length, `reps` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileGrid {
    /// Chunk lengths (tokens per stage instance).
    pub chunk_lens: Vec<u32>,
    /// Prompt lengths: the longest sets the attention contexts covered.
    pub prompt_lens: Vec<u32>,
    /// Repetitions of each (precision, chunk, prompt) prefill (at least one runs).
    pub reps: u32,
}

impl ProfileGrid {
    /// At least one chunk length, none of zero tokens: checked before any model loads.
    pub fn check(&self) -> Result<(), ProfileError> {
        match self.chunk_lens.is_empty() || self.chunk_lens.contains(&0) {
            true => Err(ProfileError::NoChunkLens),
            false => Ok(()),
        }
    }

    fn reps(&self) -> u32 {
        self.reps.max(1)
    }

    /// The one-thread pass's (prompt, chunk) prefills: the first prompt length at every
    /// chunk length, then the longest prompt length (when longer) at the middle chunk
    /// length (the attention contexts the grid covers: a windowed layer's cost changes
    /// slope past its window).
    pub fn one_thread_settings(&self) -> Vec<(u32, u32)> {
        let first = self.prompt_lens.first().copied().unwrap_or(512);
        let mut settings: Vec<(u32, u32)> = self.chunk_lens.iter().map(|&c| (first, c)).collect();
        let longest = self.prompt_lens.iter().copied().max().unwrap_or(first);
        if longest > first {
            let mut chunks = self.chunk_lens.clone();
            chunks.sort_unstable();
            if let Some(&middle) = chunks.get(chunks.len() / 2) {
                settings.push((longest, middle));
            }
        }
        settings
    }
}

/// `setup`'s text as `model`'s prompt of `len` tokens.
fn prompt_of(setup: &ProfileSetup, model: &ExecModel, len: u32) -> Result<Vec<u32>, ProfileError> {
    prompt_tokens(
        setup.tokenizer,
        setup.text,
        len as usize,
        model.config.context_length,
    )
}

/// Runs the grid for every model (one per precision) after one warm-up prefill each;
/// returns the samples, the device the prefills ran on and each prefill's precision and
/// hand-off gap.
///
/// The models take turns at each setting (rep, prompt length, chunk length): a slow
/// spell of the machine (another process, a noisy neighbour) then spreads over every
/// precision instead of skewing the one measured during it (a profile that ran each
/// precision's grid in one block priced w8a8's stages 15-60% above an earlier one on the
/// same build).
pub(super) fn measure(
    setup: &ProfileSetup,
    bar: &mut dyn Progress,
) -> Result<(Vec<HistoryRecord>, DeviceProfile, Vec<PrefillGap>), ProfileError> {
    let grid = setup.grid;
    let settings = grid.chunk_lens.len() * grid.prompt_lens.len() * grid.reps() as usize;
    bar.set_len((setup.models.len() * (settings + 1)) as u64);
    let (mut samples, mut device, mut gaps) = (Vec::new(), None, Vec::new());
    for model in setup.models {
        bar.set_message(model.precision.as_str());
        let warm_len = grid.prompt_lens.first().map_or(256, |&p| p.min(256));
        prefill(
            model.clone(),
            &prompt_of(setup, model, warm_len)?,
            setup.options,
        )?;
        bar.inc(1);
    }
    for _ in 0..grid.reps() {
        for &prompt in &grid.prompt_lens {
            // Tokenized once per prompt length and model, not per chunk length.
            let prompts = setup
                .models
                .iter()
                .map(|model| prompt_of(setup, model, prompt))
                .collect::<Result<Vec<_>, _>>()?;
            for &chunk_len in &grid.chunk_lens {
                let options = PrefillOptions {
                    chunk_len,
                    ..setup.run_options()
                };
                for (model, tokens) in setup.models.iter().zip(&prompts) {
                    bar.set_message(model.precision.as_str());
                    let result = prefill(model.clone(), tokens, &options)?;
                    device.get_or_insert_with(|| result.outcome.plan.device.clone());
                    samples.extend(records_on(
                        &result.outcome,
                        options.threads,
                        setup.cache_bytes,
                    ));
                    let precision = precision_label(&model.model_config());
                    gaps.push((precision, job_gap_ns(&result.outcome)));
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish();
    Ok((samples, device.unwrap_or_else(|| setup.device()), gaps))
}

/// How two jobs share the pool, and what cached weights save: at the first prompt length
/// (512 without one), each chunk length `reps` times. The first model runs once with
/// `inorder` (jobs alone, every weight read from memory) and once with `balance` (jobs
/// overlapping): the two-job rate is the median of `profiling::two_job_rate` over those
/// pairs (one pair is noisy: a few hundred overlaps of a few milliseconds). Every model
/// (precision) runs once with `layerwise` (jobs alone, each stage's first chunk cold and
/// the rest warm): its saving per cached weight byte is
/// `weight_reuse::warm_saving_per_byte` over those runs, with the host's cache (none
/// measured without a known one).
pub(super) fn sharing(
    setup: &ProfileSetup,
) -> Result<(Option<f64>, Vec<PrecisionWarm>), ProfileError> {
    let grid = setup.grid;
    let cache_bytes = setup.cache_bytes;
    let first_prompt = grid.prompt_lens.first().copied().unwrap_or(512);
    let mut rates = Vec::new();
    let mut warm = Vec::new();
    for (k, model) in setup.models.iter().enumerate() {
        let tokens = prompt_of(setup, model, first_prompt)?;
        let mut layerwise = Vec::new();
        for _ in 0..grid.reps() {
            for &chunk_len in &grid.chunk_lens {
                let run = |policy: &str| {
                    let options = PrefillOptions {
                        chunk_len,
                        policy: policy.into(),
                        ..setup.run_options()
                    };
                    prefill(model.clone(), &tokens, &options)
                };
                if k == 0 {
                    let alone = run("inorder")?;
                    let shared = run("balance")?;
                    rates.extend(two_job_rate(&alone.outcome, &shared.outcome));
                }
                if cache_bytes.is_some() {
                    layerwise.push(run("layerwise")?.outcome);
                }
            }
        }
        if let Some(ns_per_byte) = cache_bytes.and_then(|c| warm_saving_per_byte(&layerwise, c)) {
            warm.push(PrecisionWarm {
                precision: precision_label(&model.model_config()),
                ns_per_byte,
            });
        }
    }
    Ok(((!rates.is_empty()).then(|| median(rates)), warm))
}

/// Every stage's cost on one compute thread: each model's prefill at every setting of
/// [`ProfileGrid::one_thread_settings`], once each, on a one-worker pool (where jobs never
/// overlap), fitted like the grid (on a copy of `device`). With the costs on the profile's
/// threads it gives each stage's speed-up, which says how two jobs share the pool
/// (`run --predict`).
pub(super) fn one_thread(
    setup: &ProfileSetup,
    device: &DeviceProfile,
    bar: &mut dyn Progress,
) -> Result<Vec<OneThreadCost>, ProfileError> {
    let settings = setup.grid.one_thread_settings();
    bar.set_len((setup.models.len() * settings.len()) as u64);
    let mut samples = Vec::new();
    // The models take turns at each setting, as in `measure`.
    for &(prompt, chunk_len) in &settings {
        for model in setup.models {
            let tokens = prompt_of(setup, model, prompt)?;
            let options = PrefillOptions {
                chunk_len,
                threads: 1,
                ..setup.run_options()
            };
            let result = prefill(model.clone(), &tokens, &options)?;
            samples.extend(records_on(&result.outcome, 1, setup.cache_bytes));
            bar.inc(1);
        }
    }
    bar.finish();
    Ok(one_thread_costs(device, &samples))
}

#[cfg(test)]
mod tests {
    use super::ProfileGrid;

    #[test]
    fn the_one_thread_pass_covers_the_longest_prompt_at_the_middle_chunk() {
        let grid = ProfileGrid {
            chunk_lens: vec![256, 64, 128],
            prompt_lens: vec![512, 2048],
            reps: 2,
        };
        assert_eq!(
            grid.one_thread_settings(),
            [(512, 256), (512, 64), (512, 128), (2048, 128)]
        );
        let one_prompt = ProfileGrid {
            prompt_lens: vec![512],
            ..grid
        };
        assert_eq!(one_prompt.one_thread_settings().len(), 3);
    }

    #[test]
    fn a_grid_without_a_chunk_length_or_with_a_zero_one_is_refused() {
        let grid = |chunk_lens: Vec<u32>| ProfileGrid {
            chunk_lens,
            prompt_lens: vec![512],
            reps: 1,
        };
        assert!(grid(vec![64, 128]).check().is_ok());
        assert!(grid(vec![]).check().is_err());
        assert!(grid(vec![64, 0]).check().is_err());
    }
}
