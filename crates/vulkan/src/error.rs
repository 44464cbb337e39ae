//! What can stop the Vulkan device, each with the words a user acts on.

use ash::vk;

#[derive(Debug, thiserror::Error)]
pub enum VulkanError {
    /// The loader library could not be opened: no Vulkan on this machine (or not where
    /// `LLAMAY_VULKAN_LOADER` points).
    #[error("no Vulkan loader: {path} not found ({reason})")]
    NoLoader { path: String, reason: String },
    /// The loader opened but has no device, or none that computes.
    #[error("no Vulkan device: {0}")]
    NoDevice(String),
    /// `vulkan:N` named a device that is not there.
    #[error("no Vulkan device {index}: this machine has {count} (see `llamay version`)")]
    NoSuchDevice { index: usize, count: usize },
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Call {
        call: &'static str,
        result: vk::Result,
    },
    /// A buffer larger than the device allows (one allocation, or its memory).
    #[error("{what} needs {bytes} bytes; the device allows {limit}")]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    /// No memory type with the properties a buffer needs.
    #[error("no memory type for {0}")]
    NoMemoryType(&'static str),
    /// The device declines a weight (its format), naming tensor and reason.
    #[error("tensor '{tensor}': {reason}")]
    Declined { tensor: String, reason: String },
    /// An operation's shapes do not agree (a caller's bug, refused rather than run).
    #[error("shape: {0}")]
    Shape(String),
}

/// `result.map_err` naming the call.
pub(crate) trait Check<T> {
    fn check(self, call: &'static str) -> Result<T, VulkanError>;
}

impl<T> Check<T> for Result<T, vk::Result> {
    fn check(self, call: &'static str) -> Result<T, VulkanError> {
        self.map_err(|result| VulkanError::Call { call, result })
    }
}
