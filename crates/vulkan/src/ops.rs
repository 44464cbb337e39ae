//! The operations a forward pass asks of the device, over its buffers: weights placed
//! in their GGUF block format (or declined by name), activations quantised as ggml-cpu
//! quantises them, matrix products.

use crate::error::VulkanError;
use crate::gpu::{BufferId, Gpu};
use crate::kernels::Kernel;
use llamay_formats::GgmlType;

/// The weight formats the device computes on, with the kernel of each.
const WEIGHT_KERNELS: &[(GgmlType, Kernel)] = &[
    (GgmlType::F32, Kernel::MatmulF32),
    (GgmlType::F16, Kernel::MatmulF16),
    (GgmlType::BF16, Kernel::MatmulBF16),
    (GgmlType::Q8_0, Kernel::MatmulQ8_0),
    (GgmlType::Q4_0, Kernel::MatmulQ4_0),
    (GgmlType::Q5_0, Kernel::MatmulQ5_0),
    (GgmlType::Q2_K, Kernel::MatmulQ2K),
    (GgmlType::Q3_K, Kernel::MatmulQ3K),
    (GgmlType::Q4_K, Kernel::MatmulQ4K),
    (GgmlType::Q5_K, Kernel::MatmulQ5K),
    (GgmlType::Q6_K, Kernel::MatmulQ6K),
];

/// The weight formats the device runs, in words: "Q8_0 Q4_0 Q5_0".
pub fn weight_formats() -> String {
    let names: Vec<&str> = WEIGHT_KERNELS.iter().map(|(t, _)| t.name()).collect();
    names.join(" ")
}

/// Why the device declines a weight format, or `None` when it runs it. The engine's
/// fall back is per format: a declined matrix runs on the CPU, the rest on the device.
pub fn declines(ty: GgmlType) -> Option<String> {
    if WEIGHT_KERNELS.iter().any(|&(t, _)| t == ty) {
        return None;
    }
    let name = ty.name();
    Some(if name.starts_with("IQ") {
        format!(
            "{name} is an i-quant, decoded through a codebook: the Vulkan device has no kernel for it (it runs {})",
            weight_formats()
        )
    } else {
        format!(
            "the Vulkan device has no {name} kernel yet (it runs {})",
            weight_formats()
        )
    })
}

/// A weight matrix on the device, in its file's block format: `rows` outputs of
/// `cols` inputs, in parts of consecutive rows where one buffer cannot hold it all
/// (a binding is at most `maxStorageBufferRange`: 128 MiB on lavapipe).
#[derive(Clone, Debug)]
pub struct DeviceMatrix {
    /// (buffer, rows) in row order.
    pub parts: Vec<(BufferId, usize)>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    kernel: Kernel,
}

/// Activation rows quantised on the device to a weight's dot type: Q8_0 (per block of
/// 32 the f16-rounded scale, as f32) or Q8_K (per block of 256 its f32 scale), the
/// values packed four to a word.
#[derive(Clone, Copy, Debug)]
pub struct Q8Rows {
    /// Q8_0 or Q8_K: what the last quantisation wrote.
    pub ty: GgmlType,
    pub scales: BufferId,
    pub quants: BufferId,
    /// Blocks the buffers hold.
    capacity: usize,
    /// Rows and columns of the last quantisation.
    pub n: usize,
    pub cols: usize,
}

