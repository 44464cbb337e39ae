//! Where speculation's drafts come from (`--draft-lookup N`, `--draft-model FILE`):
//! prompt lookup, or a smaller model with the same vocabulary guessing greedily. The
//! verification, which keeps the output exactly what it is without speculation, is
//! `generate::Sampling::run`'s.

use crate::generate::{
    Drafter, PromptLookup, SamplingArgs, Speculation, keep_shared_prefix, prefill,
};
use crate::session;
use anyhow::{Context as _, bail};
use llamay_engine::sample::argmax;
use llamay_engine::{BatchToken, Context, ContextParams, KvPrecision, Model, SeqId, Threads};
use llamay_gguf::MappedModel;
use llamay_tokenizer::Tokenizer;

/// `--draft-model`'s file, opened (the model borrows its bytes).
pub fn open_draft_file(args: &SamplingArgs) -> anyhow::Result<Option<MappedModel>> {
    args.draft_model
        .as_deref()
        .map(|p| MappedModel::open(p).with_context(|| format!("--draft-model {}", p.display())))
        .transpose()
}

/// Loads the draft model from its opened file and checks that it shares `target`'s
/// vocabulary: its guesses are token ids of the target's.
fn load_draft<'a>(
    file: &'a MappedModel,
    threads: Threads,
    target: &Tokenizer,
) -> anyhow::Result<Model<'a>> {
    let gguf = file.parse().context("--draft-model")?;
    let (model, tok) = session::load(file, &gguf, threads).context("--draft-model")?;
    if let Some(why) = vocabulary_difference(target, &tok) {
        bail!(
            "--draft-model: its vocabulary is not the model's ({why}); a draft model must share the vocabulary (or use --draft-lookup N)"
        );
    }
    Ok(model)
}

/// Where two vocabularies differ, in words; `None` when they are the same.
fn vocabulary_difference(a: &Tokenizer, b: &Tokenizer) -> Option<String> {
    if a.kind() != b.kind() {
        return Some(format!("{:?} against {:?} tokenizer", a.kind(), b.kind()));
    }
    if a.n_vocab() != b.n_vocab() {
        return Some(format!("{} tokens against {}", a.n_vocab(), b.n_vocab()));
    }
    if (a.bos(), a.eos()) != (b.bos(), b.eos()) {
        return Some(format!(
            "BOS/EOS {:?}/{:?} against {:?}/{:?}",
            a.bos(),
            a.eos(),
            b.bos(),
            b.eos()
        ));
    }
    (0..a.n_vocab() as u32).find_map(|id| {
        let (x, y) = (a.token_text(id).ok()?, b.token_text(id).ok()?);
        (x != y).then(|| {
            format!(
                "token {id} is {:?} against {:?}",
                String::from_utf8_lossy(x),
                String::from_utf8_lossy(y)
            )
        })
    })
}

/// How a draft model's context is made.
#[derive(Clone, Copy)]
pub struct DraftParams {
    pub threads: Threads,
    pub kv: KvPrecision,
    pub n_ctx: usize,
    /// Most tokens drafted per step (0: no speculation).
    pub max_draft: usize,
}

impl DraftParams {
    /// The flags' draft size, for a target context of these settings.
    pub fn new(
        args: &SamplingArgs,
        threads: Threads,
        kv: KvPrecision,
        n_ctx: usize,
    ) -> anyhow::Result<Self> {
        Ok(DraftParams {
            threads,
            kv,
            n_ctx,
            max_draft: args.draft()?,
        })
    }
}

/// What run and chat speculate with: `--draft-model`'s model when one was given (loaded
/// from its opened file), else prompt lookup; none when `max_draft` is 0.
pub struct Draft<'a> {
    model: Option<Model<'a>>,
    params: DraftParams,
}

impl<'a> Draft<'a> {
    pub fn load(
        file: Option<&'a MappedModel>,
        params: DraftParams,
        target: &Tokenizer,
    ) -> anyhow::Result<Self> {
        let model = file
            .map(|f| load_draft(f, params.threads, target))
            .transpose()?;
        Ok(Draft { model, params })
    }

    /// The speculation of a generation loop (the draft model's context is made here).
    pub fn speculation<'d>(&'d self, tok: &'d Tokenizer) -> anyhow::Result<Speculation<'d>> {
        let drafter: Box<dyn Drafter + 'd> = match &self.model {
            Some(model) => Box::new(DraftModel::new(model, tok, self.params)?),
            None => Box::new(PromptLookup::default()),
        };
        Ok(Speculation::new(self.params.max_draft, drafter))
    }
}

/// A small model guessing the next tokens greedily, in its own context whose cache
/// follows the target sequence: each call decodes only what the target kept since the
/// last one.
pub struct DraftModel<'m> {
    ctx: Context<'m>,
    seq: SeqId,
    tok: &'m Tokenizer,
}

impl<'m> DraftModel<'m> {
    pub fn new(model: &'m Model<'m>, tok: &'m Tokenizer, p: DraftParams) -> anyhow::Result<Self> {
        let mut ctx = model
            .context(ContextParams::new(p.threads, p.kv, p.n_ctx))
            .context("--draft-model")?;
        // The guesses the target rejects are cut from the draft's cache.
        ctx.kv_mut().keep_for_rollback(p.max_draft);
        let seq = ctx.new_sequence();
        Ok(DraftModel { ctx, seq, tok })
    }

    /// Brings the draft cache to `tokens` minus its last token (kept where it agrees,
    /// cut where it does not) and returns the logits after all of `tokens`.
    fn follow(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        let (seq, keep) = keep_shared_prefix(&mut self.ctx, self.seq, tokens)?;
        self.seq = seq;
        prefill(&mut self.ctx, self.seq, &tokens[keep..], keep)
    }
}

impl Drafter for DraftModel<'_> {
    fn draft(&mut self, tokens: &[u32], max: usize) -> anyhow::Result<Vec<u32>> {
        if tokens.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        let mut logits = self.follow(tokens)?;
        let mut out = Vec::with_capacity(max);
        loop {
            let t = argmax(&logits);
            if self.tok.is_eog(t) {
                break;
            }
            out.push(t);
            if out.len() == max {
                break;
            }
            let pos = tokens.len() + out.len() - 1;
            let l = self.ctx.decode(&[BatchToken {
                seq: self.seq,
                token: t,
                pos,
                logits: true,
            }])?;
            logits.clear();
            logits.extend_from_slice(l.row(0));
        }
        Ok(out)
    }
}
