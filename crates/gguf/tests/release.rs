//! `MappedModel::release`: dropping the resident pages behind a tensor leaves its bytes
//! readable and unchanged (they fault back in from the file), and slices that are not
//! inside a mapping are refused (nothing released).

use llamay_formats::GgmlType;
use llamay_gguf::{GgufWriter, MappedModel, Value};
use std::borrow::Cow;

#[test]
fn released_tensor_pages_read_back_unchanged() {
    let n = 64 * 1024; // f32 values: 256 KiB, many whole pages
    let data: Vec<u8> = (0..n as u32)
        .flat_map(|i| (i.wrapping_mul(2_654_435_761)).to_le_bytes())
        .collect();
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String("test".into()))
        .unwrap();
    w.add_tensor("big", GgmlType::F32, &[n as u64]).unwrap();
    let mut bytes = Vec::new();
    w.write(&mut bytes, |_| Ok(Cow::Borrowed(&data[..])))
        .unwrap();
    let dir = std::env::temp_dir().join(format!("llamay-release-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.gguf");
    std::fs::write(&path, &bytes).unwrap();

    let mapped = MappedModel::open(&path).unwrap();
    let model = mapped.parse().unwrap();
    let t = model.tensor("big").unwrap();
    assert_eq!(t.data, &data[..]);
    let released = mapped.release(t.data);
    assert!(
        released >= data.len() - 2 * 4096,
        "released {released} of {} bytes",
        data.len()
    );
    assert_eq!(released % 4096, 0);
    // The bytes are still the file's.
    assert_eq!(t.data, &data[..]);
    // A slice outside every mapping releases nothing.
    assert_eq!(mapped.release(&data), 0);
    std::fs::remove_dir_all(&dir).ok();
}
