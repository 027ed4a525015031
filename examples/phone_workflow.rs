//! The phone workflow: profile on the device through its own queue, carry the profile,
//! simulate on a desktop (docs/calibration.md, "The phone workflow").
//!
//! This machine plays both parts. **On the device**, a runtime that embeds the scheduler
//! runs real prefills of a model through *its own* queue: here the CPU executor's
//! `ThreadQueues` (one host thread per processor lane over a shared worker pool), driven
//! through the `Backend` trait exactly as a QNN or OpenCL queue on a phone would be.
//! `profiling::measure` keeps each subgraph instance's measured duration and
//! `profiling::fit_profile` fits a cost per (processor, precision, stage kind); the
//! device writes three small TOML files (device profile, model, scene). **On the
//! desktop**, nothing but those files: `Scene::load` reads them and
//! `profiling::predict` simulates workloads the device never ran. Last, the device runs
//! those held-out workloads for real, and the example prints predicted against measured
//! makespan.
//!
//! Run it (after `scripts/fetch-model.sh`):
//! `cargo run --release --example phone_workflow [MODEL.gguf] [THREADS]`

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hetsched::engine::RunOutcome;
use hetsched::exec::{self, ExecModel, LinearPrecision, ThreadQueues};
use hetsched::history::records_of;
use hetsched::profiling;
use hetsched::progress::Silent;
use hetsched::scene::{Scene, toml_text};
use hetsched::systems::{PrefillPlan, ProfileOrigin, Workload, precision_label};

/// The grid the device profiles: (prompt tokens, chunk tokens).
const PROFILE_GRID: [(u32, u32); 6] = [
    (256, 64),
    (256, 128),
    (256, 256),
    (1024, 64),
    (1024, 128),
    (1024, 256),
];
/// Workloads the profile never saw, predicted on the desktop and then run on the device.
const HELD_OUT: [(u32, u32); 2] = [(512, 128), (1536, 192)];
const POLICIES: [&str; 3] = ["balance", "stall", "inorder"];
const TEXT: &str = "The committee reviewed the proposal in detail, weighing its costs against \
                    the benefits it promised to the city and to the people who live there. ";

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = args
        .get(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let threads: usize = args.get(2).map_or(Ok(2), |t| t.parse())?;
    let out = Path::new("target/phone-workflow");
    std::fs::create_dir_all(out)?;

    // ---- On the device ----
    let device = Device::open(&model_path, threads)?;
    let profile_files = device.profile(out)?;
    println!("device: wrote {}", profile_files.display());

    // ---- On the desktop: only the carried files ----
    let scene = Scene::load(&profile_files)?;
    println!(
        "desktop: loaded `{}` ({} processors, {} fitted stage costs)",
        scene.name,
        scene.device.processors.len(),
        scene
            .device
            .processors
            .iter()
            .map(|p| p.cost.stages.len())
            .sum::<usize>()
    );
    println!("\nprompt chunk policy    predicted_ms measured_ms error");
    for (prompt_len, chunk_len) in HELD_OUT {
        for policy in POLICIES {
            let mut held_out = scene.clone();
            held_out.workload.prompt_len = prompt_len;
            held_out.workload.chunk_len = chunk_len;
            let predicted = profiling::predict(Arc::new(held_out.plan()?), policy)?;
            // ---- Back on the device: the same workload, for real ----
            let measured = device.run(prompt_len, chunk_len, policy)?;
            let (p, m) = (
                predicted.makespan_ns as f64 / 1e6,
                measured.makespan_ns as f64 / 1e6,
            );
            println!(
                "{prompt_len:>6} {chunk_len:>5} {policy:<8} {p:>12.1} {m:>11.1} {:>+5.1}%",
                100.0 * (p - m) / m
            );
        }
    }
    Ok(())
}

/// The device's side: a model and the queue it runs on.
struct Device {
    model: Arc<ExecModel>,
    tokenizer: hetsched::import::GgufTokenizer,
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
}

