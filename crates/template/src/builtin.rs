//! Built-in chat templates for files without one (`--chat-template NAME`): llama.cpp
//! b11434's built-in formats by the same names, written as Jinja. Each renders the bytes
//! llama.cpp's own formatter writes for the same conversation (tests/builtin.rs, goldens
//! from scripts/gen-builtin-templates).

/// (name, Jinja source), sorted by name.
const TEMPLATES: &[(&str, &str)] = &[
    ("bailing", include_str!("builtin/bailing.jinja")),
    ("bailing-think", include_str!("builtin/bailing-think.jinja")),
    ("bailing2", include_str!("builtin/bailing2.jinja")),
    ("chatglm3", include_str!("builtin/chatglm3.jinja")),
    ("chatglm4", include_str!("builtin/chatglm4.jinja")),
    ("chatml", include_str!("builtin/chatml.jinja")),
    ("command-r", include_str!("builtin/command-r.jinja")),
    ("deepseek", include_str!("builtin/deepseek.jinja")),
    ("deepseek-ocr", include_str!("builtin/deepseek-ocr.jinja")),
    ("deepseek2", include_str!("builtin/deepseek2.jinja")),
    ("deepseek3", include_str!("builtin/deepseek3.jinja")),
    ("exaone-moe", include_str!("builtin/exaone-moe.jinja")),
    ("exaone3", include_str!("builtin/exaone3.jinja")),
    ("exaone4", include_str!("builtin/exaone4.jinja")),
    ("falcon3", include_str!("builtin/falcon3.jinja")),
    ("gemma", include_str!("builtin/gemma.jinja")),
    ("gigachat", include_str!("builtin/gigachat.jinja")),
    ("glmedge", include_str!("builtin/glmedge.jinja")),
    ("gpt-oss", include_str!("builtin/gpt-oss.jinja")),
    ("granite", include_str!("builtin/granite.jinja")),
    ("granite-4.0", include_str!("builtin/granite-4.0.jinja")),
    ("granite-4.1", include_str!("builtin/granite-4.1.jinja")),
    ("grok-2", include_str!("builtin/grok-2.jinja")),
    ("hunyuan-dense", include_str!("builtin/hunyuan-dense.jinja")),
    ("hunyuan-moe", include_str!("builtin/hunyuan-moe.jinja")),
    ("hunyuan-vl", include_str!("builtin/hunyuan-vl.jinja")),
    ("kimi-k2", include_str!("builtin/kimi-k2.jinja")),
    ("llama2", include_str!("builtin/llama2.jinja")),
    ("llama2-sys", include_str!("builtin/llama2-sys.jinja")),
    (
        "llama2-sys-bos",
        include_str!("builtin/llama2-sys-bos.jinja"),
    ),
    (
        "llama2-sys-strip",
        include_str!("builtin/llama2-sys-strip.jinja"),
    ),
    ("llama3", include_str!("builtin/llama3.jinja")),
    ("llama4", include_str!("builtin/llama4.jinja")),
    ("megrez", include_str!("builtin/megrez.jinja")),
    ("minicpm", include_str!("builtin/minicpm.jinja")),
    ("mistral-v1", include_str!("builtin/mistral-v1.jinja")),
    ("mistral-v3", include_str!("builtin/mistral-v3.jinja")),
    (
        "mistral-v3-tekken",
        include_str!("builtin/mistral-v3-tekken.jinja"),
    ),
    ("mistral-v7", include_str!("builtin/mistral-v7.jinja")),
    (
        "mistral-v7-tekken",
        include_str!("builtin/mistral-v7-tekken.jinja"),
    ),
    ("monarch", include_str!("builtin/monarch.jinja")),
    ("openchat", include_str!("builtin/openchat.jinja")),
    ("orion", include_str!("builtin/orion.jinja")),
    (
        "pangu-embedded",
        include_str!("builtin/pangu-embedded.jinja"),
    ),
    ("phi3", include_str!("builtin/phi3.jinja")),
    ("phi4", include_str!("builtin/phi4.jinja")),
    ("rwkv-world", include_str!("builtin/rwkv-world.jinja")),
    ("seed_oss", include_str!("builtin/seed_oss.jinja")),
    ("smolvlm", include_str!("builtin/smolvlm.jinja")),
    ("solar-open", include_str!("builtin/solar-open.jinja")),
    ("vicuna", include_str!("builtin/vicuna.jinja")),
    ("vicuna-orca", include_str!("builtin/vicuna-orca.jinja")),
    ("yandex", include_str!("builtin/yandex.jinja")),
    ("zephyr", include_str!("builtin/zephyr.jinja")),
];

/// Every built-in name.
pub const NAMES: [&str; 54] = {
    let mut names = [""; 54];
    let mut i = 0;
    while i < TEMPLATES.len() {
        names[i] = TEMPLATES[i].0;
        i += 1;
    }
    names
};

/// The template named `name` (as given, or in any case): (its name, its source).
pub fn get(name: &str) -> Option<(&'static str, &'static str)> {
    TEMPLATES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .copied()
}
