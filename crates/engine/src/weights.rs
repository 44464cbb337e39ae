//! Strict binding: every tensor in the file is bound to a slot of the architecture's
//! tensor-name map, or the load fails naming it; every required slot is filled, or the
//! load fails naming it; every shape is checked against the config.

use crate::LoadError;
use crate::arch::{FfnKind, NormKind, Output, ParallelNorms, QkNorm, QkvLayout, Residual, Sinks};
use crate::config::{Config, MoeConfig, Pooling};
use crate::rope::RopeFactors;
use crate::tensor::{Matrix, vector};
use llamay_gguf::{Model as Gguf, TensorInfo};
use llamay_kernels::{PackedMatrix, ThreadPool};
use std::collections::HashSet;

/// A normalisation's parameters (bias only for LayerNorm).
#[derive(Clone, Debug)]
pub struct Norm {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

/// A projection with an optional bias.
#[derive(Clone, Debug)]
pub struct Linear<'a> {
    pub w: Matrix<'a>,
    pub b: Option<Vec<f32>>,
    /// `w` repacked for the packed kernels (AVX-512 VNNI), when the load packed it;
    /// then `w`'s bytes are no longer read by matmuls.
    pub packed: Option<PackedMatrix>,
    /// The start of the weights a decode step multiplies by next, as (address, bytes):
    /// idle workers prefetch it while the step does the work between the two (see
    /// `ThreadPool::prefetch_while_idle`). An address, not a borrow: it points into
    /// another projection of the same model, and is only ever prefetched.
    pub then: Option<(usize, usize)>,
    /// For one expert's rows of a stacked expert tensor: (expert, experts in the
    /// tensor), what an activation observer files them under.
    pub expert: Option<(usize, usize)>,
}

impl<'a> Linear<'a> {
    fn new(w: Matrix<'a>, b: Option<Vec<f32>>) -> Self {
        Linear {
            w,
            b,
            packed: None,
            then: None,
            expert: None,
        }
    }

    /// The bytes a matmul by this projection reads.
    fn weight_bytes(&self) -> &[u8] {
        self.packed
            .as_ref()
            .map_or(self.w.data, PackedMatrix::bytes)
    }
}

/// How much of the next matrix idle workers prefetch: about what a core's L2 holds
/// beside its own work, and more than the memory bus can bring in during the gaps of
/// a decode step (tens of microseconds at ~10 GB/s per core).
const THEN_BYTES: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct Layer<'a> {
    /// The norm attention reads through (Falcon 40B's `attn_norm_2`); none in a
    /// post-norm block.
    pub attn_norm: Option<Norm>,
    pub q: Linear<'a>,
    pub k: Linear<'a>,
    pub v: Linear<'a>,
    pub q_norm: Option<HeadNorm>,
    pub k_norm: Option<HeadNorm>,
    pub attn_out: Linear<'a>,
    /// Attention sinks: one logit per head (gpt-oss).
    pub attn_sinks: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_input: FfnInput,
    pub ffn: Ffn<'a>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A norm over each head of Q or K (`head_dim`-long rows).
#[derive(Clone, Debug)]
pub struct HeadNorm {
    pub kind: NormKind,
    /// `head_dim` values shared by every head, or `head_dim` per head, head after head.
    pub weight: Vec<f32>,
    pub per_head: bool,
}

/// What a layer's feed-forward network reads (decided at bind time from the
/// architecture row and, where llama.cpp does, from the tensors the layer has).
#[derive(Clone, Debug)]
pub enum FfnInput {
    /// `norm(x + attn)`: a sequential block.
    AfterAttention(Norm),
    /// `norm(x)`, beside attention (GPT-NeoX's `ffn_norm`, Falcon 40B's `attn_norm`).
    Parallel(Norm),
    /// Attention's own normalised input (Phi-2, Falcon 7B, StableLM 2 12B).
    ParallelShared,
    /// A post-norm block (BERT): `x = attn(x) + x` normalised by `attn_out`, read as
    /// it is; the network's output joins it and `out` normalises the sum.
    PostNorm { attn_out: Norm, out: Norm },
}

