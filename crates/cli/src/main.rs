//! The `llamay` binary: argument parsing and output only. Every command returns a
//! `Result`; `main` turns an error into one `error:` line on stderr and exit status 1.

mod chat;
mod cmd;
mod constrain;
mod device;
mod generate;
mod left_out;
mod logits_file;
mod out;
mod runnable;
mod session;
mod speculate;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "llamay",
    version,
    about = "Local inference engine for GGUF language models",
    after_help = "The command-line contract: docs/cli.md in the llamay repository."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A model given positionally or with -m/--model (cli.md: either form).
#[derive(clap::Args, Clone)]
pub struct ModelArg {
    /// Model file (GGUF).
    #[arg(value_name = "MODEL")]
    positional: Option<PathBuf>,
    /// Model file (GGUF).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    flag: Option<PathBuf>,
}

impl ModelArg {
    /// The model's file: a file that exists, else a reference pulled into the store
    /// (`LLAMAY_MODELS`), resolved with no network.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        let given = match (&self.positional, &self.flag) {
            (Some(_), Some(_)) => {
                anyhow::bail!("the model is given twice (positionally and with -m); give it once")
            }
            (Some(p), None) | (None, Some(p)) => p,
            (None, None) => {
                anyhow::bail!("no model given: pass a GGUF file as MODEL or with -m FILE")
            }
        };
        if given.exists() {
            return Ok(given.clone());
        }
        let name = given.to_string_lossy();
        // `model.gguf` or `./x` meant a file; `gemma3:270m` or `hf:o/r/f.gguf` a reference.
        let looks_like_a_path = name.starts_with(['/', '.', '~'])
            || match llamay_hub::Reference::parse_name(&name) {
                Ok(llamay_hub::Reference::Registry { .. }) => name.ends_with(".gguf"),
                Ok(_) => false,
                Err(_) => true,
            };
        if looks_like_a_path {
            anyhow::bail!("{name}: No such file or directory");
        }
        let store = llamay_hub::Store::at(llamay_hub::Store::default_root());
        match store.model_path(&name) {
            Ok(p) => Ok(p),
            Err(llamay_hub::StoreError::NotFound(_)) => anyhow::bail!(
                "{name}: no such file, and no model pulled under that name (llamay list shows the store; llamay pull {name} fetches it)"
            ),
            Err(e) => Err(e.into()),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Describe a GGUF file: version, architecture, hyper-parameters, tokenizer,
    /// quantisation mix, and whether this build would run it.
    Info(cmd::info::Args),
    /// Print a tensor's values, dequantised to f32, as one JSON array.
    Dump(cmd::dump::Args),
    /// Rewrite a model with its weight matrices in another format.
    Quantize(cmd::quantize::Args),
    /// An importance matrix for `quantize --imatrix`: the squared activations each
    /// weight matrix sees over a text, as llama-imatrix computes and saves them.
    Imatrix(cmd::imatrix::Args),
    /// Tokenise text with the file's own tokenizer (exact to llama.cpp).
    Tokenize(cmd::tokenize::Args),
    /// Turn a JSON array of token ids back into text.
    Detokenize(cmd::tokenize::DetokArgs),
    /// Generate text from a prompt.
    Run(cmd::run::Args),
    /// Chat with a model through its chat template; the conversation stays in the cache.
    Chat(cmd::chat::Args),
    /// Sentence embeddings, one JSON vector per text (as llama-embedding).
    Embed(cmd::embed::Args),
    /// A cross-encoder's relevance scores for documents against a query (JSON, best
    /// first), as llama.cpp's rank pooling.
    Rerank(cmd::rerank::Args),
    /// Fetch a model into the local store (registry name, hf.co/owner/repo[:quant],
    /// hf:owner/repo/file.gguf[@rev], or an https URL).
    Pull(cmd::store::PullArgs),
    /// The models in the local store.
    List(cmd::store::ListArgs),
    /// Remove a model from the local store.
    Rm(cmd::store::RmArgs),
    /// What a remote GGUF is and whether this build runs it, from its header alone
    /// (HTTP Range requests, a few MB at most).
    Validate(cmd::validate::Args),
    /// Serve the Ollama and OpenAI HTTP APIs (continuous batching, prefix reuse).
    Serve(cmd::serve::Args),
    /// Print the exact prompt a chat template makes of a conversation.
    Render(cmd::render::Args),
    /// Perplexity of a text file, by llama-perplexity's method.
    Perplexity(cmd::perplexity::Args),
    /// How much each quantised KV cache precision moves this file's next-token
    /// distributions (mean total-variation distance, bound 5%, with a 1-bit teeth row).
    Verify(cmd::verify::Args),
    /// Prompt and generation speed, by llama-bench's tests and columns.
    Bench(cmd::bench::Args),
    /// What this build carries: CPU features, kernels, formats, architectures.
    Version(cmd::version::Args),
    /// Write docs/arch-coverage.md from the architecture table (--check: fail if stale).
    Coverage(cmd::coverage::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return out::report_clap_error(e),
    };
    let result = match cli.command {
        Command::Info(args) => cmd::info::run(&args),
        Command::Dump(args) => cmd::dump::run(&args),
        Command::Quantize(args) => cmd::quantize::run(&args),
        Command::Imatrix(args) => cmd::imatrix::run(&args),
        Command::Tokenize(args) => cmd::tokenize::run(&args),
        Command::Detokenize(args) => cmd::tokenize::run_detokenize(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Render(args) => cmd::render::run(&args),
        Command::Pull(args) => cmd::store::pull(&args),
        Command::List(args) => cmd::store::list(&args),
        Command::Rm(args) => cmd::store::rm(&args),
        Command::Validate(args) => cmd::validate::run(&args),
        Command::Chat(args) => cmd::chat::run(&args),
        Command::Embed(args) => cmd::embed::run(&args),
        Command::Rerank(args) => cmd::rerank::run(&args),
        Command::Serve(args) => cmd::serve::run(&args),
        Command::Perplexity(args) => cmd::perplexity::run(&args),
        Command::Verify(args) => cmd::verify::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Version(args) => cmd::version::run(&args),
        Command::Coverage(args) => cmd::coverage::run(&args),
    };
    out::finish(result)
}