impl Q8Rows {
    /// Blocks the buffers hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Gpu {
    /// Places a weight on the device as the file holds it (`bytes`: `rows` rows of
    /// `cols` values in `ty`), or declines its format naming tensor, format and reason.
    pub fn upload_matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix, VulkanError> {
        let Some(&(_, plain)) = WEIGHT_KERNELS.iter().find(|&&(t, _)| t == ty) else {
            return Err(VulkanError::Declined {
                tensor: name.to_string(),
                reason: declines(ty).unwrap_or_default(),
            });
        };
        // The packed-dot-product twin where the device has it: the same integers.
        let kernel = match plain.dot4() {
            Some(k) if self.integer_dot() => k,
            _ => plain,
        };
        let expect = ty
            .bytes_for(cols as u64)
            .and_then(|r| r.checked_mul(rows as u64));
        if expect != Some(bytes.len() as u64) {
            return Err(VulkanError::Shape(format!(
                "tensor '{name}': {} bytes for {rows} rows of {cols} {ty} values",
                bytes.len()
            )));
        }
        let row_bytes = bytes.len() / rows.max(1);
        let per_part = (self.max_buffer_bytes() as usize / row_bytes.max(1)).max(1);
        let mut parts = Vec::new();
        for (i, chunk) in bytes.chunks(per_part * row_bytes).enumerate() {
            let what = format!("tensor '{name}' (rows from {})", i * per_part);
            let part = self.buffer(chunk.len() as u64, &what);
            let part = part.and_then(|b| self.write(b, 0, chunk).map(|()| b));
            match part {
                Ok(b) => parts.push((b, chunk.len() / row_bytes)),
                Err(e) => {
                    for (b, _) in parts {
                        self.free(b)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(DeviceMatrix {
            parts,
            ty,
            rows,
            cols,
            kernel,
        })
    }

    /// Whether the matrix reads the f32 activation rows themselves (float formats) rather
    /// than their quantisation.
    pub fn reads_f32(w: &DeviceMatrix) -> bool {
        matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Records `out[o_offset + t * rows + r] = W[r] · x[t]` for a float matrix and `n`
    /// f32 activation rows (see `matmul_float.comp`).
    pub fn matmul_float(
        &mut self,
        w: &DeviceMatrix,
        x: BufferId,
        n: usize,
        out: BufferId,
        o_offset: usize,
    ) -> Result<(), VulkanError> {
        if !Gpu::reads_f32(w) {
            return Err(VulkanError::Shape(format!(
                "{} is not a float format",
                w.ty
            )));
        }
        let need = (o_offset + n * w.rows) as u64 * 4;
        if need > self.buffer_bytes(out)? || (n * w.cols * 4) as u64 > self.buffer_bytes(x)? {
            return Err(VulkanError::Shape(format!(
                "{n} rows through a {}x{} matrix do not fit their buffers",
                w.rows, w.cols
            )));
        }
        self.dispatch_parts(w, &[x, out], n, o_offset)
    }

    /// Buffers for up to `n` rows of `cols` values quantised to Q8_0.
    pub fn q8_rows(&mut self, n: usize, cols: usize) -> Result<Q8Rows, VulkanError> {
        if !cols.is_multiple_of(32) {
            return Err(VulkanError::Shape(format!(
                "{cols} columns are not whole Q8_0 blocks"
            )));
        }
        let blocks = n * cols / 32;
        Ok(Q8Rows {
            ty: GgmlType::Q8_0,
            scales: self.buffer(blocks as u64 * 4, "Q8_0 activation scales")?,
            quants: self.buffer(blocks as u64 * 32, "Q8_0 activations")?,
            capacity: blocks,
            n: 0,
            cols,
        })
    }

    /// Records the quantisation of `n` rows of `cols` f32 values to `ty` (Q8_0 or
    /// Q8_K: a weight's dot type) into `out`.
    pub fn quantize(
        &mut self,
        ty: GgmlType,
        x: BufferId,
        x_offset: usize,
        n: usize,
        cols: usize,
        out: &mut Q8Rows,
    ) -> Result<(), VulkanError> {
        let (block, kernel) = match ty {
            GgmlType::Q8_0 => (32, Kernel::QuantizeQ8_0),
            GgmlType::Q8_K => (256, Kernel::QuantizeQ8K),
            _ => {
                return Err(VulkanError::Shape(format!(
                    "{ty} activations: the device quantises to Q8_0 and Q8_K"
                )));
            }
        };
        // Capacity counts blocks of 32: a Q8_K block needs 8 of them in the quants
        // buffer and one scale.
        if !cols.is_multiple_of(block) || n * cols / 32 > out.capacity {
            return Err(VulkanError::Shape(format!(
                "{n} rows of {cols} do not fit {ty} buffers of {} values",
                out.capacity * 32
            )));
        }
        let blocks = n * cols / block;
        let spec = kernel.spec();
        let push = [u32_of(blocks)?, u32_of(x_offset)?];
        let groups = Gpu::groups(blocks, spec.local_size)?;
        self.dispatch(kernel, &[x, out.scales, out.quants], &push, [groups, 1, 1])?;
        (out.ty, out.n, out.cols) = (ty, n, cols);
        Ok(())
    }

    /// Records `out[o_offset + t * rows + r] = W[r] · A[t]` for every weight row and
    /// activation row: the CPU kernels' bits (see `matmul_q8.comp`).
    pub fn matmul(
        &mut self,
        w: &DeviceMatrix,
        a: &Q8Rows,
        out: BufferId,
        o_offset: usize,
    ) -> Result<(), VulkanError> {
        if a.ty != w.ty.vec_dot_type() {
            return Err(VulkanError::Shape(format!(
                "a {} matrix times {} activations (it reads {})",
                w.ty,
                a.ty,
                w.ty.vec_dot_type()
            )));
        }
        if a.cols != w.cols {
            return Err(VulkanError::Shape(format!(
                "a matrix of {} columns times activations of {}",
                w.cols, a.cols
            )));
        }
        let need = (o_offset + a.n * w.rows) as u64 * 4;
        if need > self.buffer_bytes(out)? {
            return Err(VulkanError::Shape(format!(
                "{} outputs at {o_offset} do not fit the output buffer",
                a.n * w.rows
            )));
        }
        self.dispatch_parts(w, &[a.scales, a.quants, out], a.n, o_offset)
    }

    /// Dispatches `w`'s kernel part by part (each part's rows into their place of every
    /// token's output row, `o_offset + t * w.rows + row`); `inputs` are the buffers the
    /// kernel binds after the weights.
    fn dispatch_parts(
        &mut self,
        w: &DeviceMatrix,
        inputs: &[BufferId],
        n: usize,
        o_offset: usize,
    ) -> Result<(), VulkanError> {
        let spec = w.kernel.spec();
        let mut row0 = 0;
        for &(buf, rows) in &w.parts {
            let push = [
                u32_of(rows)?,
                u32_of(w.cols)?,
                u32_of(n)?,
                0,
                u32_of(o_offset + row0)?,
                u32_of(w.rows)?,
            ];
            let groups = [Gpu::groups(rows, spec.local_size)?, u32_of(n)?, 1];
            let bufs: Vec<BufferId> = std::iter::once(buf).chain(inputs.iter().copied()).collect();
            self.dispatch(w.kernel, &bufs, &push, groups)?;
            row0 += rows;
        }
        Ok(())
    }
}

fn u32_of(v: usize) -> Result<u32, VulkanError> {
    u32::try_from(v).map_err(|_| VulkanError::Shape(format!("{v} does not fit a push constant")))
}