/// A dense feed-forward network: down(act(gate x) * up x), or down(act(up x)) without
/// a gate.
#[derive(Clone, Debug)]
pub struct DenseFfn<'a> {
    pub gate: Option<Linear<'a>>,
    pub up: Linear<'a>,
    pub down: Linear<'a>,
}

/// A cross-encoder's classification head (llama.cpp's rank pooling): the pooled state
/// through `cls` and tanh where the file has it, then `cls.output` where it has that.
#[derive(Clone, Debug)]
pub struct Classifier<'a> {
    pub dense: Option<Linear<'a>>,
    pub out: Option<Linear<'a>>,
}

/// A mixture of experts (see `config::MoeConfig`).
#[derive(Clone, Debug)]
pub struct MoeFfn<'a> {
    pub config: MoeConfig,
    /// `ffn_gate_inp`: one logit per expert.
    pub router: Linear<'a>,
    /// Expert `i`: rows of the stacked `ffn_{gate,up,down}_exps` tensors (zero copy).
    pub experts: Vec<DenseFfn<'a>>,
    pub shared: Option<SharedExpert<'a>>,
}

/// Qwen2-MoE's shared expert, weighted by sigmoid(gate_inp · x).
#[derive(Clone, Debug)]
pub struct SharedExpert<'a> {
    pub gate_inp: Vec<f32>,
    /// The gate's tensor name (what an activation observer files its input under).
    pub gate_inp_name: String,
    pub ffn: DenseFfn<'a>,
}

/// A layer's feed-forward network. (One per layer, built once at load: the variants'
/// sizes do not matter.)
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Ffn<'a> {
    Dense(DenseFfn<'a>),
    Moe(MoeFfn<'a>),
}

impl<'a> DenseFfn<'a> {
    fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear<'a>> {
        [&mut self.up, &mut self.down]
            .into_iter()
            .chain(self.gate.as_mut())
    }

    fn linears(&self) -> impl Iterator<Item = &Linear<'a>> {
        [&self.up, &self.down].into_iter().chain(self.gate.as_ref())
    }
}

impl<'a> Ffn<'a> {
    /// Every projection of the network, experts and router included.
    fn linears_mut(&mut self) -> Vec<&mut Linear<'a>> {
        match self {
            Ffn::Dense(d) => d.linears_mut().collect(),
            Ffn::Moe(m) => {
                let shared = m.shared.as_mut().map(|s| &mut s.ffn);
                std::iter::once(&mut m.router)
                    .chain(
                        m.experts
                            .iter_mut()
                            .chain(shared)
                            .flat_map(DenseFfn::linears_mut),
                    )
                    .collect()
            }
        }
    }

    fn linears(&self) -> Vec<&Linear<'a>> {
        match self {
            Ffn::Dense(d) => d.linears().collect(),
            Ffn::Moe(m) => {
                let shared = m.shared.as_ref().map(|s| &s.ffn);
                std::iter::once(&m.router)
                    .chain(m.experts.iter().chain(shared).flat_map(DenseFfn::linears))
                    .collect()
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Weights<'a> {
    pub token_embd: Matrix<'a>,
    pub position_embd: Option<Matrix<'a>>,
    /// An encoder's token-type embeddings (`token_types`: one row per type; every
    /// token is type 0 here, as llama.cpp feeds them) and the LayerNorm after the
    /// input sum (`token_embd_norm`).
    pub token_types: Option<Matrix<'a>>,
    pub embd_norm: Option<Norm>,
    /// None for an encoder (its states are the product).
    pub output_norm: Option<Norm>,
    /// An encoder's classification head, where the file has one (a reranker).
    pub classifier: Option<Classifier<'a>>,
    /// The output projection: `output.weight`, or the token embeddings when tied.
    pub output: Linear<'a>,
    pub rope_factors: RopeFactors,
    pub layers: Vec<Layer<'a>>,
}

/// Looks tensors up by name and records which were bound.
struct Binder<'g, 'a> {
    gguf: &'g Gguf<'a>,
    bound: HashSet<String>,
    /// Whether 1-D weights are read (dequantised); a check binds and validates shapes
    /// and types only, touching no tensor data.
    read: ReadData,
}

/// Whether binding reads the small 1-D weights or only checks them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ReadData {
    Yes,
    ShapesOnly,
}

