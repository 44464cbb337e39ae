//! The engine's device seam (`llamay_engine::device::Device`) on a Vulkan device: each
//! [`Op`] becomes one or two dispatches recorded into the open command buffer.

use crate::error::VulkanError;
use crate::gpu::{BufferId, Gpu};
use crate::kernels::Kernel;
use crate::ops::{self, DeviceMatrix as VkMatrix, Q8Rows};
use llamay_engine::device::{
    CacheBufs, CacheType, Device, DeviceBuf, DeviceCounters, DeviceError, DeviceMatrix, Glu,
    NormOp, Op, Unary,
};
use llamay_formats::GgmlType;

/// A Vulkan device the forward pass runs on.
pub struct VulkanDevice {
    gpu: Gpu,
    matrices: Vec<VkMatrix>,
    /// The activation of the matmul at hand, quantised (grown as needed).
    q8: Option<Q8Rows>,
    /// Bound where a kernel's optional input is absent.
    dummy: BufferId,
}

impl VulkanDevice {
    /// Opens device `index` (`probe()`'s order).
    pub fn open(index: usize) -> Result<VulkanDevice, VulkanError> {
        let mut gpu = Gpu::open(index)?;
        let dummy = gpu.buffer(16, "a placeholder binding")?;
        Ok(VulkanDevice {
            gpu,
            matrices: Vec::new(),
            q8: None,
            dummy,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn q8_for(&mut self, n: usize, cols: usize) -> Result<Q8Rows, VulkanError> {
        let blocks = n * cols / 32;
        if let Some(q) = self.q8
            && q.capacity() >= blocks
        {
            return Ok(q);
        }
        if let Some(q) = self.q8.take() {
            self.gpu.free(q.scales)?;
            self.gpu.free(q.quants)?;
        }
        let q = self.gpu.q8_rows(n, cols)?;
        self.q8 = Some(q);
        Ok(q)
    }

    fn record(&mut self, op: &Op) -> Result<(), VulkanError> {
        let b = |d: DeviceBuf| BufferId(d.0);
        let opt = |d: Option<DeviceBuf>, dummy: BufferId| d.map_or(dummy, b);
        let dummy = self.dummy;
        match *op {
            Op::Matmul { w, x, n, out, bias } => {
                let m = self.matrices.get(w.id as usize).cloned().ok_or_else(|| {
                    VulkanError::Shape(format!("matrix {} is not on this device", w.id))
                })?;
                if Gpu::reads_f32(&m) {
                    self.gpu.matmul_float(&m, b(x), n, b(out), 0)?;
                } else {
                    let mut q = self.q8_for(n, m.cols)?;
                    (self.gpu).quantize(m.ty.vec_dot_type(), b(x), 0, n, m.cols, &mut q)?;
                    self.gpu.matmul(&m, &q, b(out), 0)?;
                }
                if let Some(bias) = bias {
                    let push = [u32_of(n * m.rows)?, u32_of(m.rows)?, 0];
                    self.eltwise_dispatch(
                        Kernel::Add,
                        &[b(out), b(bias), dummy],
                        &push,
                        n * m.rows,
                    )?;
                }
                Ok(())
            }
            Op::Norm {
                kind,
                x,
                out,
                rows,
                cols,
                w,
                w_rows,
                b: bias,
                eps,
            } => {
                let push = [
                    u32_of(rows)?,
                    u32_of(cols)?,
                    u32::from(kind == NormOp::Layer),
                    u32::from(w.is_some()),
                    u32_of(w_rows)?,
                    u32::from(bias.is_some()),
                    eps.to_bits(),
                ];
                let bufs = [b(x), b(out), opt(w, dummy), opt(bias, dummy)];
                self.eltwise_dispatch(Kernel::Norm, &bufs, &push, rows)
            }
            Op::Rope {
                x,
                n,
                dim,
                hd,
                n_rot,
                angles,
                neox,
            } => {
                let half = n_rot / 2;
                let push = [
                    u32_of(n)?,
                    u32_of(dim)?,
                    u32_of(hd)?,
                    u32_of(half)?,
                    u32::from(neox),
                ];
                self.eltwise_dispatch(
                    Kernel::Rope,
                    &[b(x), b(angles)],
                    &push,
                    n * (dim / hd) * half,
                )
            }
            Op::Add { x, y, y_len, z, n } => {
                let push = [u32_of(n)?, u32_of(y_len)?, u32::from(z.is_some())];
                self.eltwise_dispatch(Kernel::Add, &[b(x), b(y), opt(z, dummy)], &push, n)
            }
            Op::Unary { op, x, n, table } => {
                let (code, c) = match op {
                    Unary::Gelu => (0, 0.0f32),
                    Unary::Softcap(c) => (1, c),
                };
                let push = [u32_of(n)?, code, c.to_bits()];
                self.eltwise_dispatch(Kernel::Eltwise, &[b(x), dummy, opt(table, dummy)], &push, n)
            }
            Op::Glu {
                op,
                up,
                gate,
                n,
                table,
            } => {
                let code = match op {
                    Glu::Swiglu => 2,
                    Glu::Geglu => 3,
                    Glu::SwigluOai => 4,
                };
                let push = [u32_of(n)?, code, 0];
                self.eltwise_dispatch(
                    Kernel::Eltwise,
                    &[b(up), b(gate), opt(table, dummy)],
                    &push,
                    n,
                )
            }
            Op::Gather {
                x,
                index,
                index_offset,
                rows,
                cols,
                out,
            } => {
                let push = [u32_of(rows)?, u32_of(cols)?, u32_of(index_offset)?];
                self.eltwise_dispatch(
                    Kernel::Gather,
                    &[b(x), b(index), b(out)],
                    &push,
                    rows * cols,
                )
            }
            Op::KvWrite {
                k,
                v,
                n,
                k_dim,
                v_dim,
                targets,
                targets_offset,
                k_cache,
                v_cache,
                cache,
            } => {
                let push = [
                    u32_of(n)?,
                    u32_of(k_dim)?,
                    u32_of(v_dim)?,
                    u32_of(targets_offset)?,
                    u32_of(k_cache.pages_per_part)?,
                ];
                let mut bufs = vec![b(k), b(v), b(targets)];
                bufs.extend(cache_bindings(&k_cache, &v_cache));
                // f16 pages: an invocation per pair of values (a whole word).
                let (kernel, items) = match cache {
                    CacheType::F32 => (Kernel::KvWrite, n * k_dim.max(v_dim)),
                    CacheType::F16 => (Kernel::KvWriteF16, n * k_dim.max(v_dim) / 2),
                };
                self.eltwise_dispatch(kernel, &bufs, &push, items)
            }
            Op::Attention {
                q,
                n,
                k_cache,
                v_cache,
                cache,
                tables,
                slots,
                slots_offset,
                shape,
                sinks,
                out,
            } => {
                if shape.head_dim_v > 512 {
                    return Err(VulkanError::Shape(format!(
                        "value heads of {} (the attention kernel holds 512)",
                        shape.head_dim_v
                    )));
                }
                let push = [
                    u32_of(n)?,
                    u32_of(shape.n_head)?,
                    u32_of(shape.n_head_kv)?,
                    u32_of(shape.head_dim_k)?,
                    u32_of(shape.head_dim_v)?,
                    shape.scale.to_bits(),
                    shape.softcap.unwrap_or(0.0).to_bits(),
                    u32::from(sinks.is_some()),
                    u32_of(slots_offset)?,
                    u32_of(k_cache.pages_per_part)?,
                ];
                let mut bufs = vec![b(q)];
                bufs.extend(cache_bindings(&k_cache, &v_cache));
                bufs.extend([b(tables), b(slots), opt(sinks, dummy), b(out)]);
                // A workgroup per (head, token).
                let groups = [u32_of(shape.n_head)?, u32_of(n)?, 1];
                let kernel = match cache {
                    CacheType::F32 => Kernel::Attention,
                    CacheType::F16 => Kernel::AttentionF16,
                };
                self.gpu.dispatch(kernel, &bufs, &push, groups)
            }
        }
    }

    /// One invocation per item, in workgroups of the kernel's size.
    fn eltwise_dispatch(
        &mut self,
        k: Kernel,
        bufs: &[BufferId],
        push: &[u32],
        items: usize,
    ) -> Result<(), VulkanError> {
        let groups = Gpu::groups(items, k.spec().local_size)?;
        self.gpu.dispatch(k, bufs, push, [groups, 1, 1])
    }
}

/// The caches' bindings as `cache.glsl` declares them: every key part, then every value
/// part.
fn cache_bindings(k: &CacheBufs, v: &CacheBufs) -> impl Iterator<Item = BufferId> + use<> {
    (k.parts.into_iter().chain(v.parts)).map(|d| BufferId(d.0))
}

fn u32_of(v: usize) -> Result<u32, VulkanError> {
    u32::try_from(v).map_err(|_| VulkanError::Shape(format!("{v} does not fit a push constant")))
}

fn failed(e: VulkanError) -> DeviceError {
    match e {
        VulkanError::Declined { tensor, reason } => DeviceError::Declined { tensor, reason },
        e => DeviceError::Failed(e.to_string()),
    }
}

impl Device for VulkanDevice {
    fn describe(&self) -> String {
        let i = self.gpu.info();
        let dot = if self.gpu.integer_dot() {
            ", integer dot products"
        } else {
            ""
        };
        format!(
            "{} ({}, Vulkan {}{dot})",
            i.name,
            i.kind.name(),
            i.api_version
        )
    }

    fn declines(&self, ty: GgmlType) -> Option<String> {
        ops::declines(ty)
    }

    fn max_buffer_len(&self) -> usize {
        usize::try_from(self.gpu.max_buffer_bytes() / 4).unwrap_or(usize::MAX)
    }

    fn alloc(&mut self, len: usize, what: &str) -> Result<DeviceBuf, DeviceError> {
        let id = self.gpu.buffer(len as u64 * 4, what).map_err(failed)?;
        Ok(DeviceBuf(id.0))
    }

    fn free(&mut self, buf: DeviceBuf) {
        // A failed flush before the free leaves the buffer to the device's drop.
        let _ = self.gpu.free(BufferId(buf.0));
    }

    fn upload_matrix(
        &mut self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix, DeviceError> {
        let m = (self.gpu.upload_matrix(name, ty, rows, cols, bytes)).map_err(failed)?;
        self.matrices.push(m);
        Ok(DeviceMatrix {
            id: (self.matrices.len() - 1) as u32,
            ty,
            rows,
            cols,
        })
    }

    fn write_f32(
        &mut self,
        buf: DeviceBuf,
        offset: usize,
        values: &[f32],
    ) -> Result<(), DeviceError> {
        self.gpu
            .write_f32(BufferId(buf.0), offset, values)
            .map_err(failed)
    }

    fn write_u32(
        &mut self,
        buf: DeviceBuf,
        offset: usize,
        values: &[u32],
    ) -> Result<(), DeviceError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (self.gpu.write(BufferId(buf.0), offset as u64 * 4, &bytes)).map_err(failed)
    }

    fn read(&mut self, buf: DeviceBuf, offset: usize, out: &mut [f32]) -> Result<(), DeviceError> {
        self.gpu
            .read_f32(BufferId(buf.0), offset, out)
            .map_err(failed)
    }

    fn run(&mut self, op: &Op) -> Result<(), DeviceError> {
        self.record(op).map_err(failed)
    }

    fn copy(
        &mut self,
        src: DeviceBuf,
        src_offset: usize,
        dst: DeviceBuf,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        let (s, d) = (BufferId(src.0), BufferId(dst.0));
        (self.gpu.copy(
            s,
            src_offset as u64 * 4,
            d,
            dst_offset as u64 * 4,
            len as u64 * 4,
        ))
        .map_err(failed)
    }

    fn memory_bytes(&self) -> u64 {
        self.gpu.info().memory_bytes
    }

    fn counters(&self) -> DeviceCounters {
        let s = self.gpu.stats();
        DeviceCounters {
            submissions: s.submissions,
            bytes_read: s.bytes_read,
        }
    }
}
