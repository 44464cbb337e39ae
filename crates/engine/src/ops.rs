//! Elementwise and per-row operations of the forward pass (portable reference).

use half::f16;

/// RMSNorm of one row, scaled by `w`, in ggml's order of operations (squares in f32,
/// summed in f64, mean and scale in f32, then the weight as a separate multiply).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, w) in x.iter_mut().zip(w) {
        *v = (*v * scale) * w;
    }
}

/// LayerNorm of one row with weight and optional bias, in ggml's order of operations.
pub fn layer_norm(x: &mut [f32], w: &[f32], b: Option<&[f32]>, eps: f32) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|v| f64::from(*v)).sum::<f64>() / n) as f32;
    let mut sum2 = 0f64;
    for v in x.iter_mut() {
        *v -= mean;
        sum2 += f64::from(*v * *v);
    }
    let variance = (sum2 / n) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    for (i, v) in x.iter_mut().enumerate() {
        let y = (*v * scale) * w[i];
        *v = match b {
            Some(b) => y + b[i],
            None => y,
        };
    }
}

pub fn add_bias(x: &mut [f32], b: Option<&Vec<f32>>, cols: usize) {
    if let Some(b) = b {
        for row in x.chunks_mut(cols) {
            for (v, b) in row.iter_mut().zip(b) {
                *v += b;
            }
        }
    }
}

fn gelu_tanh(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    // The target-independent tanh: with it the table is the same on every target (and
    // equal to the one x86-64's tanhf gives, all 65536 entries: measured).
    0.5 * x * (1.0 + llamay_kernels::math::tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))
}

/// `f16(gelu_tanh(f16 value))` for every f16 bit pattern: ggml's `ggml_table_gelu_f16`.
static GELU_F16: std::sync::LazyLock<Vec<u16>> = std::sync::LazyLock::new(|| {
    (0..=u16::MAX)
        .map(|h| f16::from_f32(gelu_tanh(f16::from_bits(h).to_f32())).to_bits())
        .collect()
});

/// ggml's GELU table: `f16(gelu_tanh(h))` for every f16 bit pattern `h` (what a device
/// looks GELU up in, so that it gives the CPU's values exactly).
pub(crate) fn gelu_table() -> &'static [u16] {
    &GELU_F16
}

/// GELU (tanh form) as ggml's CPU backend computes it: through an f16 lookup table,
/// i.e. the input rounded to f16 and the result rounded to f16, exact outside ±10.
/// The element-wise reference of [`gelu_slice`].
#[cfg(test)]
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(GELU_F16[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

/// [`gelu`] over a slice: the f16 conversions run a block at a time (F16C when the CPU
/// has it); same values as `gelu` element by element.
pub fn gelu_slice(x: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let mut bits = [0u16; 256];
    for chunk in x.chunks_mut(256) {
        let b = &mut bits[..chunk.len()];
        b.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(chunk);
        for (v, h) in chunk.iter_mut().zip(b.iter()) {
            *v = if *v <= -10.0 {
                0.0
            } else if *v >= 10.0 {
                *v
            } else {
                f16::from_bits(GELU_F16[*h as usize]).to_f32()
            };
        }
    }
}

/// gpt-oss's clipped SwiGLU, ggml's `swiglu_oai` (α = 1.702, limit 7), in place:
/// `up[i] = g·σ(α·g) · (u + 1)` with g = min(gate[i], 7) and u = clamp(up[i], −7, 7).
pub fn swiglu_oai(up: &mut [f32], gate: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (u, &g) in up.iter_mut().zip(gate) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        *u = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_and_activations() {
        let mut x = [3.0, 4.0];
        rms_norm(&mut x, &[1.0, 1.0], 0.0);
        assert!((x[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6);
        let mut y = [1.0, 3.0];
        layer_norm(&mut y, &[1.0, 1.0], Some(&[0.5, 0.5]), 0.0);
        assert!((y[0] + 0.5).abs() < 1e-6 && (y[1] - 1.5).abs() < 1e-6);
        assert_eq!(gelu(-20.0), 0.0);
        assert!((gelu(1.0) - 0.8413).abs() < 1e-3);
        let mut xs: Vec<f32> = (-3000..3000).map(|i| i as f32 * 0.0041).collect();
        let want: Vec<f32> = xs.iter().map(|&x| gelu(x)).collect();
        gelu_slice(&mut xs);
        assert_eq!(xs, want);
        // The table is ggml's: the input and the result rounded through f16.
        for i in -3600..3600 {
            let x = i as f32 * 0.002_718;
            let direct = f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32();
            assert_eq!(gelu(x).to_bits(), direct.to_bits(), "gelu({x})");
        }
    }
}
