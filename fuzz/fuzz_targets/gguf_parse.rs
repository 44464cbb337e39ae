//! Any bytes: the GGUF parser returns Ok or Err, never panics or reads out of bounds.
//! What parses is walked completely (every value, every tensor's bytes, dequantised
//! where readable) and, for little-endian files, rewritten and re-read identically.
//! The same bytes as an importance matrix (GGUF or legacy .dat): read, merged, its
//! quantiser weights taken, written in both formats and read back, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamay_gguf::{GgufFile, GgufWriter};
use std::borrow::Cow;

fn imatrix(data: &[u8]) {
    let Ok(loaded) = llamay_imatrix::read_bytes(data) else { return };
    std::hint::black_box(loaded.quant_weights());
    let mut m = llamay_imatrix::Imatrix::new(64);
    if m.merge(loaded.clone()).is_err() || m.merge(loaded).is_err() {
        return;
    }
    if let Ok(bytes) = m.gguf_bytes(Some("fuzz")) {
        llamay_imatrix::read_bytes(&bytes).expect("a written imatrix reads back");
    }
    let _ = llamay_imatrix::read_bytes(&m.dat_bytes(None));
}

fuzz_target!(|data: &[u8]| {
    imatrix(data);
    let Ok(f) = GgufFile::parse(data) else { return };
    for (_, v) in f.metadata.iter() {
        if let Some(a) = v.as_array() {
            for e in a.iter() {
                std::hint::black_box(e);
            }
        }
        std::hint::black_box((v.as_u64(), v.as_f64(), v.as_str()));
    }
    let mut out = Vec::new();
    for t in &f.tensors {
        assert_eq!(t.data.len() as u64, t.n_bytes);
        if t.ty.is_readable() && t.n_elements < (1 << 16) {
            out.resize(t.n_elements as usize, 0.0);
            let _ = llamay_formats::dequantize(t.ty, t.data, &mut out);
        }
    }
    if f.big_endian {
        return;
    }
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata.iter() {
        w.add_kv(k, v.clone()).expect("a parsed key/value is writable");
    }
    for t in &f.tensors {
        w.add_tensor(t.name, t.ty, &t.shape).expect("a parsed tensor is writable");
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i| Ok(Cow::Borrowed(f.tensors[i].data))).expect("write to memory");
    let g = GgufFile::parse(&bytes).expect("the rewrite parses");
    assert_eq!(g.tensors.len(), f.tensors.len());
    for (a, b) in f.metadata.iter().zip(g.metadata.iter()) {
        assert_eq!(a.0, b.0);
    }
    for (a, b) in f.tensors.iter().zip(&g.tensors) {
        assert_eq!((a.name, a.ty, &a.shape, a.data), (b.name, b.ty, &b.shape, b.data));
    }
});
