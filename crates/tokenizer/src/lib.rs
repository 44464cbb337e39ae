//! Tokenizers loaded from a GGUF file's `tokenizer.ggml.*` metadata.
