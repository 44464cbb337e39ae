//! Loading and validating a vocabulary from `tokenizer.ggml.*` metadata, following
//! llama.cpp b11434 `llama_vocab::impl::load`.

use crate::bpe::Bpe;
use crate::pretok::PreTokenizer;
use crate::strtab::{PieceTable, StrTable, TokenIndex};
use crate::vocab::{TokenType, attr};
use crate::{Kind, SpecialIds, Tokenizer, TokenizerError, decode, rules};
use llamay_gguf::{Metadata, Value, ValueType};
use std::collections::BTreeSet;

fn merr(s: impl Into<String>) -> TokenizerError {
    TokenizerError::Metadata(s.into())
}

fn get_bool(md: &Metadata<'_>, key: &str) -> Result<Option<bool>, TokenizerError> {
    md.get_bool(key).map_err(|e| merr(e.to_string()))
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Attribute bits as the tokenizer stores them (all `attr` bits are below 1 << 16).
fn narrow_attr(a: u32) -> u16 {
    const _: () = assert!(attr::RSTRIP < 1 << 16);
    a as u16
}

pub(crate) fn load(md: &Metadata<'_>) -> Result<Tokenizer, TokenizerError> {
    let str_key = |k: &str| md.get_str(k).map_err(|e| merr(e.to_string()));
    let model = str_key("tokenizer.ggml.model")?
        .ok_or_else(|| merr("missing tokenizer.ggml.model"))?
        .to_string();
    let mut pre = str_key("tokenizer.ggml.pre")?.unwrap_or("").to_string();
    let kind = match model.as_str() {
        "llama" => Kind::Spm,
        "gpt2" | "gemma4" => Kind::Bpe,
        "bert" => Kind::Wpm,
        other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
    };
    if model == "gemma4" {
        pre = "gemma4".to_string();
    }
    let mut warnings = Vec::new();
    // What the loader corrected as llama.cpp does, with no effect on the output: said
    // by `info`, not on every run.
    let mut notes = Vec::new();

    // ---- tokens, scores, types
    let tokens_arr = md
        .get_array("tokenizer.ggml.tokens")
        .map_err(|e| merr(e.to_string()))?
        .ok_or_else(|| merr("missing tokenizer.ggml.tokens"))?;
    let strs = tokens_arr
        .as_strings()
        .ok_or_else(|| merr("tokenizer.ggml.tokens is not an array of strings"))?;
    let n = strs.len();
    if n == 0 {
        return Err(merr("tokenizer.ggml.tokens is empty"));
    }
    if n > i32::MAX as usize {
        return Err(merr("tokenizer.ggml.tokens has more than 2^31-1 entries"));
    }
    let n_bytes: usize = strs.iter().map(|s| s.as_bytes().len()).sum();
    let mut tokens = StrTable::with_capacity(n, n_bytes);
    let mut max_token_len = 0;
    for (i, s) in strs.iter().enumerate() {
        let b = s.as_bytes();
        let pushed = if b.is_empty() {
            warnings.push(format!("empty token at index {i}"));
            let t = format!("[EMPTY_{i}]");
            max_token_len = max_token_len.max(t.len());
            tokens.push(t.as_bytes())
        } else {
            max_token_len = max_token_len.max(b.len());
            tokens.push(b)
        };
        pushed.ok_or_else(|| merr("tokenizer.ggml.tokens holds more than 4 GiB of text"))?;
    }
    tokens.shrink_to_fit();
    let mut scores = vec![0f32; n];
    if let Some(a) = md
        .get_array("tokenizer.ggml.scores")
        .map_err(|e| merr(e.to_string()))?
    {
        if !matches!(a.elem_type(), ValueType::F32 | ValueType::I32) {
            return Err(merr(format!(
                "tokenizer.ggml.scores: expected f32 or i32 elements, found {}",
                a.elem_type()
            )));
        }
        if a.len() != n {
            return Err(merr(format!(
                "tokenizer.ggml.scores has {} entries for {n} tokens",
                a.len()
            )));
        }
        for (i, v) in a.iter().enumerate() {
            let f = match v {
                Value::F32(f) => f,
                Value::I32(x) => x as f32,
                _ => 0.0,
            };
            scores[i] = if f == 0.0 { 0.0 } else { f };
        }
    }
    let mut attrs = vec![attr::NORMAL; n];
    if let Some(a) = md
        .get_array("tokenizer.ggml.token_type")
        .map_err(|e| merr(e.to_string()))?
    {
        if !a.elem_type().is_integer() {
            return Err(merr(format!(
                "tokenizer.ggml.token_type: expected integer elements, found {}",
                a.elem_type()
            )));
        }
        if a.len() != n {
            return Err(merr(format!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                a.len()
            )));
        }
        for (i, v) in a.iter().enumerate() {
            let t = v.as_i64().and_then(TokenType::from_i64);
            attrs[i] = t.map(TokenType::attr).unwrap_or(attr::UNDEFINED);
        }
    }
    for (i, t) in tokens.iter().enumerate() {
        if attrs[i] & attr::BYTE != 0 && decode::parse_byte_token(t).is_none() {
            return Err(merr(format!(
                "token {i} is typed BYTE but its text {:?} is not of the form <0xXX>",
                String::from_utf8_lossy(t)
            )));
        }
    }
    let mut token_to_id = TokenIndex::with_ids_below(n);
    for (i, t) in tokens.iter().enumerate() {
        if token_to_id.insert(&tokens, i as u32).is_err() {
            return Err(merr(format!(
                "duplicate token text {:?} (id {i}); llama.cpp refuses such a vocabulary too",
                String::from_utf8_lossy(t)
            )));
        }
    }

    // ---- per-model defaults
    let mut add_space_prefix = false;
    let mut add_bos = false;
    let mut add_eos = false;
    let mut add_sep = false;
    let mut clean_spaces = false;
    let mut escape_whitespaces = true;
    type Id = Option<i64>;
    let (mut bos, mut eos, mut unk, mut sep, mut pad, mut mask): (Id, Id, Id, Id, Id, Id) =
        (None, None, None, None, None, None);
    let mut pre_known = true;
    let mut rule_name = "spm";
    let mut bpe_rules = None;
    let mut ignore_merges = false;
    match kind {
        Kind::Spm => {
            (bos, eos, unk) = (Some(1), Some(2), Some(0));
            add_space_prefix = true;
            add_bos = true;
        }
        Kind::Wpm => {
            (bos, unk, sep, pad, mask) = (Some(101), Some(100), Some(102), Some(0), Some(103));
            add_bos = true;
            add_sep = true;
            clean_spaces = true;
            rule_name = "wpm";
        }
        Kind::Bpe => {
            if model == "gpt2" {
                (bos, eos) = (Some(11), Some(11));
            }
            clean_spaces = true;
            let (rs, flags) = match rules::lookup(&pre) {
                Some(x) => x,
                None => {
                    pre_known = false;
                    let guess = if pre.is_empty() {
                        &rules::DEFAULT
                    } else {
                        &rules::LLAMA3
                    };
                    warnings.push(format!(
                        "tokenizer.ggml.pre = {:?} names no pre-tokenizer rule set this build implements; tokenising under a guess ({}); ids may differ from the model's training",
                        pre, guess.name
                    ));
                    (guess, rules::PreFlags::default())
                }
            };
            if pre.is_empty() && pre_known {
                pre_known = false;
            }
            if flags.clean_spaces_off {
                clean_spaces = false;
            }
            ignore_merges = flags.ignore_merges;
            escape_whitespaces = flags.escape_whitespaces;
            add_sep |= flags.add_sep;
            add_bos |= flags.add_bos;
            if flags.bos_null {
                bos = None;
            }
            rule_name = rs.name;
            bpe_rules = Some(rs);
        }
    }
    if let Some(v) = get_bool(md, "tokenizer.ggml.add_space_prefix")? {
        add_space_prefix = v;
    }
    let remove_extra_whitespaces =
        get_bool(md, "tokenizer.ggml.remove_extra_whitespaces")?.unwrap_or(false);

    // ---- special ids: defaults out of range are disabled (as llama.cpp does);
    // ids read from the file must be in range.
    let in_range = |v: Option<i64>| v.filter(|&x| usize::try_from(x).is_ok_and(|x| x < n));
    let mut sp = [
        ("tokenizer.ggml.bos_token_id", in_range(bos)),
        ("tokenizer.ggml.eos_token_id", in_range(eos)),
        ("tokenizer.ggml.eot_token_id", None),
        ("tokenizer.ggml.eom_token_id", None),
        ("tokenizer.ggml.unknown_token_id", in_range(unk)),
        ("tokenizer.ggml.seperator_token_id", in_range(sep)),
        ("tokenizer.ggml.padding_token_id", in_range(pad)),
        ("tokenizer.ggml.mask_token_id", in_range(mask)),
        ("tokenizer.ggml.fim_pre_token_id", None),
        ("tokenizer.ggml.fim_suf_token_id", None),
        ("tokenizer.ggml.fim_mid_token_id", None),
        ("tokenizer.ggml.fim_pad_token_id", None),
        ("tokenizer.ggml.fim_rep_token_id", None),
        ("tokenizer.ggml.fim_sep_token_id", None),
    ];
    let deprecated = [
        ("tokenizer.ggml.prefix_token_id", 8usize),
        ("tokenizer.ggml.suffix_token_id", 9),
        ("tokenizer.ggml.middle_token_id", 10),
    ];
    let read_id = |key: &str| -> Result<Option<Option<i64>>, TokenizerError> {
        match md.get(key) {
            None => Ok(None),
            Some(v) => {
                let x = v.as_i64().ok_or_else(|| {
                    merr(format!(
                        "{key}: expected an integer, found {}",
                        v.value_type()
                    ))
                })?;
                if x < 0 {
                    return Ok(Some(None));
                }
                if x as u64 >= n as u64 {
                    return Err(merr(format!(
                        "{key} = {x} is outside the vocabulary ({n} tokens)"
                    )));
                }
                Ok(Some(Some(x)))
            }
        }
    };
    for e in sp.iter_mut() {
        if let Some(v) = read_id(e.0)? {
            e.1 = v;
        }
    }
    for (key, slot) in deprecated {
        if let Some(v) = read_id(key)? {
            sp[slot].1 = v;
        }
    }
    let id = |i: usize| sp[i].1.map(|x| x as u32);
    let mut special = SpecialIds {
        bos: id(0),
        eos: id(1),
        eot: id(2),
        eom: id(3),
        unk: id(4),
        sep: id(5),
        pad: id(6),
        mask: id(7),
        fim_pre: id(8),
        fim_suf: id(9),
        fim_mid: id(10),
        fim_pad: id(11),
        fim_rep: id(12),
        fim_sep: id(13),
    };
    if let Some(v) = get_bool(md, "tokenizer.ggml.add_bos_token")? {
        add_bos = v;
    }
    if let Some(v) = get_bool(md, "tokenizer.ggml.add_eos_token")? {
        add_eos = v;
    }
    if let Some(v) = get_bool(md, "tokenizer.ggml.add_sep_token")? {
        add_sep = v;
    }
    // A cross-encoder's own pair format (`{query}`, `{document}`), where it has one.
    let rerank_template = (md.get_str("tokenizer.chat_template.rerank"))
        .map_err(|e| merr(e.to_string()))?
        .map(str::to_string);
    if rule_name == "gemma4" && !add_bos {
        add_bos = true;
        warnings.push("add_bos_token overridden to true for Gemma 4 (as llama.cpp)".into());
    }
    let lowercase = get_bool(md, "tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
    let strip_accents =
        get_bool(md, "tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);

    // ---- text-detected special tokens (llama.cpp iterates a hash map; we go in id
    // order, which only matters when a vocabulary has two candidates)
    let find = |texts: &[&str]| -> Option<u32> {
        texts
            .iter()
            .filter_map(|s| token_to_id.get(&tokens, s.as_bytes()))
            .min()
    };
    let mark_control = |id: u32, attrs: &mut Vec<u32>, notes: &mut Vec<String>| {
        let a = &mut attrs[id as usize];
        if *a & attr::CONTROL == 0 {
            notes.push(format!(
                "control-looking token {id} {:?} was not control-type; overridden",
                String::from_utf8_lossy(&tokens[id as usize])
            ));
            *a |= attr::CONTROL;
        }
    };
    for (slot, texts) in [
        (&mut special.eot, EOT_TEXTS),
        (&mut special.eom, EOM_TEXTS),
        (&mut special.fim_pre, FIM_PRE_TEXTS),
        (&mut special.fim_suf, FIM_SUF_TEXTS),
        (&mut special.fim_mid, FIM_MID_TEXTS),
        (&mut special.fim_pad, FIM_PAD_TEXTS),
        (&mut special.fim_rep, FIM_REP_TEXTS),
        (&mut special.fim_sep, FIM_SEP_TEXTS),
    ] {
        if slot.is_none()
            && let Some(id) = find(texts)
        {
            *slot = Some(id);
            mark_control(id, &mut attrs, &mut notes);
        }
    }
    for (i, t) in tokens.iter().enumerate() {
        let a = &mut attrs[i];
        if *a & attr::CONTROL != 0
            && *a & attr::UNUSED == 0
            && memchr::memmem::find(t, b"unused").is_some()
        {
            *a |= attr::UNUSED;
        }
    }
    let mut eog = BTreeSet::new();
    eog.extend(special.fim_pad);
    eog.extend(special.fim_rep);
    eog.extend(special.fim_sep);
    for s in EOG_TEXTS {
        if let Some(id) = token_to_id.get(&tokens, s.as_bytes()) {
            eog.insert(id);
            mark_control(id, &mut attrs, &mut notes);
        }
    }
    for s in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = token_to_id.get(&tokens, s.as_bytes()) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend(special.eos);
    eog.extend(special.eot);
    eog.extend(special.eom);
    {
        let text = |id: u32| -> &[u8] { &tokens[id as usize] };
        let has = |s: &str| eog.iter().any(|&i| text(i) == s.as_bytes());
        let end = eog.iter().copied().find(|&i| text(i) == b"<|end|>");
        let drop_end = (has("<|return|>") && (has("<|call|>") || has("<|calls|>")))
            || ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>"));
        let s_id = eog.iter().copied().find(|&i| text(i) == b"</s>");
        let drop_s = has("<|tool_response>") || has("<|plamo:eos|>");
        if let Some(end) = end
            && drop_end
        {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
        if let Some(s_id) = s_id
            && drop_s
        {
            eog.remove(&s_id);
            attrs[s_id as usize] = attr::NORMAL;
        }
    }

    if add_bos && special.bos.is_none() && kind != Kind::Wpm {
        return Err(merr(
            "the vocabulary asks for a BOS token (add_bos_token) but has none",
        ));
    }
    if add_eos && special.eos.is_none() {
        return Err(merr(
            "the vocabulary asks for an EOS token (add_eos_token) but has none",
        ));
    }

    // ---- special-token cache (longest first; ties by id)
    let mut special_cache: Vec<u32> = (0..n as u32)
        .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
        .collect();
    special_cache.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()));

    let mut spm_bytes = [None; 256];
    if kind == Kind::Spm {
        for (b, slot) in spm_bytes.iter_mut().enumerate() {
            *slot = token_to_id
                .get(&tokens, format!("<0x{b:02X}>").as_bytes())
                .or_else(|| token_to_id.get(&tokens, &[b as u8]));
        }
    }

    let mut t = Tokenizer {
        kind,
        model,
        pre,
        pre_known,
        rule_name,
        tokens,
        scores,
        attrs: attrs.into_iter().map(narrow_attr).collect(),
        token_to_id,
        special,
        eog,
        add_bos,
        add_eos,
        add_sep,
        rerank_template,
        add_space_prefix,
        remove_extra_whitespaces,
        clean_spaces,
        escape_whitespaces,
        lowercase,
        strip_accents,
        max_token_len,
        special_cache,
        special_finder: std::sync::OnceLock::new(),
        pieces: PieceTable::default(),
        bpe: None,
        spm_bytes,
        warnings,
        notes,
    };
    t.pieces = PieceTable::build(&t.tokens, |i| decode::piece_for_cache(&t, i));

    // ---- per-model attribute fix-ups (after the piece cache, as llama.cpp)
    let model_name = str_key("general.name")?.unwrap_or("").to_lowercase();
    let arch = str_key("general.architecture")?.unwrap_or("");
    let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
    if contains_any(
        &t.pre,
        &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"],
    ) || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
    {
        if let Some(id) = t.text_to_token(b"<mask>") {
            t.attrs[id as usize] |= narrow_attr(attr::LSTRIP);
        }
    } else if contains_any(&model_name, &["phi-3", "phi3"]) {
        for &id in &t.special_cache {
            t.attrs[id as usize] |= narrow_attr(attr::RSTRIP);
        }
        if let Some(id) = t.text_to_token(b"</s>") {
            t.attrs[id as usize] |= narrow_attr(attr::RSTRIP);
        }
        for s in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(id) = t.text_to_token(s.as_bytes()) {
                t.attrs[id as usize] &= !narrow_attr(attr::RSTRIP);
            }
        }
    } else if contains_any(&model_name, &["modern-bert"])
        && let Some(id) = t.text_to_token(b"[MASK]")
    {
        t.attrs[id as usize] |= narrow_attr(attr::LSTRIP);
    }

    if let Some(rs) = bpe_rules {
        let pretok = PreTokenizer::new(rs.exprs).map_err(|e| {
            merr(format!(
                "pre-tokenizer '{}' could not be built: {e}",
                rs.name
            ))
        })?;
        let merges_arr = md
            .get_array("tokenizer.ggml.merges")
            .map_err(|e| merr(e.to_string()))?
            .ok_or_else(|| merr("missing tokenizer.ggml.merges (required for BPE)"))?;
        let merges = merges_arr
            .as_strings()
            .ok_or_else(|| merr("tokenizer.ggml.merges is not an array of strings"))?;
        let list: Vec<&[u8]> = merges.iter().map(|s| s.as_bytes()).collect();
        let mut bpe = Bpe::new(&t, pretok, rs.byte_encode, &list);
        bpe.ignore_merges = ignore_merges;
        bpe.newline_words_whole = rs.name == "gemma4";
        t.bpe = Some(bpe);
    }
    Ok(t)
}
