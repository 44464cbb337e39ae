//! The seam between the one forward pass (`forward.rs`) and where it runs.
//!
//! `forward::run_layers` is written once, against [`Backend`]: every step of a block —
//! norms, projections, rope, attention over the paged KV cache, the feed-forward
//! network, residual adds, the output head — is one call on it, over activation
//! buffers of the backend's own type (`Act`: host `Vec<f32>` on the CPU, a device
//! buffer on a GPU). A backend is a type that implements those calls; the pass is
//! generic over it, so the CPU's implementation (`cpu::Cpu`) compiles to the same
//! calls the pass made before the seam existed, with nothing dynamic in between.
//!
//! What stays on the host whatever the backend: validation of the batch, the KV pool's
//! books (which page holds which positions, reference counts, copy on write decided by
//! `KvPool::reserve`), rope angles (computed once per step from positions), the
//! embedding rows, sampling. What crosses the seam per step: the embedding rows in,
//! the step's KV targets and rope angles in, the asked-for rows (logits or hidden
//! states) out.

use crate::arch::NormKind;
use crate::weights::{HeadNorm, Layer, Linear, Norm};

/// Activation rows and the operations of a block over them.
pub(crate) trait Backend {
    /// Rows of f32 values where this backend computes: empty by default, sized by
    /// the operation that writes it (every value overwritten).
    type Act: Default;

    /// Most rows the output head computes at once (the forward pass runs it in runs of
    /// this many: a device's buffer for one run's logits has a size limit).
    const HEAD_ROWS: usize;

    /// `x = rows` (host values: the batch's embedding rows).
    fn load(&mut self, rows: Vec<f32>, x: &mut Self::Act);

    /// Normalises every `cols`-long row of `x` in place.
    fn norm(&mut self, x: &mut Self::Act, norm: &Norm, kind: NormKind, eps: f32, cols: usize);

    /// `out = norm(x)` row by row (a copy where there is no norm).
    #[allow(clippy::too_many_arguments)]
    fn norm_into(
        &mut self,
        x: &Self::Act,
        out: &mut Self::Act,
        norm: Option<&Norm>,
        kind: NormKind,
        eps: f32,
        cols: usize,
    );

    /// RMS-normalises every `cols`-long row of `x` by `w` (the post-norms).
    fn rms(&mut self, x: &mut Self::Act, w: &[f32], eps: f32, cols: usize);

    /// Normalises every head (`hd`-long row) of Q or K.
    fn head_norm(&mut self, x: &mut Self::Act, n: &HeadNorm, eps: f32, hd: usize);

    /// `outs[i] = W_i x + b_i` for projections that read the same input.
    fn linears(&mut self, ls: &[&Linear<'_>], x: &Self::Act, outs: &mut [&mut Self::Act]);

    /// Rotates each `hd`-long head of every `dim`-long token row of `x` by the step's
    /// angles (the sliding-window layers' own where they have them).
    fn rope(&mut self, x: &mut Self::Act, dim: usize, swa: bool);

    /// Writes the batch's keys and values of layer `il` into its sequences' pages and
    /// computes attention of every query over its sequence's cache into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        il: usize,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        swa: bool,
        sinks: Option<&[f32]>,
        out: &mut Self::Act,
    );

    /// `x += y`, or `x += y + z` (llama.cpp's order for a parallel residual).
    fn add(&mut self, x: &mut Self::Act, y: &Self::Act, z: Option<&Self::Act>);

    /// `out = ffn(h)` for the rows of `h`: the layer's dense network or mixture, then
    /// its post-FFN norm.
    fn ffn(&mut self, layer: &Layer<'_>, h: &Self::Act, out: &mut Self::Act);

    /// Rows `index[run]` of `x` (`cols` values each), in that order (the step's whole
    /// `index` is what a device uploaded at its start).
    fn gather(
        &mut self,
        x: &Self::Act,
        index: &[usize],
        run: std::ops::Range<usize>,
        cols: usize,
        out: &mut Self::Act,
    );

    /// `x ↦ c·tanh(x/c)` on every value.
    fn softcap(&mut self, x: &mut Self::Act, c: f32);

    /// The values of `x` on the host (the CPU hands its buffer over).
    fn read(&mut self, x: &mut Self::Act) -> Vec<f32>;
}