impl Device {
    fn open(path: &Path, threads: usize) -> Result<Self, Error> {
        let loaded = exec::load_models(path, &[LinearPrecision::W8a8], None, 0, &mut Silent)?;
        let model = loaded.models.into_iter().next().ok_or("no model loaded")?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        Ok(Self {
            model: Arc::new(model),
            tokenizer: loaded.tokenizer,
            pool: Arc::new(pool),
            threads,
        })
    }

    /// How two jobs share the device's pool: one plan run alone (`inorder`) and
    /// overlapped (`balance`).
    fn sharing(&self) -> Result<Option<f64>, Error> {
        let alone = self.run(512, 128, "inorder")?;
        let shared = self.run(512, 128, "balance")?;
        Ok(profiling::two_job_rate(&alone, &shared))
    }

    /// One real prefill through the device's own queue, measured.
    fn run(&self, prompt_len: u32, chunk_len: u32, policy: &str) -> Result<RunOutcome, Error> {
        let tokens = self.prompt(prompt_len as usize)?;
        let plan = Arc::new(PrefillPlan::new(
            self.model.model_config(),
            exec::host_device(),
            Workload {
                prompt_len,
                chunk_len,
                float_processor: None,
            },
        )?);
        let runner = Arc::new(exec::stage_runner(
            self.model.clone(),
            &plan,
            &tokens,
            &exec::GpuKernelOptions::default(),
        )?);
        // The device's queue: any `Backend` (a QNN queue on a phone) does here.
        let mut queue = ThreadQueues::start(plan.lanes(), runner, self.pool.clone())?;
        Ok(profiling::measure(plan, policy, &mut queue)?)
    }

    /// Profiles the grid (after one warm-up run) and writes the device profile, the
    /// model and a scene naming both; returns the scene's path.
    fn profile(&self, out: &Path) -> Result<PathBuf, Error> {
        self.run(256, 128, "inorder")?;
        let (mut samples, mut gaps) = (Vec::new(), Vec::new());
        // `inorder` on these queues never overlaps two jobs: each sample is a job alone.
        for (prompt_len, chunk_len) in PROFILE_GRID {
            let measured = self.run(prompt_len, chunk_len, "inorder")?;
            samples.extend(records_of(&measured));
            gaps.push(profiling::job_gap_ns(&measured));
        }
        gaps.sort_by(f64::total_cmp);
        let mut device = exec::host_device();
        let fits = profiling::fit_profile(&mut device, &samples);
        let config = self.model.model_config();
        device.name = "this machine, playing the phone".into();
        device.measured = Some(ProfileOrigin {
            model: self.model.name.clone(),
            model_shape: ProfileOrigin::shape_of(&config),
            precisions: vec![precision_label(&config)],
            cpu: "the device".into(),
            cpu_features: Vec::new(),
            threads: self.threads,
            backends: "cpu,npu".into(),
            samples: String::new(),
            job_gap_us: gaps[gaps.len() / 2] / 1e3,
            job_gaps: Vec::new(),
            two_job_rate: self.sharing()?.unwrap_or(0.0),
            one_thread: Vec::new(),
            adapted: Vec::new(),
            cache_bytes: 0,
            warm_weights: Vec::new(),
        });
        println!(
            "device: {} samples from {} prefills, {} fits, worst fit error {:.1}%",
            samples.len(),
            PROFILE_GRID.len(),
            fits.len(),
            100.0 * fits.iter().map(|f| f.cost.fit_error).fold(0.0, f64::max)
        );
        std::fs::write(out.join("device.toml"), toml_text(&device)?)?;
        std::fs::write(out.join("model.toml"), toml_text(&config)?)?;
        let scene = out.join("scene.toml");
        std::fs::write(
            &scene,
            "name = \"carried from the device\"\ndevice = \"device.toml\"\n\
             model = \"model.toml\"\n\n[workload]\nprompt_len = 512\nchunk_len = 128\n",
        )?;
        Ok(scene)
    }

    /// `n` tokens of the sample text, repeated.
    fn prompt(&self, n: usize) -> Result<Vec<u32>, Error> {
        let once = self.tokenizer.encode(TEXT)?;
        if once.is_empty() {
            return Err("the tokenizer gave no tokens".into());
        }
        Ok(once.iter().copied().cycle().take(n).collect())
    }
}
