//! `--json`, `--json-schema FILE`, `--grammar FILE` (run and chat): the grammar every
//! answer is sampled under, bound to the model's vocabulary.

use anyhow::{Context, bail};
use llamay_engine::grammar::{Constraint, Rules, TokenTrie};
use llamay_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args, Clone, Default)]
pub struct ConstraintArgs {
    /// Constrain the output to one JSON value.
    #[arg(long, conflicts_with_all = ["json_schema", "grammar"])]
    pub json: bool,
    /// Constrain the output to JSON valid under this JSON Schema file.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to this GBNF grammar file (llama.cpp's format).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

/// A grammar bound to a vocabulary; `start()` gives a fresh constraint per answer.
pub struct Bound {
    rules: Arc<Rules>,
    trie: Arc<TokenTrie>,
}

impl Bound {
    pub fn start(&self) -> Constraint {
        Constraint::new(self.rules.clone(), self.trie.clone())
    }
}

impl ConstraintArgs {
    /// The grammar the flags ask for, or `None`.
    pub fn rules(&self) -> anyhow::Result<Option<Arc<Rules>>> {
        if self.json {
            return Ok(Some(Rules::json()));
        }
        if let Some(f) = &self.json_schema {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("--json-schema {}", f.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {}: not JSON", f.display()))?;
            return Ok(Some(
                Rules::json_schema(&schema)
                    .with_context(|| format!("--json-schema {}", f.display()))?,
            ));
        }
        if let Some(f) = &self.grammar {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("--grammar {}", f.display()))?;
            return Ok(Some(
                Rules::gbnf(&text).with_context(|| format!("--grammar {}", f.display()))?,
            ));
        }
        Ok(None)
    }
}

impl Bound {
    /// `rules` bound to `tok`'s vocabulary.
    pub fn new(rules: Arc<Rules>, tok: &Tokenizer) -> anyhow::Result<Self> {
        let (pieces, eog) = tok.grammar_vocabulary();
        if eog.is_empty() {
            bail!(
                "the vocabulary has no end-of-generation token, so a constrained answer could never end"
            );
        }
        let trie = Arc::new(TokenTrie::new(&pieces, &eog));
        Ok(Bound { rules, trie })
    }
}
