//! `llamay tokenize` and `llamay detokenize` (cli.md): the file's own tokenizer,
//! exact to llama.cpp; work on vocab-only GGUF files.

use crate::ModelArg;
use crate::out;
use anyhow::{Context, bail};
use llamay_gguf::MappedModel;
use llamay_tokenizer::{CleanSpaces, Tokenizer};
use std::io::{BufRead, Read, Write};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Text to tokenise (default: all of stdin, byte-exact).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT")]
    prompt: Option<String>,
    /// Print one JSON array of token ids.
    #[arg(long)]
    ids: bool,
    /// Add no special tokens (BOS/EOS/SEP).
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// Batch mode: each stdin line is one JSON string; each output line the JSON
    /// array of its ids.
    #[arg(long)]
    jsonl: bool,
}

#[derive(clap::Args)]
pub struct DetokArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Batch mode: each stdin line a JSON array of ids; each output line the JSON
    /// string of its text.
    #[arg(long)]
    jsonl: bool,
    /// Apply the vocabulary's space clean-up as llama.cpp's detokenizer does (" ," to
    /// "," and the like, for vocabularies that ask for it). The output then no longer
    /// round-trips: `tokenize` of it may give other ids. Default: the exact text.
    #[arg(long)]
    clean_spaces: bool,
}

fn load(model: &ModelArg) -> anyhow::Result<Tokenizer> {
    let path = &model.path()?;
    let mapped = MappedModel::open(path)?;
    let parsed = mapped.parse()?;
    let tok = Tokenizer::from_metadata(parsed.metadata())
        .with_context(|| format!("{}", path.display()))?;
    for w in tok.warnings() {
        if w.contains("pre-tokenizer") {
            eprintln!("warning: {w}");
        }
    }
    Ok(tok)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let tok = load(&args.model)?;
    // as llama-tokenize: special tokens are added only when the vocabulary asks for BOS
    let add_special = tok.add_bos() && !args.no_bos;
    let parse_special = !args.no_parse_special;
    let mut w = out::stdout();
    if args.jsonl {
        if args.prompt.is_some() {
            bail!("--jsonl reads its texts from stdin; drop -p");
        }
        let stdin = std::io::stdin();
        for (i, line) in stdin.lock().lines().enumerate() {
            let line = line.context("reading stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            let text: String = serde_json::from_str(&line)
                .with_context(|| format!("stdin line {}: expected a JSON string", i + 1))?;
            let ids = tok.encode(text.as_bytes(), add_special, parse_special);
            serde_json::to_writer(&mut w, &ids)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
        return Ok(());
    }
    let text: Vec<u8> = match &args.prompt {
        Some(p) => p.as_bytes().to_vec(),
        None => {
            let mut b = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut b)
                .context("reading stdin")?;
            b
        }
    };
    let ids = tok.encode(&text, add_special, parse_special);
    if args.ids {
        serde_json::to_writer(&mut w, &ids)?;
        w.write_all(b"\n")?;
    } else {
        for &id in &ids {
            write!(w, "{id:6} -> '")?;
            w.write_all(tok.token_to_piece(id, true)?)?;
            w.write_all(b"'\n")?;
        }
    }
    w.flush()?;
    Ok(())
}

/// The text for ids as `tokenize` produced them: a leading BOS (and trailing EOS)
/// that the vocabulary adds are dropped, other special tokens are rendered as their
/// text, and the space prefix SentencePiece adds is removed.
fn detok(tok: &Tokenizer, ids: &[u32], clean_spaces: bool) -> anyhow::Result<Vec<u8>> {
    let mut ids = ids;
    if tok.add_bos() && !ids.is_empty() && Some(ids[0]) == tok.bos() {
        ids = &ids[1..];
    }
    if tok.add_eos() && !ids.is_empty() && Some(ids[ids.len() - 1]) == tok.eos() {
        ids = &ids[..ids.len() - 1];
    }
    let clean = if clean_spaces {
        CleanSpaces::AsVocabulary
    } else {
        CleanSpaces::Never
    };
    Ok(tok.detokenize(ids, false, true, clean)?)
}

fn parse_ids(s: &str, what: &str) -> anyhow::Result<Vec<u32>> {
    let v: Vec<u64> = serde_json::from_str(s)
        .with_context(|| format!("{what}: expected a JSON array of token ids"))?;
    v.into_iter()
        .map(|x| {
            u32::try_from(x).map_err(|_| anyhow::anyhow!("{what}: token id {x} is out of range"))
        })
        .collect()
}

pub fn run_detokenize(args: &DetokArgs) -> anyhow::Result<()> {
    let tok = load(&args.model)?;
    let mut w = out::stdout();
    if args.jsonl {
        let stdin = std::io::stdin();
        for (i, line) in stdin.lock().lines().enumerate() {
            let line = line.context("reading stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            let ids = parse_ids(&line, &format!("stdin line {}", i + 1))?;
            let text = detok(&tok, &ids, args.clean_spaces)?;
            // JSON strings are Unicode: bytes that are not UTF-8 become U+FFFD
            serde_json::to_writer(&mut w, &String::from_utf8_lossy(&text))?;
            w.write_all(b"\n")?;
        }
    } else {
        let mut s = String::new();
        std::io::stdin()
            .lock()
            .read_to_string(&mut s)
            .context("reading stdin")?;
        let ids = parse_ids(s.trim(), "stdin")?;
        w.write_all(&detok(&tok, &ids, args.clean_spaces)?)?;
    }
    w.flush()?;
    Ok(())
}
