//! The compute kernels: one row per SPIR-V module (`scripts/build-shaders` has the
//! same rows), each with the storage buffers it binds and the words of its push
//! constants.

/// A compute kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// f32 rows to Q8_0 as ggml-cpu quantises them (`quantize_q8_0.comp`).
    QuantizeQ8_0,
    /// A Q8_0 weight times Q8_0 activations (`matmul_q8.comp -DW_Q8_0`).
    MatmulQ8_0,
    /// Q4_0 weights.
    MatmulQ4_0,
    /// Q5_0 weights.
    MatmulQ5_0,
    /// The same three with packed 4x8-bit integer dot products (`-DDOT4`), for a
    /// device with VK_KHR_shader_integer_dot_product.
    MatmulQ8_0Dot4,
    MatmulQ4_0Dot4,
    MatmulQ5_0Dot4,
    /// Float weights times f32 activations (`matmul_float.comp -DW_F32/F16/BF16`).
    MatmulF32,
    MatmulF16,
    MatmulBF16,
    /// f32 rows to Q8_K (`quantize_q8_k.comp`).
    QuantizeQ8K,
    /// K-quant weights times Q8_K activations (`matmul_k.comp -DW_Q?_K`).
    MatmulQ2K,
    MatmulQ3K,
    MatmulQ4K,
    MatmulQ5K,
    MatmulQ6K,
    /// RMSNorm / LayerNorm of rows (`norm.comp`).
    Norm,
    /// Rotary embedding in place (`rope.comp`).
    Rope,
    /// Residual adds and biases (`add.comp`).
    Add,
    /// GELU, soft-cap and the gated units (`eltwise.comp`).
    Eltwise,
    /// Rows by index (`gather.comp`).
    Gather,
    /// Keys and values into the cache (`kv_write.comp`), f32 or f16 pages.
    KvWrite,
    KvWriteF16,
    /// Attention over the paged cache (`attention.comp`), f32 or f16 pages.
    Attention,
    AttentionF16,
}

/// Bindings of the kernels that touch the KV caches: their own buffers, and every part
/// of the keys and of the values (`shaders/cache.glsl`).
const CACHE_BINDINGS: u32 = 2 * llamay_engine::device::CACHE_PARTS as u32;
const KV_WRITE: u32 = 3 + CACHE_BINDINGS;
const ATTENTION: u32 = 5 + CACHE_BINDINGS;
/// The most storage buffers a kernel binds (the attention kernel's).
pub(crate) const MAX_BINDINGS: u32 = ATTENTION;

pub(crate) struct KernelSpec {
    pub spirv: &'static [u8],
    /// Storage buffers at bindings 0..buffers.
    pub buffers: u32,
    /// 32-bit words of push constants.
    pub push_words: u32,
    /// `local_size_x` in the source.
    pub local_size: u32,
}

pub(crate) const ALL: [Kernel; 25] = [
    Kernel::QuantizeQ8_0,
    Kernel::MatmulQ8_0,
    Kernel::MatmulQ4_0,
    Kernel::MatmulQ5_0,
    Kernel::MatmulQ8_0Dot4,
    Kernel::MatmulQ4_0Dot4,
    Kernel::MatmulQ5_0Dot4,
    Kernel::MatmulF32,
    Kernel::MatmulF16,
    Kernel::MatmulBF16,
    Kernel::QuantizeQ8K,
    Kernel::MatmulQ2K,
    Kernel::MatmulQ3K,
    Kernel::MatmulQ4K,
    Kernel::MatmulQ5K,
    Kernel::MatmulQ6K,
    Kernel::Norm,
    Kernel::Rope,
    Kernel::Add,
    Kernel::Eltwise,
    Kernel::Gather,
    Kernel::KvWrite,
    Kernel::KvWriteF16,
    Kernel::Attention,
    Kernel::AttentionF16,
];

