//! The KV snapshot reader on untrusted bytes. One small synthetic model (gemma3: a
//! sliding window, so the held page ranges differ by layer) and one f32 context, made
//! once. The oracle: no panic; an accepted snapshot holds what it says (its length and
//! tokens) and decodes one more token; a refused one leaves the pool as it was.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamay_engine::{BatchToken, ContextParams, KvPrecision, Model, Threads};
use llamay_gguf::{GgufFile, Model as Gguf};
use std::sync::OnceLock;

fn model_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let spec = llamay_synth::Spec {
            ty: llamay_formats::GgmlType::Q8_0,
            dims: llamay_synth::Dims {
                n_layer: 6,
                n_ctx: 256,
                ..llamay_synth::Dims::TINY
            },
            ..llamay_synth::Spec::new(llamay_engine::arch::find("gemma3").unwrap())
        };
        llamay_synth::ModelFile::new(&spec).write().unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let gguf = Gguf::single(GgufFile::parse(model_bytes()).unwrap());
    let model = Model::load(&gguf, Threads(1)).unwrap();
    let n_ctx = model.config().n_ctx_train;
    let mut ctx = model
        .context(ContextParams::new(Threads(1), KvPrecision::F32, n_ctx))
        .unwrap();
    // `LLAMAY_FUZZ_SEED=DIR`: write valid snapshots (past the window, mid-page) there
    // first, the corpus's seeds.
    if let Some(dir) = std::env::var_os("LLAMAY_FUZZ_SEED") {
        for n in [1usize, 70, 150] {
            let s = ctx.new_sequence();
            let batch: Vec<BatchToken> = (0..n)
                .map(|pos| BatchToken { seq: s, token: (pos % 16) as u32, pos, logits: pos + 1 == n })
                .collect();
            ctx.decode(&batch).unwrap();
            let snap = ctx.save_sequence(s).unwrap();
            std::fs::write(std::path::Path::new(&dir).join(format!("valid-{n}")), snap).unwrap();
            ctx.kv_mut().free(s).unwrap();
        }
    }
    let before = ctx.kv().usage();
    match ctx.load_sequence(data) {
        Ok(seq) => {
            let len = ctx.kv().len(seq).unwrap();
            assert_eq!(ctx.kv().tokens(seq).unwrap().len(), len);
            if len < n_ctx {
                let bt = BatchToken { seq, token: 1, pos: len, logits: true };
                ctx.decode(&[bt]).unwrap();
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(ctx.kv().usage(), before);
        }
    }
});
