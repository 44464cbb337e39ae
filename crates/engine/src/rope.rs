//! Rotary position embedding as llama.cpp b11434 computes it: ggml's rope cache (angles
//! by repeated multiplication, per-pair frequency factors, YaRN's ramp and magnitude)
//! and the parameters llama.cpp derives from a file's rope metadata. Every step is f32
//! in ggml's order, so that the angles agree to the last bit.

use crate::arch::RopeStyle;

/// Rope scaling as the file declares it (`{arch}.rope.scaling.type`; llama.cpp treats a
/// missing type as linear, which is no scaling without a factor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// YaRN (Qwen2.5, Llama-style long-context fine-tunes): interpolation for the low
    /// frequencies, extrapolation for the high ones, a ramp between, and a magnitude
    /// correction.
    Yarn {
        factor: f32,
    },
    /// LongRoPE (Phi-3 128k): per-pair factors from `rope_factors_long/short.weight`,
    /// chosen by context size; positions scaled by `factor` (1 unless the file says).
    LongRope {
        factor: f32,
    },
}

impl RopeScaling {
    /// The scaling named by `kind` with the file's `factor` (`None`, or 0: no factor).
    /// Errors begin with the key they are about, less the architecture prefix.
    pub fn parse(kind: Option<&str>, factor: Option<f32>) -> Result<Self, String> {
        let factor = match factor {
            None => 1.0,
            Some(0.0) => 1.0,
            Some(f) if f.is_finite() && f > 0.0 => f,
            Some(f) => return Err(format!("rope.scaling.factor {f} must be positive")),
        };
        Ok(match kind {
            Some("none") => Self::None,
            None | Some("linear") => Self::Linear { factor },
            Some("yarn") => Self::Yarn { factor },
            Some("longrope") => Self::LongRope { factor },
            Some(other) => {
                return Err(format!(
                    "rope.scaling.type '{other}' is not known (none, linear, yarn and longrope are)"
                ));
            }
        })
    }

    /// llama.cpp's `freq_scale`: 1 / factor (`none` never scales).
    pub fn freq_scale(self) -> f32 {
        match self {
            Self::None => 1.0,
            Self::Linear { factor } | Self::Yarn { factor } | Self::LongRope { factor } => {
                1.0 / factor
            }
        }
    }
}

/// YaRN's correction range bounds (llama.cpp's defaults; the architectures in our table
/// do not read the `yarn_beta_*` keys).
const BETA_FAST: f32 = 32.0;
const BETA_SLOW: f32 = 1.0;

/// The parameters of one kind of layer, as llama.cpp passes them to `ggml_rope_ext`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Rotated dimensions per head.
    pub n_rot: usize,
    pub base: f32,
    /// Position scale: 1 / the linear or YaRN factor.
    pub freq_scale: f32,
    /// YaRN's extrapolation mix: 1 with YaRN, else 0 (no ramp, no magnitude change).
    pub ext_factor: f32,
    /// The magnitude passed to ggml (`rope.scaling.attn_factor`, and YaRN's mscale).
    pub attn_factor: f32,
    /// YaRN's correction range in pair indices.
    pub corr_dims: [f32; 2],
}

