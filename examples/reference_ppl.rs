//! Perplexity of a GGUF model under the f32 **reference forward** (`LlamaModel`), scored
//! as llama.cpp's `llama-perplexity` scores it: windows of `ctx` tokens, the first token
//! of each replaced by BOS where the vocabulary adds one, only positions `ctx/2 .. ctx−1`
//! scored. For the families the executor does not run yet (Gemma 3, Qwen2), so their
//! import can be compared with llama.cpp on the same file and text
//! (`scripts/compare-llamacpp-ppl.sh` with `REFERENCE=1`).
//!
//! Usage: `cargo run --release --example reference_ppl -- MODEL TEXT [CTX] [MAX_WINDOWS]`
//! Prints `perplexity <ppl> windows <n> tokens <scored>`.

use std::process::ExitCode;

use hetsched::import::{GgufFile, GgufTokenizer, LlamaModel, SpmTokenizer, token_nll};

fn tokens_of(
    file: &GgufFile,
    text: &str,
) -> Result<(Vec<u32>, Option<u32>), Box<dyn std::error::Error>> {
    if file.metadata().get_str("tokenizer.ggml.model")? == Some("llama") {
        let t = SpmTokenizer::from_metadata(file.metadata())?;
        Ok((t.encode(text), t.bos_id()))
    } else {
        let t = GgufTokenizer::from_gguf(file)?;
        Ok((t.encode(text)?, t.bos_id().filter(|_| t.add_bos())))
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [model, text, rest @ ..] = args else {
        return Err("usage: reference_ppl MODEL TEXT [CTX] [MAX_WINDOWS]".into());
    };
    let ctx: usize = rest.first().map_or(Ok(512), |c| c.parse())?;
    let max_windows: usize = rest.get(1).map_or(Ok(usize::MAX), |c| c.parse())?;
    if ctx < 2 {
        return Err("CTX must be at least 2".into());
    }
    let file = GgufFile::open(model)?;
    let (tokens, bos) = tokens_of(&file, &std::fs::read_to_string(text)?)?;
    let model = LlamaModel::from_gguf(&file)?;
    let (mut sum, mut count, mut windows) = (0.0, 0usize, 0usize);
    for window in tokens.chunks_exact(ctx).take(max_windows) {
        let mut window = window.to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let logits = model.forward_all(&window)?;
        let vocab = model.config().vocab_size;
        for t in ctx / 2..ctx - 1 {
            sum += token_nll(&logits[t * vocab..(t + 1) * vocab], window[t + 1]);
            count += 1;
        }
        windows += 1;
        eprintln!(
            "window {windows}: running perplexity {:.4}",
            (sum / count as f64).exp()
        );
    }
    if windows == 0 {
        return Err(format!("{} tokens: fewer than one window of {ctx}", tokens.len()).into());
    }
    println!(
        "perplexity {:.4} windows {windows} tokens {count}",
        (sum / count as f64).exp()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("reference_ppl: {e}");
            ExitCode::FAILURE
        }
    }
}
