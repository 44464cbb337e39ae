pub mod dump;
pub mod info;
pub mod quantize;