impl RopeParams {
    /// llama.cpp's context set-up (`llama_context` constructor) for one layer kind:
    /// `freq_scale` is the layer's (Gemma 3's sliding layers never scale), while the
    /// extrapolation and magnitude come from the model's `scaling`.
    pub fn new(
        n_rot: usize,
        base: f32,
        freq_scale: f32,
        scaling: RopeScaling,
        attn_factor: f32,
        n_ctx_orig: usize,
    ) -> Self {
        let (ext_factor, yarn_attn) = match scaling {
            RopeScaling::Yarn { .. } => {
                // get_mscale(factor, 1), then cancel the (1 + 0.1 ln factor) that the
                // kernel multiplies in again when ext_factor != 0 (llama.cpp PR 17945).
                let factor = 1.0 / scaling.freq_scale();
                let mscale = if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * factor.ln() + 1.0
                };
                (1.0, mscale * (1.0 / (1.0 + 0.1 * factor.ln())))
            }
            _ => (0.0, 1.0),
        };
        let n_dims = n_rot as i32;
        let corr = |beta: f32| {
            let t = beta * 2.0 * std::f32::consts::PI;
            n_dims as f32 * (n_ctx_orig as f32 / t).ln() / (2.0 * base.ln())
        };
        let (start, end) = (corr(BETA_FAST).floor(), corr(BETA_SLOW).ceil());
        let corr_dims = [start.max(0.0), end.min((n_dims - 1) as f32)];
        RopeParams {
            n_rot,
            base,
            freq_scale,
            ext_factor,
            attn_factor: yarn_attn * attn_factor,
            corr_dims,
        }
    }

    /// The (cos, sin) of each rotated pair at `pos` (ggml's `ggml_rope_cache_init`):
    /// pair i's angle is `pos · base^(−2i/n_rot)` built by repeated multiplication,
    /// divided by `factors[i]` when given, then scaled (and, with YaRN, blended with the
    /// unscaled angle by the ramp); cos and sin carry the magnitude.
    pub fn angles(&self, pos: usize, factors: Option<&[f32]>, out: &mut Vec<(f32, f32)>) {
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        let mscale = if self.ext_factor != 0.0 {
            self.attn_factor * (1.0 + 0.1 * (1.0 / self.freq_scale).ln())
        } else {
            self.attn_factor
        };
        let [low, high] = self.corr_dims;
        let mut theta = pos as f32;
        out.clear();
        for i in 0..self.n_rot / 2 {
            let extrap = theta / factors.map_or(1.0, |f| f[i]);
            let interp = self.freq_scale * extrap;
            let angle = if self.ext_factor != 0.0 {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                interp * (1.0 - mix) + extrap * mix
            } else {
                interp
            };
            let (sin, cos) = llamay_kernels::math::sin_cos(angle);
            out.push((cos * mscale, sin * mscale));
            theta *= theta_scale;
        }
    }
}

/// Per-pair frequency factors from the file: none, one fixed set (`rope_freqs.weight`,
/// Llama 3.1+), or LongRoPE's two sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RopeFactors {
    #[default]
    None,
    Fixed(Vec<f32>),
    LongShort {
        long: Vec<f32>,
        short: Vec<f32>,
    },
}

impl RopeFactors {
    /// The factors a sequence with a context of `n_ctx` tokens uses. As llama.cpp
    /// b11434 (`get_rope_factors`): the long set when the context, rounded up to 256,
    /// exceeds the original training context, for the whole sequence.
    pub fn for_context(&self, n_ctx: usize, n_ctx_orig: usize) -> Option<&[f32]> {
        match self {
            Self::None => None,
            Self::Fixed(f) => Some(f),
            Self::LongShort { long, short } => Some(if n_ctx.div_ceil(256) * 256 > n_ctx_orig {
                long
            } else {
                short
            }),
        }
    }
}