impl<'a> Binder<'_, 'a> {
    fn get(&mut self, name: &str) -> Option<&TensorInfo<'a>> {
        let t = self.gguf.tensor(name)?;
        self.bound.insert(name.to_string());
        Some(t)
    }

    fn require(&mut self, name: &str) -> Result<&TensorInfo<'a>, LoadError> {
        self.get(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))
    }

    fn matrix(&mut self, name: &str, cols: usize, rows: usize) -> Result<Matrix<'a>, LoadError> {
        let t = self.require(name)?.clone();
        if self.read == ReadData::Yes && t.data.len() as u64 != t.n_bytes {
            return Err(LoadError::Shape(format!(
                "tensor '{}': the file's data is not here (a header-only read)",
                t.name
            )));
        }
        Matrix::from_tensor(&t, cols, rows)
    }

    fn opt_vector(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>, LoadError> {
        match self.get(name).cloned() {
            Some(t) => vector(&t, len, self.read == ReadData::Yes).map(Some),
            None => Ok(None),
        }
    }

    /// `rope_freqs.weight` (one set), or LongRoPE's `rope_factors_long/short.weight`
    /// (both or neither), `len` values each; one kind per file.
    fn rope_factors(&mut self, len: usize) -> Result<RopeFactors, LoadError> {
        let fixed = self.opt_vector("rope_freqs.weight", len)?;
        let long = self.opt_vector("rope_factors_long.weight", len)?;
        let short = self.opt_vector("rope_factors_short.weight", len)?;
        match (fixed, long, short) {
            (None, None, None) => Ok(RopeFactors::None),
            (Some(f), None, None) => Ok(RopeFactors::Fixed(f)),
            (None, Some(long), Some(short)) => Ok(RopeFactors::LongShort { long, short }),
            (None, Some(_), None) => Err(LoadError::MissingTensor("rope_factors_short.weight".into())),
            (None, None, Some(_)) => Err(LoadError::MissingTensor("rope_factors_long.weight".into())),
            (Some(_), _, _) => Err(LoadError::Shape(
                "the file has both rope_freqs.weight and LongRoPE's rope_factors_long/short.weight; a model has one kind of rope factors".into(),
            )),
        }
    }

    /// A stacked 3-D tensor `name` of shape [cols, rows, n] as `n` matrices (zero copy).
    fn stacked(
        &mut self,
        name: &str,
        cols: usize,
        rows: usize,
        n: usize,
    ) -> Result<Vec<Matrix<'a>>, LoadError> {
        let t = self.require(name)?.clone();
        let want = [cols as u64, rows as u64, n as u64];
        if t.shape != want {
            return Err(LoadError::Shape(format!(
                "tensor '{name}' has shape {:?}, expected {want:?}",
                t.shape
            )));
        }
        let all = self.matrix(name, cols, rows * n)?;
        Ok((0..n)
            .map(|i| all.rows_slice(i * rows..(i + 1) * rows))
            .collect())
    }

    /// A stacked bias `name` of shape [rows, n]: one `rows`-long bias per expert.
    fn stacked_bias(
        &mut self,
        name: &str,
        rows: usize,
        n: usize,
    ) -> Result<Vec<Option<Vec<f32>>>, LoadError> {
        let shape = self.require(name)?.shape.clone();
        if shape != [rows as u64, n as u64] {
            return Err(LoadError::Shape(format!(
                "tensor '{name}' has shape {shape:?}, expected [{rows}, {n}]"
            )));
        }
        let all = Some(self.vector(name, rows * n)?);
        Ok((0..n)
            .map(|i| split_bias(&all, i * rows..(i + 1) * rows))
            .collect())
    }

    /// A layer's dense feed-forward network (`ffn_gate`, `ffn_up`, `ffn_down`).
    fn dense_ffn(
        &mut self,
        il: usize,
        kind: FfnKind,
        e: usize,
        n_ff: usize,
    ) -> Result<DenseFfn<'a>, LoadError> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let (gate, up) = match kind {
            FfnKind::SwiGlu | FfnKind::GeGlu | FfnKind::SwiGluOai => (
                Some(self.linear(&p("ffn_gate"), e, n_ff)?),
                self.linear(&p("ffn_up"), e, n_ff)?,
            ),
            FfnKind::Gelu => (None, self.linear(&p("ffn_up"), e, n_ff)?),
            FfnKind::SwiGluStacked => {
                let up = self.linear(&p("ffn_up"), e, 2 * n_ff)?;
                let n = n_ff;
                (
                    Some(Linear::new(up.w.rows_slice(0..n), split_bias(&up.b, 0..n))),
                    Linear::new(up.w.rows_slice(n..2 * n), split_bias(&up.b, n..2 * n)),
                )
            }
        };
        let down = self.linear(&p("ffn_down"), n_ff, e)?;
        Ok(DenseFfn { gate, up, down })
    }

    /// A layer's mixture of experts: the router, the stacked experts, the shared expert.
    fn moe(&mut self, il: usize, n_embd: usize, m: &MoeConfig) -> Result<MoeFfn<'a>, LoadError> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let (e, ff, n) = (n_embd, m.n_ff_exp, m.n_expert);
        // Biases where the row has them, required then (gpt-oss); elsewhere llama.cpp's
        // loaders have none, so one in the file is unbound and refused.
        let biased = m.spec.biases;
        let router_b = biased
            .then(|| self.vector(&p("ffn_gate_inp.bias"), n))
            .transpose()?;
        let router = Linear::new(self.matrix(&p("ffn_gate_inp.weight"), e, n)?, router_b);
        let stacked =
            |b: &mut Self, s: &str, cols, rows| {
                let ws = b.stacked(&p(&format!("{s}.weight")), cols, rows, n)?;
                let bs = match biased {
                    true => b.stacked_bias(&p(&format!("{s}.bias")), rows, n)?,
                    false => vec![None; n],
                };
                Ok::<_, LoadError>(ws.into_iter().zip(bs).enumerate().map(move |(i, (w, b))| {
                    Linear {
                        expert: Some((i, n)),
                        ..Linear::new(w, b)
                    }
                }))
            };
        let gates = stacked(self, "ffn_gate_exps", e, ff)?;
        let ups = stacked(self, "ffn_up_exps", e, ff)?;
        let downs = stacked(self, "ffn_down_exps", ff, e)?;
        let experts = (gates.zip(ups).zip(downs))
            .map(|((gate, up), down)| DenseFfn {
                gate: Some(gate),
                up,
                down,
            })
            .collect();
        let shared = if m.spec.shared_expert {
            let sf = m.n_ff_shexp;
            let matrix = |b: &mut Self, s: &str, cols, rows| -> Result<Linear<'a>, LoadError> {
                Ok(Linear::new(b.matrix(&p(s), cols, rows)?, None))
            };
            Some(SharedExpert {
                gate_inp: self.vector(&p("ffn_gate_inp_shexp.weight"), e)?,
                gate_inp_name: p("ffn_gate_inp_shexp.weight"),
                ffn: DenseFfn {
                    gate: Some(matrix(self, "ffn_gate_shexp.weight", e, sf)?),
                    up: matrix(self, "ffn_up_shexp.weight", e, sf)?,
                    down: matrix(self, "ffn_down_shexp.weight", sf, e)?,
                },
            })
        } else {
            None
        };
        Ok(MoeFfn {
            config: *m,
            router,
            experts,
            shared,
        })
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        let t = self.require(name)?.clone();
        vector(&t, len, self.read == ReadData::Yes)
    }

    /// A norm whose `prefix.weight` may be absent (then so must its bias be).
    fn opt_norm(
        &mut self,
        prefix: &str,
        kind: NormKind,
        len: usize,
    ) -> Result<Option<Norm>, LoadError> {
        if self.gguf.tensor(&format!("{prefix}.weight")).is_some() {
            return self.norm(prefix, kind, len).map(Some);
        }
        Ok(None)
    }

    /// A layer's Q, K and V projections (`dims` rows each), as `layout` allows.
    fn qkv(
        &mut self,
        il: usize,
        layout: QkvLayout,
        e: usize,
        [qd, kd, vd]: [usize; 3],
    ) -> Result<(Linear<'a>, Linear<'a>, Linear<'a>), LoadError> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let fused = layout == QkvLayout::Fused || self.gguf.tensor(&p("attn_qkv.weight")).is_some();
        if !fused {
            return Ok((
                self.linear(&p("attn_q"), e, qd)?,
                self.linear(&p("attn_k"), e, kd)?,
                self.linear(&p("attn_v"), e, vd)?,
            ));
        }
        let fused = self.linear(&p("attn_qkv"), e, qd + kd + vd)?;
        let ranges = [0..qd, qd..qd + kd, qd + kd..qd + kd + vd];
        let biases: Vec<Option<Vec<f32>>> = match (&fused.b, layout) {
            (Some(_), _) => ranges
                .iter()
                .map(|r| split_bias(&fused.b, r.clone()))
                .collect(),
            // Legacy files: a fused weight beside separate biases, which llama.cpp adds
            // only when all three are there (one or two would be loaded and ignored:
            // refused here instead).
            (None, QkvLayout::FusedOrSeparate) => {
                let mut bs = Vec::with_capacity(3);
                for (r, name) in ranges.iter().zip(["attn_q", "attn_k", "attn_v"]) {
                    bs.push(self.opt_vector(&format!("{}.bias", p(name)), r.len())?);
                }
                let n = bs.iter().filter(|b| b.is_some()).count();
                if n != 0 && n != 3 {
                    return Err(LoadError::Shape(format!(
                        "blk.{il} has a fused attn_qkv.weight with {n} of the three separate attn_{{q,k,v}}.bias tensors: all three or none"
                    )));
                }
                bs
            }
            (None, QkvLayout::Fused) => vec![None, None, None],
        };
        let mut parts = ranges
            .into_iter()
            .zip(biases)
            .map(|(r, b)| Linear::new(fused.w.rows_slice(r), b));
        let (Some(q), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
            unreachable!("three ranges");
        };
        Ok((q, k, v))
    }

    /// A layer's per-head Q and K norms, as the row says.
    fn qk_norms(
        &mut self,
        il: usize,
        rule: QkNorm,
        cfg: &Config,
    ) -> Result<(Option<HeadNorm>, Option<HeadNorm>), LoadError> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let hd = cfg.head_dim_k;
        Ok(match rule {
            QkNorm::None => (None, None),
            QkNorm::SharedRms => {
                let norm = |weight| HeadNorm {
                    kind: NormKind::Rms,
                    weight,
                    per_head: false,
                };
                (
                    Some(norm(self.vector(&p("attn_q_norm.weight"), hd)?)),
                    Some(norm(self.vector(&p("attn_k_norm.weight"), hd)?)),
                )
            }
            QkNorm::PerHeadLayerIfPresent => {
                let q = self.opt_vector(&p("attn_q_norm.weight"), hd * cfg.n_head)?;
                let k = self.opt_vector(&p("attn_k_norm.weight"), hd * cfg.n_head_kv)?;
                let norm = |weight| HeadNorm {
                    kind: NormKind::Layer,
                    weight,
                    per_head: true,
                };
                (q.map(norm), k.map(norm))
            }
        })
    }

    fn norm(&mut self, prefix: &str, kind: NormKind, len: usize) -> Result<Norm, LoadError> {
        let weight = self.vector(&format!("{prefix}.weight"), len)?;
        let bias = match kind {
            NormKind::Layer => self.opt_vector(&format!("{prefix}.bias"), len)?,
            NormKind::Rms => None,
        };
        Ok(Norm { weight, bias })
    }

    /// A projection `prefix.weight` with an optional `prefix.bias`.
    fn linear(&mut self, prefix: &str, cols: usize, rows: usize) -> Result<Linear<'a>, LoadError> {
        let w = self.matrix(&format!("{prefix}.weight"), cols, rows)?;
        let b = self.opt_vector(&format!("{prefix}.bias"), rows)?;
        Ok(Linear::new(w, b))
    }
}

