pub mod coverage;
pub mod dump;
pub mod info;
pub mod perplexity;
pub mod quantize;
pub mod run;
pub mod tokenize;
pub mod version;
