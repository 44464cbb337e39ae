//! `GgufFile::parse_header`: the header of a file from its first bytes (what `validate`
//! reads over HTTP Range), checked as a whole parse checks it.

use llamay_formats::GgmlType;
use llamay_gguf::{ErrorKind, GgufFile, GgufWriter, Value};
use std::borrow::Cow;

fn file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("llama".into()))
        .unwrap();
    w.add_tensor("a", GgmlType::F32, &[64, 4]).unwrap();
    w.add_tensor("b", GgmlType::F16, &[32]).unwrap();
    let data = [vec![1u8; 64 * 4 * 4], vec![2u8; 64]];
    let mut out = Vec::new();
    w.write(&mut out, |i| Ok(Cow::Borrowed(&data[i][..])))
        .unwrap();
    out
}

#[test]
fn a_prefix_holding_the_header_parses_with_extents_checked_against_the_length() {
    let bytes = file();
    let whole = GgufFile::parse(&bytes).unwrap();
    let head_len = whole.header_bytes().len();
    let h = GgufFile::parse_header(&bytes[..head_len], bytes.len() as u64).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[0].shape, whole.tensors[0].shape);
    assert!(h.tensors.iter().all(|t| t.data.is_empty()));
    assert_eq!(h.metadata.architecture().unwrap(), Some("llama"));
    // Too short for the header: Truncated, so a reader knows to fetch more.
    let e = GgufFile::parse_header(&bytes[..head_len - 5], bytes.len() as u64).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Truncated { .. }), "{e}");
    // A declared length the tensors do not fit in.
    let e = GgufFile::parse_header(&bytes[..head_len], bytes.len() as u64 - 1).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::DataOutOfFile { .. }), "{e}");
}