/// Rows `r` of a stacked projection's bias. A shapes-only check binds biases without
/// their values (empty vectors, see [`ReadData`]): their parts are empty too. A read
/// bias has exactly the stacked projection's rows (checked by `vector`), so `r` is in it.
fn split_bias(b: &Option<Vec<f32>>, r: std::ops::Range<usize>) -> Option<Vec<f32>> {
    b.as_ref()
        .map(|b| b.get(r).map(<[f32]>::to_vec).unwrap_or_default())
}

impl<'a> Weights<'a> {
    pub fn bind(cfg: &Config, gguf: &Gguf<'a>, read: ReadData) -> Result<Weights<'a>, LoadError> {
        let arch = cfg.arch;
        let mut b = Binder {
            gguf,
            bound: HashSet::new(),
            read,
        };
        let e = cfg.n_embd;
        let token_embd = b.matrix("token_embd.weight", e, cfg.n_vocab)?;
        let position_embd = if arch.learned_positions {
            // One row per trained position, as llama.cpp creates it ({n_embd, n_ctx_train}).
            Some(b.matrix("position_embd.weight", e, cfg.n_ctx_train)?)
        } else {
            None
        };
        let encoder = arch.output == Output::Embeddings;
        let (token_types, embd_norm) = if encoder {
            // Optional, as llama.cpp's loader has it (its converter always writes it).
            let n_types = (b.gguf.tensor("token_types.weight"))
                .map(|t| (t.n_elements / (e as u64).max(1)).max(1) as usize);
            (
                n_types
                    .map(|n| b.matrix("token_types.weight", e, n))
                    .transpose()?,
                Some(b.norm("token_embd_norm", arch.norm, e)?),
            )
        } else {
            (None, None)
        };
        let output_norm = if encoder {
            None
        } else {
            Some(b.norm("output_norm", arch.norm, e)?)
        };
        let classifier = if encoder {
            let opt_linear = |b: &mut Binder<'_, 'a>, name: &str, rows| match b
                .gguf
                .tensor(&format!("{name}.weight"))
            {
                Some(_) => b.linear(name, e, rows).map(Some),
                None => Ok(None),
            };
            let dense = opt_linear(&mut b, "cls", e)?;
            let out = opt_linear(&mut b, "cls.output", cfg.n_cls_out)?;
            (dense.is_some() || out.is_some()).then_some(Classifier { dense, out })
        } else {
            None
        };
        if cfg.pooling == Pooling::Rank && classifier.is_none() {
            return Err(LoadError::Unsupported(format!(
                "{}.pooling_type is 4 (rank), but the file has no classification head (cls or cls.output tensors) to score with",
                arch.name
            )));
        }
        // An encoder has no output projection: the tied embeddings stand in (never
        // read; `Context::decode` refuses it).
        let untied = if encoder {
            None
        } else {
            b.get("output.weight").cloned()
        };
        let output = match untied {
            Some(t) => Linear::new(
                Matrix::from_tensor(&t, e, cfg.n_vocab)?,
                b.opt_vector("output.bias", cfg.n_vocab)?,
            ),
            None => Linear::new(token_embd, None),
        };
        let rope_factors = b.rope_factors(cfg.n_rot / 2)?;

        let (qd, kd, vd) = (cfg.q_dim(), cfg.k_dim(), cfg.v_dim());
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let p = |s: &str| format!("blk.{il}.{s}");
            let attn_norm = match arch.residual {
                Residual::PostNorm => None,
                _ => Some(b.norm(&p("attn_norm"), arch.norm, e)?),
            };
            let (q, k, v) = b.qkv(il, arch.qkv, e, [qd, kd, vd])?;
            let (q_norm, k_norm) = b.qk_norms(il, arch.qk_norm, cfg)?;
            let attn_out = b.linear(&p("attn_output"), cfg.n_head * cfg.head_dim_v, e)?;
            let attn_sinks = (arch.attention.sinks == Sinks::PerHead)
                .then(|| b.vector(&p("attn_sinks.weight"), cfg.n_head))
                .transpose()?;
            let post_attn_norm = if arch.post_norms {
                Some(b.vector(&p("post_attention_norm.weight"), e)?)
            } else {
                None
            };
            let (attn_norm, ffn_input) = match arch.residual {
                Residual::Sequential => {
                    let n = b.norm(&p(arch.ffn_norm), arch.norm, e)?;
                    (attn_norm, FfnInput::AfterAttention(n))
                }
                Residual::SequentialIfFfnNorm => match b.opt_norm(&p("ffn_norm"), arch.norm, e)? {
                    Some(n) => (attn_norm, FfnInput::AfterAttention(n)),
                    None => (attn_norm, FfnInput::ParallelShared),
                },
                Residual::Parallel(ParallelNorms::Shared) => (attn_norm, FfnInput::ParallelShared),
                Residual::Parallel(ParallelNorms::Separate) => {
                    let n = b.norm(&p("ffn_norm"), arch.norm, e)?;
                    (attn_norm, FfnInput::Parallel(n))
                }
                Residual::Parallel(ParallelNorms::SharedUnlessAttnNorm2) => {
                    match (b.opt_norm(&p("attn_norm_2"), arch.norm, e)?, attn_norm) {
                        (Some(n2), Some(n)) => (Some(n2), FfnInput::Parallel(n)),
                        (_, n) => (n, FfnInput::ParallelShared),
                    }
                }
                Residual::PostNorm => {
                    let attn_out = b.norm(&p("attn_output_norm"), arch.norm, e)?;
                    let out = b.norm(&p("layer_output_norm"), arch.norm, e)?;
                    (attn_norm, FfnInput::PostNorm { attn_out, out })
                }
            };
            let ffn = match &cfg.moe {
                Some(m) => Ffn::Moe(b.moe(il, e, m)?),
                None => Ffn::Dense(b.dense_ffn(il, arch.ffn, e, cfg.n_ff)?),
            };
            let post_ffn_norm = if arch.post_norms {
                Some(b.vector(&p("post_ffw_norm.weight"), e)?)
            } else {
                None
            };
            layers.push(Layer {
                attn_norm,
                q,
                k,
                v,
                q_norm,
                k_norm,
                attn_out,
                attn_sinks,
                post_attn_norm,
                ffn_input,
                ffn,
                post_ffn_norm,
            });
        }

        let unbound: Vec<String> = gguf
            .tensors()
            .filter(|t| !b.bound.contains(t.name))
            .map(|t| t.name.to_string())
            .collect();
        if !unbound.is_empty() {
            return Err(LoadError::Unbound {
                arch: arch.name,
                names: unbound,
            });
        }
        Ok(Weights {
            token_embd,
            position_embd,
            token_types,
            embd_norm,
            output_norm,
            classifier,
            output,
            rope_factors,
            layers,
        })
    }
}

