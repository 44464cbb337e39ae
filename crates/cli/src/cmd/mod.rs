pub mod dump;
pub mod info;
