//! `llamay rerank`: a cross-encoder's relevance score for each document against a
//! query, as llama.cpp computes them (rank pooling: the first token's state through the
//! file's classification head, the raw logit). Each pair is tokenised as
//! `llama-embedding` tokenises one (`Tokenizer::encode_pair`), so the scores equal
//! `llama-embedding --pooling rank`'s. Output: the documents by descending score
//! (llama-server's `/v1/rerank` order), each with its index.

use crate::cmd::embed::Encode;
use crate::{ModelArg, out};
use anyhow::bail;
use llamay_engine::Pooling;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: crate::device::DeviceArg,
    /// The query every document is scored against.
    #[arg(short = 'q', long)]
    query: String,
    /// The documents to score.
    #[arg(value_name = "DOC", required = true)]
    documents: Vec<String>,
    /// Only the N best documents (default: all).
    #[arg(long, value_name = "N")]
    top_n: Option<usize>,
    /// Context size: the longest pair it takes (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    #[arg(short = 't', long)]
    threads: Option<usize>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let job = Encode {
        model: &args.model,
        device: &args.device,
        threads: args.threads,
        ctx_size: args.ctx_size,
    };
    let scores = job.run(
        |tok, _| {
            Ok((args.documents.iter())
                .map(|d| tok.encode_pair(&args.query, d))
                .collect())
        },
        |file| match file {
            Pooling::Rank => Ok(Pooling::Rank),
            other => bail!(
                "this model pools its states ({}) into embeddings; reranking needs a cross-encoder (pooling_type 4, rank, with a classification head): use `llamay embed` for this one",
                other.name()
            ),
        },
    )?;
    let mut results: Vec<(usize, f32)> = scores.iter().map(|s| s[0]).enumerate().collect();
    // Highest first; ties keep the documents' order.
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    results.truncate(args.top_n.unwrap_or(results.len()));
    let results: Vec<serde_json::Value> = (results.iter())
        .map(|&(i, score)| {
            serde_json::json!({"index": i, "relevance_score": score, "document": args.documents[i]})
        })
        .collect();
    let mut o = out::stdout();
    serde_json::to_writer(
        &mut o,
        &serde_json::json!({"query": args.query, "results": results}),
    )?;
    writeln!(o)?;
    o.flush()?;
    Ok(())
}
