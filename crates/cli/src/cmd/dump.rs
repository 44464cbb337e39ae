//! `llamay dump`: a tensor's values dequantised to f32, as one JSON array, in GGUF
//! element order.

use crate::ModelArg;
use crate::out;
use anyhow::{Context, bail};
use llamay_formats::dequantize;
use llamay_gguf::MappedModel;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArg,
    /// Tensor name, as `info --tensors` lists it.
    #[arg(long)]
    tensor: String,
    /// Print only the first N values.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

/// Blocks dequantised per step: bounds memory for tensors of any size.
const BLOCKS_PER_STEP: u64 = 4096;

pub fn run(args: &Args) -> anyhow::Result<()> {
    let path = &args.model.path()?;
    let mapped = MappedModel::open(path)?;
    let model = mapped.parse()?;
    let Some(t) = model.tensor(&args.tensor) else {
        bail!(
            "no tensor named '{}' in {} (llamay info --tensors lists them)",
            args.tensor,
            path.display()
        );
    };
    if let Some(why) = t.ty.refusal() {
        bail!("tensor '{}': {why}", t.name);
    }
    let n = args.count.map_or(t.n_elements, |c| c.min(t.n_elements));
    let block = t.ty.block_size();
    let type_size = t.ty.type_size() as usize;
    // A big-endian file's tensors are rewritten into the little-endian layout at open,
    // where the format defines one.
    if model.big_endian_data(t) {
        bail!(
            "tensor '{}' is {} in a big-endian file, a format without a defined big-endian layout (gguf-py's gguf_convert_endian converts {})",
            t.name,
            t.ty,
            llamay_formats::byte_order::BIG_ENDIAN_FORMATS
        );
    }
    let mut w = out::stdout();
    w.write_all(b"[")?;
    let mut written = 0u64;
    let mut values = Vec::new();
    let n_blocks = n.div_ceil(block);
    let mut b0 = 0u64;
    while b0 < n_blocks {
        let nb = BLOCKS_PER_STEP.min(n_blocks - b0);
        // b0, nb are within the tensor, whose byte range the parser has checked.
        let start = b0 as usize * type_size;
        let bytes = &t.data[start..start + nb as usize * type_size];
        values.resize((nb * block) as usize, 0.0);
        dequantize(t.ty, bytes, &mut values).with_context(|| format!("tensor '{}'", t.name))?;
        for &v in values.iter().take((n - written).min(nb * block) as usize) {
            if written > 0 {
                w.write_all(b",")?;
            }
            write_f32(&mut w, v)?;
            written += 1;
        }
        b0 += nb;
    }
    w.write_all(b"]\n")?;
    w.flush()?;
    Ok(())
}

/// JSON has no NaN or infinity: they are written as null, as serde_json does. Rust's
/// `Debug` for f32 is the shortest text that reads back to the same value, and valid JSON.
fn write_f32(w: &mut impl Write, v: f32) -> std::io::Result<()> {
    if v.is_finite() {
        write!(w, "{v:?}")
    } else {
        w.write_all(b"null")
    }
}
