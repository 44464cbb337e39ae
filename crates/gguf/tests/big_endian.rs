//! A big-endian file opened by `MappedModel::open`: tensor data of a format with a
//! defined big-endian layout is rewritten into the little-endian one; a format
//! without one stays as it is and is named by `big_endian_data` (the engine refuses
//! it by that name). The engine test portable_bits runs whole big-endian models.

use llamay_gguf::MappedModel;

fn be_string(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_be_bytes());
    h.extend_from_slice(s.as_bytes());
}

#[test]
fn big_endian_data_is_little_endian_after_open_where_the_format_defines_it() {
    const F32: u32 = 0;
    const Q5_K: u32 = 13;
    let values = [1.0f32, 2.0, -3.5, 0.25];
    let mut h = Vec::new();
    h.extend_from_slice(b"GGUF");
    h.extend_from_slice(&3u32.to_be_bytes());
    h.extend_from_slice(&2u64.to_be_bytes()); // tensors
    h.extend_from_slice(&1u64.to_be_bytes()); // metadata
    be_string(&mut h, "general.architecture");
    h.extend_from_slice(&8u32.to_be_bytes());
    be_string(&mut h, "llama");
    for (name, n, ty, offset) in [("a.weight", 4u64, F32, 0u64), ("b.weight", 256, Q5_K, 32)] {
        be_string(&mut h, name);
        h.extend_from_slice(&1u32.to_be_bytes());
        h.extend_from_slice(&n.to_be_bytes());
        h.extend_from_slice(&ty.to_be_bytes());
        h.extend_from_slice(&offset.to_be_bytes());
    }
    h.resize(h.len().next_multiple_of(32), 0);
    h.extend(values.iter().flat_map(|v| v.to_be_bytes()));
    h.resize(h.len() + 16, 0);
    let q5k: Vec<u8> = (0..176).map(|i| i as u8).collect();
    h.extend_from_slice(&q5k);

    let path = std::env::temp_dir().join(format!("llamay-be-{}.gguf", std::process::id()));
    std::fs::write(&path, &h).unwrap();
    let mapped = MappedModel::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let model = mapped.parse().unwrap();
    assert!(model.big_endian());
    let a = model.tensor("a.weight").unwrap();
    assert!(!model.big_endian_data(a));
    let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(a.data, le.as_slice());
    let b = model.tensor("b.weight").unwrap();
    assert!(
        model.big_endian_data(b),
        "Q5_K has no defined big-endian layout"
    );
    assert_eq!(b.data, q5k.as_slice(), "left as it is");
}