impl Kernel {
    /// The packed-dot-product twin of a kernel, where it has one.
    pub(crate) fn dot4(self) -> Option<Kernel> {
        match self {
            Kernel::MatmulQ8_0 => Some(Kernel::MatmulQ8_0Dot4),
            Kernel::MatmulQ4_0 => Some(Kernel::MatmulQ4_0Dot4),
            Kernel::MatmulQ5_0 => Some(Kernel::MatmulQ5_0Dot4),
            _ => None,
        }
    }

    pub(crate) fn index(self) -> usize {
        ALL.iter().position(|&k| k == self).unwrap_or(0)
    }

    pub(crate) fn spec(self) -> KernelSpec {
        let plain = |spirv, buffers, push_words| KernelSpec {
            spirv,
            buffers,
            push_words,
            local_size: 64,
        };
        let matmul = |spirv| KernelSpec {
            spirv,
            buffers: 4,
            push_words: 6,
            local_size: 64,
        };
        match self {
            Kernel::QuantizeQ8_0 => KernelSpec {
                spirv: include_bytes!("../shaders/spv/quantize_q8_0.spv"),
                buffers: 3,
                push_words: 2,
                local_size: 64,
            },
            Kernel::MatmulQ8_0 => matmul(include_bytes!("../shaders/spv/matmul_q8_0.spv")),
            Kernel::MatmulQ4_0 => matmul(include_bytes!("../shaders/spv/matmul_q4_0.spv")),
            Kernel::MatmulQ5_0 => matmul(include_bytes!("../shaders/spv/matmul_q5_0.spv")),
            Kernel::MatmulQ8_0Dot4 => matmul(include_bytes!("../shaders/spv/matmul_q8_0_dot4.spv")),
            Kernel::MatmulQ4_0Dot4 => matmul(include_bytes!("../shaders/spv/matmul_q4_0_dot4.spv")),
            Kernel::MatmulQ5_0Dot4 => matmul(include_bytes!("../shaders/spv/matmul_q5_0_dot4.spv")),
            Kernel::MatmulF32 => plain(include_bytes!("../shaders/spv/matmul_f32.spv"), 3, 6),
            Kernel::MatmulF16 => plain(include_bytes!("../shaders/spv/matmul_f16.spv"), 3, 6),
            Kernel::MatmulBF16 => plain(include_bytes!("../shaders/spv/matmul_bf16.spv"), 3, 6),
            Kernel::QuantizeQ8K => plain(include_bytes!("../shaders/spv/quantize_q8_k.spv"), 3, 2),
            Kernel::MatmulQ2K => matmul(include_bytes!("../shaders/spv/matmul_q2_k.spv")),
            Kernel::MatmulQ3K => matmul(include_bytes!("../shaders/spv/matmul_q3_k.spv")),
            Kernel::MatmulQ4K => matmul(include_bytes!("../shaders/spv/matmul_q4_k.spv")),
            Kernel::MatmulQ5K => matmul(include_bytes!("../shaders/spv/matmul_q5_k.spv")),
            Kernel::MatmulQ6K => matmul(include_bytes!("../shaders/spv/matmul_q6_k.spv")),
            Kernel::Norm => plain(include_bytes!("../shaders/spv/norm.spv"), 4, 7),
            Kernel::Rope => plain(include_bytes!("../shaders/spv/rope.spv"), 2, 5),
            Kernel::Add => plain(include_bytes!("../shaders/spv/add.spv"), 3, 3),
            Kernel::Eltwise => plain(include_bytes!("../shaders/spv/eltwise.spv"), 3, 3),
            Kernel::Gather => plain(include_bytes!("../shaders/spv/gather.spv"), 3, 3),
            Kernel::KvWrite => plain(include_bytes!("../shaders/spv/kv_write.spv"), KV_WRITE, 5),
            Kernel::KvWriteF16 => plain(
                include_bytes!("../shaders/spv/kv_write_f16.spv"),
                KV_WRITE,
                5,
            ),
            Kernel::Attention => plain(
                include_bytes!("../shaders/spv/attention.spv"),
                ATTENTION,
                10,
            ),
            Kernel::AttentionF16 => plain(
                include_bytes!("../shaders/spv/attention_f16.spv"),
                ATTENTION,
                10,
            ),
        }
    }
}
