//! Chat: messages as the HTTP APIs carry them, and the model's own chat template
//! (`tokenizer.chat_template`) rendered as Hugging Face transformers renders it.

pub mod builtin;
pub mod format;
pub mod generic;
mod message;
mod output;
mod render;

pub use format::{ChatFormat, FormatError};
pub use message::{Message, MessageError, ToolCall};
pub use output::{Event, OutputFormat, OutputParser, ToolSyntax, has_thinking};
pub use render::{ChatTemplate, MAX_OUTPUT, RenderOptions, TemplateError, civil_date};
