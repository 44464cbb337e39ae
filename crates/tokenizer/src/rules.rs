//! The pre-tokenizer rule sets, keyed by `tokenizer.ggml.pre`, with the per-value
//! vocabulary flags llama.cpp b11434 sets alongside them (`src/llama-vocab.cpp`).
//! The regex strings are llama.cpp's, verbatim; `pretok` decides how each runs.

/// One rule set (a llama.cpp `LLAMA_VOCAB_PRE_TYPE_*`).
pub(crate) struct RuleSet {
    pub name: &'static str,
    pub exprs: &'static [&'static str],
    /// GPT-2 byte-to-unicode encoding of words (false: raw UTF-8, SPM-style BPE).
    pub byte_encode: bool,
}

const LLAMA3_RE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GPT2_RE: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const QWEN2_RE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const DS3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const GPT4O_RE: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINES: &str = "[^\\n]+|[\\n]+";

macro_rules! rs {
    ($name:expr, [$($e:expr),* $(,)?]) => {
        RuleSet { name: $name, exprs: &[$($e),*], byte_encode: true }
    };
    ($name:expr, [$($e:expr),* $(,)?], raw) => {
        RuleSet { name: $name, exprs: &[$($e),*], byte_encode: false }
    };
}

pub(crate) static DEFAULT: RuleSet = rs!(
    "default",
    [
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        GPT2_RE,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ]
);
pub(crate) static LLAMA3: RuleSet = rs!("llama3", [LLAMA3_RE]);
static JAIS2: RuleSet = rs!(
    "jais2",
    [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"
    ]
);
static DEEPSEEK_LLM: RuleSet = rs!(
    "deepseek-llm",
    [
        "[\r\n]",
        "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
        "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
        "\\s+$",
        "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
        "\\p{N}+",
    ]
);
static DEEPSEEK3_LLM: RuleSet = rs!(
    "deepseek3-llm",
    [
        "\\p{N}{1,3}",
        "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
        DS3_MAIN
    ]
);
static SPARK2_5: RuleSet = rs!(
    "spark2_5",
    [
        "\\p{N}{1,3}",
        "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
        "\\p{N}",
    ]
);
static YOUTU: RuleSet = rs!(
    "youtu",
    [
        "[\u{ac00}-\u{d7a3}\u{3131}-\u{318e}]+|[\u{ff01}\u{2026}\u{201c}\u{201d}\u{2018}\u{2019}\u{2014}\u{ff1a}\u{ff1b}\u{ff0c}\u{3001}-\u{303f}\u{fe30}-\u{fe4f}]+|[\u{3105}-\u{312f}]+|[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ]
);
static DEEPSEEK_CODER: RuleSet = rs!(
    "deepseek-coder",
    [
        "[\r\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
        "\\p{N}",
    ]
);
static FALCON: RuleSet = rs!(
    "falcon",
    ["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]"]
);
static STARCODER: RuleSet = rs!("starcoder", ["\\p{N}", GPT2_RE]);
static GPT2: RuleSet = rs!("gpt2", [GPT2_RE]);
static QWEN2: RuleSet = rs!("qwen2", [QWEN2_RE]);
static QWEN35: RuleSet = rs!(
    "qwen35",
    [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    ]
);
static PORO: RuleSet = rs!(
    "poro",
    [" ?[^(\\s|.,!?\u{2026}\u{3002}\u{ff0c}\u{3001}\u{964}\u{6d4}\u{60c})]+"]
);
static CHATGLM4: RuleSet = rs!("chatglm4", [LLAMA3_RE]);
static VIKING: RuleSet = rs!(
    "viking",
    [
        " ?[^(\\s|.,!?\u{2026}\u{3002}\u{ff0c}\u{3001}\u{964}\u{6d4}\u{60c})]+",
        "\\p{N}"
    ]
);
static TEKKEN: RuleSet = rs!(
    "tekken",
    [
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    ]
);
static CHAMELEON: RuleSet = rs!(
    "chameleon",
    [
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]",
        GPT2_RE,
    ]
);
pub(crate) static GPT4O: RuleSet = rs!("gpt-4o", [GPT4O_RE]);
static GRANITE_EMB_MULTI: RuleSet = rs!(
    "granite-embed-multi",
    [
        "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    ]
);
static BAILINGMOE: RuleSet = rs!(
    "bailingmoe",
    [
        "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
    ]
);
static SEED_CODER: RuleSet = rs!(
    "seed-coder",
    [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    ]
);
static UFAKZEKA: RuleSet = rs!(
    "ufakzeka",
    [
        "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
    ]
);
static LAGUNA: RuleSet = rs!("laguna", [NEWLINES, QWEN2_RE]);
static EXAONE_MOE: RuleSet = rs!(
    "exaone-moe",
    [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
    ]
);
pub(crate) static GEMMA4: RuleSet = rs!("gemma4", [NEWLINES], raw);
static SARVAM_MOE: RuleSet = rs!("sarvam-moe", [NEWLINES], raw);
static MINICPM5: RuleSet = rs!(
    "minicpm5",
    [
        "\\p{N}{1,3}",
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ]
);

/// What a `pre` value sets besides its rule set.
#[derive(Clone, Copy, Default)]
pub(crate) struct PreFlags {
    pub clean_spaces_off: bool,
    pub ignore_merges: bool,
    pub escape_whitespaces: bool,
    pub add_sep: bool,
    pub bos_null: bool,
    pub add_bos: bool,
}

const F: PreFlags = PreFlags {
    clean_spaces_off: false,
    ignore_merges: false,
    escape_whitespaces: false,
    add_sep: false,
    bos_null: false,
    add_bos: false,
};
const NC: PreFlags = PreFlags {
    clean_spaces_off: true,
    ..F
};

/// The rule set and flags llama.cpp b11434 uses for a BPE `pre` value; `None` for a
/// value it does not know or that we do not implement.
pub(crate) fn lookup(pre: &str) -> Option<(&'static RuleSet, PreFlags)> {
    let im = |f: PreFlags| PreFlags {
        ignore_merges: true,
        ..f
    };
    Some(match pre {
        "default" => (&DEFAULT, F),
        "minicpm5" => (&MINICPM5, im(F)),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => (
            &LLAMA3,
            PreFlags {
                add_bos: true,
                ..im(F)
            },
        ),
        "deepseek-llm" => (&DEEPSEEK_LLM, NC),
        "deepseek-coder" => (&DEEPSEEK_CODER, NC),
        "deepseek-v3" => (&DEEPSEEK3_LLM, NC),
        "spark2_5" => (&SPARK2_5, NC),
        "youtu" => (&YOUTU, im(NC)),
        "falcon" => (&FALCON, F),
        "mpt" => (&GPT2, F),
        "starcoder" => (&STARCODER, F),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" => (&GPT2, F),
        "jais-2" => (&JAIS2, F),
        "gemma4" | "granite-embed-multi-311m" => (
            &GEMMA4,
            PreFlags {
                escape_whitespaces: true,
                ..F
            },
        ),
        "sarvam-moe" => (
            &SARVAM_MOE,
            PreFlags {
                escape_whitespaces: true,
                ..NC
            },
        ),
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => (&GPT2, PreFlags { add_sep: true, ..F }),
        "refact" => (&STARCODER, F),
        "command-r" => (&STARCODER, NC),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => (&QWEN2, NC),
        "qwen35" => (&QWEN35, NC),
        "stablelm2" => (&QWEN2, F),
        "olmo" => (&GPT2, F),
        "dbrx" | "smaug-bpe" => (&LLAMA3, F),
        "poro-chat" => (&PORO, NC),
        "chatglm-bpe" => (
            &CHATGLM4,
            PreFlags {
                bos_null: true,
                ..F
            },
        ),
        "glm4" | "glm5" => (
            &CHATGLM4,
            PreFlags {
                bos_null: true,
                ignore_merges: true,
                ..F
            },
        ),
        "viking" => (&VIKING, NC),
        "jais" => (&GPT2, F),
        "tekken" => (
            &TEKKEN,
            PreFlags {
                ignore_merges: true,
                add_bos: true,
                ..NC
            },
        ),
        "smollm" => (&STARCODER, NC),
        "codeshell" => (&STARCODER, F),
        "bloom" | "gpt3-finnish" => (&PORO, F),
        "exaone" => (&STARCODER, F),
        "exaone4" => (&GPT2, F),
        "exaone-moe" => (&EXAONE_MOE, F),
        "chameleon" => (
            &CHAMELEON,
            PreFlags {
                add_bos: true,
                ..NC
            },
        ),
        "minerva-7b" => (&STARCODER, F),
        "megrez" => (&QWEN2, F),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => (&GPT4O, NC),
        "minimax-m2" => (&GPT4O, NC),
        "granite-embed-multi-97m" => (&GRANITE_EMB_MULTI, im(NC)),
        "trillion" | "granite-docling" => (&GPT2, NC),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (&BAILINGMOE, NC),
        "seed-coder" => (&SEED_CODER, NC),
        "hunyuan" => (&QWEN2, NC),
        "hunyuan-dense" | "hy_v4" | "joyai-llm" => (&DEEPSEEK3_LLM, NC),
        "ufakzeka" => (&UFAKZEKA, NC),
        "grok-2" => (&QWEN2, NC),
        "laguna" => (&LAGUNA, NC),
        "solar-open" => (&QWEN2, NC),
        "mellum2" => (&STARCODER, F),
        // Known to llama.cpp but not implemented here (custom splitters we have
        // not ported): kimi-k2, afmoe, tiny_aya/cohere2moe, superbpe, mmbert,
        // whitespace.
        _ => return None,
    })
}

/// Every `pre` value `lookup` accepts (for tests and docs).
pub const KNOWN_PRE: &[&str] = &[
    "default",
    "minicpm5",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "falcon",
    "mpt",
    "starcoder",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "jais-2",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "refact",
    "command-r",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "qwen35",
    "stablelm2",
    "olmo",
    "dbrx",
    "smaug-bpe",
    "poro-chat",
    "chatglm-bpe",
    "glm4",
    "glm5",
    "viking",
    "jais",
    "tekken",
    "smollm",
    "codeshell",
    "bloom",
    "gpt3-finnish",
    "exaone",
    "exaone4",
    "exaone-moe",
    "chameleon",
    "minerva-7b",
    "megrez",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
    "granite-embed-multi-97m",
    "trillion",
    "granite-docling",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "ufakzeka",
    "grok-2",
    "laguna",
    "solar-open",
    "mellum2",
];
