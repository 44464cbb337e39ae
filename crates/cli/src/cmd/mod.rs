pub mod dump;
pub mod info;
pub mod quantize;
pub mod tokenize;
