//! Files written by gguf-py (llama.cpp b11434, scripts/gen-gguf-fixtures): llamay must
//! read exactly what gguf-py's own reader reads, and rewrite each little-endian file
//! byte for byte.

use llamay_gguf::{GgufFile, GgufWriter, MappedModel, OpenError, Value};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn expected() -> serde_json::Map<String, Json> {
    let text = std::fs::read_to_string(data_dir().join("expected.json")).unwrap();
    match serde_json::from_str(&text).unwrap() {
        Json::Object(m) => m,
        _ => panic!("expected.json is not an object"),
    }
}

/// gguf-py's value type names → ours.
fn type_name(py: &str) -> &str {
    match py {
        "uint8" => "u8",
        "int8" => "i8",
        "uint16" => "u16",
        "int16" => "i16",
        "uint32" => "u32",
        "int32" => "i32",
        "float32" => "f32",
        "uint64" => "u64",
        "int64" => "i64",
        "float64" => "f64",
        other => other,
    }
}

fn value_matches(v: &Value<'_>, want: &Json) -> bool {
    match v {
        Value::String(s) => want.as_str() == s.to_str(),
        Value::Bool(b) => want.as_bool() == Some(*b),
        Value::F32(x) => want.as_f64() == Some(f64::from(*x)),
        Value::F64(x) => want.as_f64() == Some(*x),
        Value::Array(a) => {
            let want = want.as_array().unwrap();
            a.len() == want.len() && a.iter().zip(want).all(|(v, w)| value_matches(&v, w))
        }
        v => {
            let i = v.as_integer().unwrap();
            want.as_i64().map(i128::from) == Some(i) || want.as_u64().map(i128::from) == Some(i)
        }
    }
}

fn check_file(name: &str, file: &GgufFile<'_>, want: &Json) {
    let meta = want["metadata"].as_object().unwrap();
    assert_eq!(file.metadata.len(), meta.len(), "{name}: key count");
    for (key, w) in meta {
        let v = file
            .metadata
            .get(key)
            .unwrap_or_else(|| panic!("{name}: missing key {key}"));
        assert_eq!(
            v.value_type().name(),
            type_name(w["type"].as_str().unwrap()),
            "{name}: {key} type"
        );
        // gguf-py's reader reports no element type for u8 arrays (null in the JSON).
        if let (Value::Array(a), Some(elem)) = (v, w["elem"].as_str()) {
            assert_eq!(
                a.elem_type().name(),
                type_name(elem),
                "{name}: {key} elem type"
            );
        }
        assert!(
            value_matches(v, &w["value"]),
            "{name}: {key} = {v:?}, gguf-py read {}",
            w["value"]
        );
    }
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(file.tensors.len(), tensors.len(), "{name}: tensor count");
    for (t, w) in file.tensors.iter().zip(tensors) {
        assert_eq!(t.name, w["name"].as_str().unwrap(), "{name}: tensor order");
        assert_eq!(
            t.ty.name(),
            w["type"].as_str().unwrap(),
            "{name}: {} type",
            t.name
        );
        let shape: Vec<u64> = w["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.shape, shape, "{name}: {} shape", t.name);
        assert_eq!(
            t.n_bytes,
            w["n_bytes"].as_u64().unwrap(),
            "{name}: {} bytes",
            t.name
        );
        assert_eq!(
            file.data_offset + t.offset,
            w["offset"].as_u64().unwrap(),
            "{name}: {} offset",
            t.name
        );
        let sha = format!("{:x}", Sha256::digest(t.data));
        assert_eq!(
            sha,
            w["sha256"].as_str().unwrap(),
            "{name}: {} data",
            t.name
        );
    }
}

/// Rewrites a parsed file through our writer.
fn rewrite(file: &GgufFile<'_>) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata.iter() {
        w.add_kv(k, v.clone()).unwrap();
    }
    for t in &file.tensors {
        w.add_tensor(t.name, t.ty, &t.shape).unwrap();
    }
    let mut out = Vec::new();
    w.write(&mut out, |i| Ok(Cow::Borrowed(file.tensors[i].data)))
        .unwrap();
    out
}