/// Rotates the first `2 · angles.len()` dimensions of one head vector (the rest pass
/// through) by `angles` from [`RopeParams::angles`].
pub fn rotate(x: &mut [f32], angles: &[(f32, f32)], style: RopeStyle) {
    let half = angles.len();
    for (i, &(cos, sin)) in angles.iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
            RopeStyle::None => return,
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * cos - x1 * sin;
        x[b] = x0 * sin + x1 * cos;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(n_rot: usize, freq_scale: f32) -> RopeParams {
        RopeParams::new(
            n_rot,
            10_000.0,
            freq_scale,
            RopeScaling::Linear {
                factor: 1.0 / freq_scale,
            },
            1.0,
            4096,
        )
    }

    #[test]
    fn neox_and_interleaved_rotate_pairs() {
        let mut angles = Vec::new();
        plain(4, 1.0).angles(1, None, &mut angles);
        let mut a = [1.0, 0.0, 0.0, 0.0];
        rotate(&mut a, &angles, RopeStyle::Interleaved);
        assert!((a[0] - 1f32.cos()).abs() < 1e-6 && (a[1] - 1f32.sin()).abs() < 1e-6);
        let mut b = [1.0, 0.0, 0.0, 0.0];
        rotate(&mut b, &angles, RopeStyle::Neox);
        assert!((b[0] - 1f32.cos()).abs() < 1e-6 && (b[2] - 1f32.sin()).abs() < 1e-6);
        let n: f32 = b.iter().map(|v| v * v).sum();
        assert!((n - 1.0).abs() < 1e-6, "the rotation keeps the norm");
    }

    #[test]
    fn linear_scaling_and_factors_divide_the_angle() {
        let (mut scaled, mut factored) = (Vec::new(), Vec::new());
        plain(8, 0.25).angles(40, None, &mut scaled);
        plain(8, 1.0).angles(40, Some(&[4.0; 4]), &mut factored);
        for ((c0, s0), (c1, s1)) in scaled.iter().zip(&factored) {
            assert!((c0 - c1).abs() < 1e-6 && (s0 - s1).abs() < 1e-6);
        }
        assert!(
            (scaled[0].0 - 10f32.cos()).abs() < 1e-6,
            "pair 0: angle 40 / 4"
        );
    }

    #[test]
    fn yarn_extrapolates_high_frequencies_and_interpolates_low_ones() {
        let (n_rot, factor) = (64, 8.0);
        let p = RopeParams::new(
            n_rot,
            10_000.0,
            1.0 / factor,
            RopeScaling::Yarn { factor },
            1.0,
            64,
        );
        assert_eq!(p.ext_factor, 1.0);
        // llama.cpp: floor/ceil of 64·ln(64 / (β·2π)) / (2 ln 10⁴) for β = 32, 1.
        assert_eq!(p.corr_dims, [0.0, 9.0]);
        let mut got = Vec::new();
        p.angles(1000, None, &mut got);
        let m = 1.0 + 0.1 * factor.ln();
        let theta = |i: usize| 1000.0 * 10_000f32.powf(-2.0 * i as f32 / n_rot as f32);
        // Pair 0 is below the ramp: the unscaled angle; the last pair is past it: the
        // interpolated angle. Both carry the magnitude (1 + 0.1 ln 8).
        assert!((got[0].0 - theta(0).cos() * m).abs() < 1e-3);
        let last = n_rot / 2 - 1;
        assert!((got[last].1 - (theta(last) / factor).sin() * m).abs() < 1e-5);
        for (c, s) in &got {
            assert!(((c * c + s * s).sqrt() - m).abs() < 1e-5);
        }
    }

    #[test]
    fn longrope_picks_long_factors_past_the_original_context() {
        let f = RopeFactors::LongShort {
            long: vec![2.0],
            short: vec![1.0],
        };
        assert_eq!(
            f.for_context(64, 256),
            Some(&[1.0][..]),
            "64 → 256: not past 256"
        );
        assert_eq!(f.for_context(257, 256), Some(&[2.0][..]), "257 → 512");
        assert_eq!(f.for_context(64, 128), Some(&[2.0][..]), "64 → 256 > 128");
        assert_eq!(RopeFactors::None.for_context(1 << 20, 1), None);
    }

    #[test]
    fn scaling_types_parse_as_llama_cpp_reads_them() {
        assert_eq!(
            RopeScaling::parse(None, None),
            Ok(RopeScaling::Linear { factor: 1.0 })
        );
        assert_eq!(
            RopeScaling::parse(Some("yarn"), Some(4.0)),
            Ok(RopeScaling::Yarn { factor: 4.0 })
        );
        assert_eq!(
            RopeScaling::parse(Some("none"), Some(4.0))
                .unwrap()
                .freq_scale(),
            1.0
        );
        assert_eq!(
            RopeScaling::parse(Some("linear"), Some(0.0))
                .unwrap()
                .freq_scale(),
            1.0
        );
        assert!(
            RopeScaling::parse(Some("ntk"), None)
                .unwrap_err()
                .contains("'ntk'")
        );
        assert!(RopeScaling::parse(Some("yarn"), Some(-2.0)).is_err());
    }
}
