//! Shared by the tokenizer tests.

/// The vocabularies llama.cpp b11434 runs its tokenizer test pairs for
/// (tests/CMakeLists.txt); `models/ggml-vocab-<name>.gguf` in the reference tree.
pub const VOCABS: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];