#[test]
fn reads_what_gguf_py_reads() {
    let exp = expected();
    let mut checked = 0;
    for (name, want) in &exp {
        if name.starts_with('_') {
            continue;
        }
        let bytes = std::fs::read(data_dir().join(name)).unwrap();
        let file = GgufFile::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(file.big_endian, name.contains("-be"), "{name}: byte order");
        assert_eq!(file.version, 3);
        check_file(name, &file, want);
        checked += 1;
    }
    assert_eq!(checked, 7);
}

#[test]
fn rewriting_a_gguf_py_file_is_byte_identical() {
    for (name, _) in expected() {
        if name.starts_with('_') || name.contains("-be") {
            continue;
        }
        let bytes = std::fs::read(data_dir().join(&name)).unwrap();
        let file = GgufFile::parse(&bytes).unwrap();
        assert!(rewrite(&file) == bytes, "{name}: rewrite differs");
    }
}

#[test]
fn big_endian_file_reads_as_its_little_endian_twin() {
    let be = std::fs::read(data_dir().join("gguf-py-be.gguf")).unwrap();
    let le = std::fs::read(data_dir().join("gguf-py-le.gguf")).unwrap();
    let be = GgufFile::parse(&be).unwrap();
    let le = GgufFile::parse(&le).unwrap();
    assert!(be.big_endian && !le.big_endian);
    let be_meta: Vec<_> = be.metadata.iter().collect();
    let le_meta: Vec<_> = le.metadata.iter().collect();
    assert_eq!(be_meta.len(), le_meta.len());
    for ((kb, vb), (kl, vl)) in be_meta.iter().zip(&le_meta) {
        assert_eq!(kb, kl);
        // Arrays keep raw bytes in file order; compare decoded elements.
        match (vb, vl) {
            (Value::Array(a), Value::Array(b)) => assert!(a.iter().eq(b.iter()), "{kb}"),
            _ => assert_eq!(vb, vl, "{kb}"),
        }
    }
    // F32 tensor data is byte-swapped per element.
    let tb = be.tensor("t.f32").unwrap().data;
    let tl = le.tensor("t.f32").unwrap().data;
    for (b, l) in tb.chunks(4).zip(tl.chunks(4)) {
        assert_eq!([b[3], b[2], b[1], b[0]], l);
    }
}

#[test]
fn split_model_opens_as_one() {
    let first = data_dir().join("gguf-py-split-00001-of-00003.gguf");
    let mapped = MappedModel::open(&first).unwrap();
    assert_eq!(mapped.paths().count(), 3);
    let model = mapped.parse().unwrap();
    assert!(model.is_split());
    let names: Vec<_> = model.tensors().map(|t| t.name).collect();
    assert_eq!(names, ["t.f32", "t.f16", "t.1d", "t.q8_0", "t.q4_k"]);
    assert_eq!(
        model.metadata().get_str("general.architecture").unwrap(),
        Some("testarch")
    );
    assert_eq!(model.tensor("t.q4_k").unwrap().n_bytes, 144);

    let second = data_dir().join("gguf-py-split-00002-of-00003.gguf");
    let err = MappedModel::open(&second).err().unwrap();
    assert!(matches!(err, OpenError::Split { .. }), "{err}");
    assert!(err.to_string().contains("open the first shard"), "{err}");
}

#[test]
fn split_model_with_a_missing_shard_is_refused() {
    let dir = std::env::temp_dir().join(format!("llamay-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 1..=2 {
        let name = format!("gguf-py-split-0000{i}-of-00003.gguf");
        std::fs::copy(data_dir().join(&name), dir.join(&name)).unwrap();
    }
    let err = MappedModel::open(&dir.join("gguf-py-split-00001-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("00003-of-00003"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn single_file_model_and_open_errors() {
    let m = MappedModel::open(&data_dir().join("gguf-py-le.gguf")).unwrap();
    let model = m.parse().unwrap();
    assert!(!model.is_split());
    assert_eq!(model.tensor_count(), 5);
    let err = MappedModel::open(&data_dir().join("no-such-file.gguf"))
        .err()
        .unwrap();
    assert!(matches!(err, OpenError::Io { .. }), "{err}");
    let err = MappedModel::open(&data_dir()).err().unwrap();
    assert!(matches!(err, OpenError::NotAFile { .. }), "{err}");
}