impl<'a> Weights<'a> {
    /// Every projection, mutably: what `pack` walks.
    fn linears_mut(&mut self) -> impl Iterator<Item = &mut Linear<'a>> {
        let layers = self.layers.iter_mut().flat_map(|l| {
            [&mut l.q, &mut l.k, &mut l.v, &mut l.attn_out]
                .into_iter()
                .chain(l.ffn.linears_mut())
        });
        let head =
            (self.classifier.iter_mut()).flat_map(|c| c.dense.iter_mut().chain(c.out.iter_mut()));
        std::iter::once(&mut self.output).chain(layers).chain(head)
    }

    /// Every projection.
    pub fn linears(&self) -> impl Iterator<Item = &Linear<'a>> {
        let layers = self.layers.iter().flat_map(|l| {
            [&l.q, &l.k, &l.v, &l.attn_out]
                .into_iter()
                .chain(l.ffn.linears())
        });
        let head = (self.classifier.iter()).flat_map(|c| c.dense.iter().chain(c.out.iter()));
        std::iter::once(&self.output).chain(layers).chain(head)
    }

    /// Every f32 vector the block reads (norm weights and biases, projection biases,
    /// attention sinks): what a device copies beside the matrices.
    pub(crate) fn vectors(&self) -> Vec<&[f32]> {
        fn norm<'n>(n: &'n Norm, v: &mut Vec<&'n [f32]>) {
            v.push(&n.weight);
            v.extend(n.bias.as_deref());
        }
        let mut v: Vec<&[f32]> = Vec::new();
        for n in [&self.embd_norm, &self.output_norm].into_iter().flatten() {
            norm(n, &mut v);
        }
        for l in &self.layers {
            if let Some(n) = &l.attn_norm {
                norm(n, &mut v);
            }
            match &l.ffn_input {
                FfnInput::AfterAttention(n) | FfnInput::Parallel(n) => norm(n, &mut v),
                FfnInput::ParallelShared => {}
                FfnInput::PostNorm { attn_out, out } => {
                    norm(attn_out, &mut v);
                    norm(out, &mut v);
                }
            }
            for h in [&l.q_norm, &l.k_norm].into_iter().flatten() {
                v.push(&h.weight);
            }
            for w in [&l.post_attn_norm, &l.post_ffn_norm, &l.attn_sinks]
                .into_iter()
                .flatten()
            {
                v.push(w);
            }
        }
        v.extend(self.linears().filter_map(|l| l.b.as_deref()));
        v
    }

    /// Token `tok`'s embedding into `out` (n_embd values). When the output projection is
    /// the embedding (tied) and was packed, the row comes from the packed copy: the
    /// file's pages were released.
    pub fn embed_row(&self, tok: usize, out: &mut [f32]) {
        let e = &self.token_embd;
        if let Some(p) = &self.output.packed
            && std::ptr::eq(self.output.w.data, e.data)
        {
            let mut bytes = vec![0u8; e.data.len() / e.rows.max(1)];
            if p.source_row(tok, &mut bytes) {
                // Shapes and types were checked at bind time, so this cannot fail.
                let _ = llamay_formats::dequantize(e.ty, &bytes, out);
                return;
            }
        }
        e.dequant_row(tok, out);
    }

    /// Repacks every projection the active kernel set has packed kernels for (see
    /// `llamay_kernels::pack`); the others keep computing on the file's bytes. After
    /// each one, `release` gets the file bytes it no longer reads, so the resident
    /// peak stays about one copy of the weights.
    pub fn pack(&mut self, pool: &ThreadPool, release: &dyn Fn(&'a [u8])) {
        for l in self.linears_mut() {
            let w = &l.w;
            l.packed = llamay_kernels::pack_releasing(w.ty, w.data, w.rows, w.cols, pool, release);
        }
    }

    /// Sets each projection's `then` to the next one a dense decoder's step reads:
    /// q, k, v, attention output, up, gate, down per layer, then the next layer, and the
    /// output after the last. Mixtures of experts are skipped (which experts come next
    /// is the router's choice); a wrong guess would cost only wasted prefetches. After
    /// `pack`: the addresses are those of the bytes the matmuls read.
    pub(crate) fn link_decode_order(&mut self) {
        let mut order: Vec<&mut Linear<'a>> = Vec::new();
        for l in self.layers.iter_mut() {
            order.extend([&mut l.q, &mut l.k, &mut l.v, &mut l.attn_out]);
            if let Ffn::Dense(d) = &mut l.ffn {
                order.push(&mut d.up);
                order.extend(d.gate.as_mut());
                order.push(&mut d.down);
            }
        }
        order.push(&mut self.output);
        let spans: Vec<(usize, usize)> = (order.iter())
            .map(|l| {
                let b = l.weight_bytes();
                (b.as_ptr() as usize, b.len().min(THEN_BYTES))
            })
            .collect();
        for (l, next) in order.into_iter().zip(spans.into_iter().skip(1)) {
            l.then = Some(next);
        }
    }
}
