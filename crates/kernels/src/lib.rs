//! CPU compute kernels (in progress).
