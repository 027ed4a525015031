//! `hetsched serve`: the arguments of the OpenAI-compatible local server; the server
//! itself is the `hetsched-serve` crate.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use hetsched::exec::{LinearPrecision, PrefillOptions};
use hetsched_serve::load::EngineBounds;
use hetsched_serve::{ConfigError, Limits, ServeConfig};

use crate::CliError;
use crate::choices::Precision;

/// `hetsched serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// GGUF model file (llama architecture), or a Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on; anything but loopback needs --allow-remote and --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Allow a non-loopback --host (serving other machines).
    #[arg(long)]
    allow_remote: bool,
    /// Bearer token clients must send (Authorization: Bearer KEY) to /v1/* and /metrics.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// The model's name in /v1/models and responses [default: the file name without
    /// .gguf].
    #[arg(long, value_name = "NAME")]
    model_id: Option<String>,
    /// Arithmetic of the linear layers.
    #[arg(long, value_enum, default_value = "w8a8")]
    precision: Precision,
    /// Processor queues, as for `generate`: cpu,npu; cpu,gpu,npu; gpu.
    #[arg(long, value_delimiter = ',', default_value = "cpu,npu")]
    backends: Vec<String>,
    /// Scheduling policy of the prefill.
    #[arg(long, default_value = "balance", value_parser = crate::choices::policy_name)]
    policy: String,
    /// Compute threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = 128)]
    chunk_len: u32,
    #[command(flatten)]
    limits: LimitArgs,
}

/// The server's limits (docs/serving.md).
#[derive(clap::Args)]
struct LimitArgs {
    /// Request body bytes at most (413 beyond).
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Request head (request line and headers) bytes at most, from 8192.
    #[arg(long, default_value_t = Limits::default().max_header_bytes)]
    max_header_bytes: usize,
    /// Prompt tokens at most, after the chat template (400 beyond).
    #[arg(long, default_value_t = Limits::default().max_prompt_tokens)]
    max_prompt_tokens: usize,
    /// Largest max_tokens a request may ask for (400 beyond).
    #[arg(long, default_value_t = Limits::default().max_tokens)]
    max_tokens_limit: usize,
    /// New tokens of a request that names no max_tokens.
    #[arg(long, default_value_t = Limits::default().default_max_tokens)]
    default_max_tokens: usize,
    /// Largest n (samples per request).
    #[arg(long, default_value_t = Limits::default().max_n)]
    max_n: usize,
    /// Open connections at most (more wait to be accepted).
    #[arg(long, default_value_t = Limits::default().max_connections)]
    max_connections: usize,
    /// Requests queued and running at most (503 with Retry-After beyond).
    #[arg(long, default_value_t = Limits::default().max_requests)]
    max_requests: usize,
    /// MiB of KV cache the running requests may hold together: a request whose cache
    /// (prompt + n x max_tokens positions) does not fit now gets 503 with Retry-After, one
    /// that never fits 400.
    #[arg(long, default_value_t = 1024)]
    kv_budget_mib: usize,
    /// Seconds a client has to send a request's headers (also the idle keep-alive time).
    #[arg(long, default_value_t = Limits::default().header_timeout.as_secs_f64())]
    header_timeout: f64,
    /// Seconds a client has to send a request's body (408 beyond).
    #[arg(long, default_value_t = Limits::default().body_timeout.as_secs_f64())]
    body_timeout: f64,
    /// Seconds a write to a client may wait before the client is dropped.
    #[arg(long, default_value_t = Limits::default().write_timeout.as_secs_f64())]
    write_timeout: f64,
    /// Seconds in-flight requests have to finish after SIGTERM or SIGINT.
    #[arg(long, default_value_t = Limits::default().shutdown_grace.as_secs_f64())]
    shutdown_grace: f64,
}

impl LimitArgs {
    fn kv_budget_bytes(&self) -> Result<usize, CliError> {
        match self.kv_budget_mib.checked_mul(1 << 20) {
            Some(bytes) if bytes > 0 => Ok(bytes),
            _ => Err(hetsched_serve::ServeError::from(ConfigError::Limit {
                name: "--kv-budget-mib",
                value: self.kv_budget_mib as u64,
                why: "give at least 1 MiB, within the address space",
            })
            .into()),
        }
    }

    fn limits(&self) -> Result<Limits, CliError> {
        let seconds = |name: &'static str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|_| CliError::InvalidSeconds { name, value: s })
        };
        Ok(Limits {
            max_body_bytes: self.max_body_bytes,
            max_header_bytes: self.max_header_bytes,
            max_prompt_tokens: self.max_prompt_tokens,
            max_tokens: self.max_tokens_limit,
            default_max_tokens: self.default_max_tokens,
            max_n: self.max_n,
            max_connections: self.max_connections,
            max_requests: self.max_requests,
            header_timeout: seconds("--header-timeout", self.header_timeout)?,
            body_timeout: seconds("--body-timeout", self.body_timeout)?,
            write_timeout: seconds("--write-timeout", self.write_timeout)?,
            shutdown_grace: seconds("--shutdown-grace", self.shutdown_grace)?,
            ..Limits::default()
        })
    }
}

/// Serves until SIGTERM or SIGINT.
pub fn serve(args: ServeArgs) -> Result<(), CliError> {
    let gpu = crate::real::gpu_use(&args.backends)?;
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        let name = args.model.file_name().map(|n| n.to_string_lossy());
        let name = name.as_deref().unwrap_or("model");
        name.strip_suffix(".gguf").unwrap_or(name).to_string()
    });
    let limits = args.limits.limits()?;
    let config = ServeConfig {
        addr: SocketAddr::new(args.host, args.port),
        allow_remote: args.allow_remote,
        api_key: args.api_key,
        model_id,
        limits,
    };
    // Settings that cannot work are refused before anything starts.
    config
        .validate()
        .map_err(hetsched_serve::ServeError::from)?;
    let defaults = PrefillOptions::default();
    let options = PrefillOptions {
        chunk_len: args.chunk_len,
        policy: args.policy,
        threads: args.threads.unwrap_or(defaults.threads),
        gpu,
        gpu_kernels: crate::gpu_env::gpu_kernels()?,
        ..defaults
    };
    options.validate()?;
    let precision = LinearPrecision::from(args.precision);
    // What a GPU lane needs (the build's support, f32 for the resident GPU, a device) is
    // checked before the listener and the model.
    let device = hetsched_serve::load::check_backends(gpu, precision)
        .map_err(hetsched_serve::ServeError::from)?;
    let bounds = EngineBounds {
        max_requests: config.limits.max_requests,
        kv_budget_bytes: args.limits.kv_budget_bytes()?,
    };
    let loader = hetsched_serve::load::loader(args.model, precision, options, bounds);
    let on = device
        .map(|name| format!(", GPU: {name}"))
        .unwrap_or_default();
    hetsched_serve::run_until_signal(config, loader, |addr| {
        eprintln!("hetsched serve: listening on http://{addr} (loading the model{on})");
    })?;
    eprintln!("hetsched serve: stopped");
    Ok(())
}
