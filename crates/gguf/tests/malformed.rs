//! The malformed-file suite: the classes of llama.cpp's tests/test-gguf.cpp and
//! Ollama's malformed-metadata tests, each refused with its own error kind at the right
//! byte offset, and none able to panic the reader.

use llamay_formats::TypeIdError;
use llamay_gguf::{ErrorKind, GgufError, GgufFile};

const STRING: u32 = 8;
const ARRAY: u32 = 9;
const U32: u32 = 4;
const U64: u32 = 10;
const BOOL: u32 = 7;
const F32_T: u32 = 0;
const Q8_0_T: u32 = 8;

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

fn string(b: &mut Vec<u8>, s: &[u8]) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s);
}

fn kv(b: &mut Vec<u8>, key: &[u8], ty: u32, payload: &[u8]) {
    string(b, key);
    b.extend(ty.to_le_bytes());
    b.extend(payload);
}

fn str_payload(s: &str) -> Vec<u8> {
    let mut p = Vec::new();
    string(&mut p, s.as_bytes());
    p
}

fn tensor_info(b: &mut Vec<u8>, name: &[u8], dims: &[u64], ty: u32, offset: u64) {
    string(b, name);
    b.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend(d.to_le_bytes());
    }
    b.extend(ty.to_le_bytes());
    b.extend(offset.to_le_bytes());
}

fn pad(b: &mut Vec<u8>, align: usize) {
    while !b.len().is_multiple_of(align) {
        b.push(0);
    }
}

/// A file with one tensor info built from the arguments and data sized to fit, so that
/// only the tensor info is in question.
fn with_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header(3, 1, 0);
    tensor_info(&mut b, b"t", dims, ty, offset);
    pad(&mut b, 32);
    b.resize(b.len() + data_len, 0x11);
    b
}

/// A valid file whose last tensor ends exactly at the end of the file (no trailing
/// padding), so every strict prefix of it is malformed.
fn valid_file() -> Vec<u8> {
    let mut b = header(3, 2, 4);
    kv(
        &mut b,
        b"general.architecture",
        STRING,
        &str_payload("llama"),
    );
    kv(&mut b, b"general.alignment", U32, &32u32.to_le_bytes());
    let mut arr = STRING.to_le_bytes().to_vec();
    arr.extend(2u64.to_le_bytes());
    string(&mut arr, b"a");
    string(&mut arr, "ü".as_bytes());
    kv(&mut b, b"tokenizer.ggml.tokens", ARRAY, &arr);
    kv(&mut b, b"x.flag", BOOL, &[1]);
    tensor_info(&mut b, b"a", &[4], F32_T, 0);
    tensor_info(&mut b, b"b", &[32, 1], Q8_0_T, 32);
    pad(&mut b, 32);
    b.extend([0u8; 16]); // a: 4 f32
    b.extend([0u8; 16]); // padding to 32
    b.extend([0u8; 34]); // b: one Q8_0 block
    b
}

fn err(bytes: &[u8]) -> GgufError {
    match GgufFile::parse(bytes) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => e,
    }
}

#[test]
fn the_valid_baseline_parses() {
    let b = valid_file();
    let f = GgufFile::parse(&b).unwrap();
    assert_eq!(f.tensors.len(), 2);
    assert_eq!(
        f.metadata.get_str("general.architecture").unwrap(),
        Some("llama")
    );
    assert_eq!(f.tensor("b").unwrap().data.len(), 34);
}

#[test]
fn truncation_anywhere_is_refused() {
    let b = valid_file();
    for len in 0..b.len() {
        let e = err(&b[..len]);
        assert!(
            matches!(
                e.kind,
                ErrorKind::Truncated { .. } | ErrorKind::DataOutOfFile { .. }
            ),
            "prefix {len}: {e}"
        );
        assert!(e.offset <= b.len() as u64);
    }
}

#[test]
fn bad_magic_and_versions() {
    let mut b = valid_file();
    b[0] = b'X';
    assert!(matches!(err(&b).kind, ErrorKind::BadMagic(_)));
    for (v, want) in [(1u32, "1"), (0, "0"), (4, "4"), (u32::MAX, "max")] {
        let mut b = valid_file();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let e = err(&b);
        match want {
            "1" => assert_eq!(e.kind, ErrorKind::Version1),
            _ => assert!(matches!(e.kind, ErrorKind::UnknownVersion(_)), "{e}"),
        }
        assert_eq!(e.offset, 4);
    }
    // Big-endian version 1 is also version 1.
    let mut b = valid_file();
    b[4..8].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(err(&b).kind, ErrorKind::Version1);
    assert!(err(&b).to_string().contains("version 1"));
    // Version 2 parses.
    let mut b = valid_file();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(GgufFile::parse(&b).unwrap().version, 2);
}

#[test]
fn huge_counts() {
    let b = header(3, u64::MAX, 0);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "tensor count",
            ..
        }
    ));
    let b = header(3, 0, u64::MAX);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "metadata key/value count",
            ..
        }
    ));
    // Within the caps but more than the file can hold: refused before allocating.
    let b = header(3, 1 << 20, 1 << 16);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::Truncated {
            what: "declared metadata and tensor infos",
            ..
        }
    ));
}

#[test]
fn key_problems() {
    let mut b = header(3, 0, 1);
    b.extend(u64::MAX.to_le_bytes());
    b.extend([0u8; 16]);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "metadata key",
            ..
        }
    ));

    let mut b = header(3, 0, 1);
    b.extend(1000u64.to_le_bytes());
    b.extend([b'k'; 20]);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::Truncated {
            what: "metadata key",
            ..
        }
    ));

    let mut b = header(3, 0, 1);
    kv(&mut b, b"", U32, &[0; 4]);
    assert_eq!(err(&b).kind, ErrorKind::EmptyKey);

    let mut b = header(3, 0, 1);
    kv(&mut b, b"bad\xff\xfekey", U32, &[0; 4]);
    assert!(matches!(err(&b).kind, ErrorKind::InvalidUtf8 { .. }));

    let mut b = header(3, 0, 2);
    kv(&mut b, b"k", U32, &[0; 4]);
    let second = b.len() as u64;
    kv(&mut b, b"k", U32, &[0; 4]);
    let e = err(&b);
    assert_eq!(e.kind, ErrorKind::DuplicateKey("k".into()));
    assert_eq!(e.offset, second);
}

#[test]
fn value_problems() {
    for ty in [13u32, 255, u32::MAX] {
        let mut b = header(3, 0, 1);
        kv(&mut b, b"k", ty, &[0; 8]);
        assert_eq!(err(&b).kind, ErrorKind::BadValueType(ty));
    }
    // A string value whose length runs past the end, and one past the cap.
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", STRING, &100u64.to_le_bytes());
    assert!(matches!(
        err(&b).kind,
        ErrorKind::Truncated {
            what: "string value",
            ..
        }
    ));
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", STRING, &u64::MAX.to_le_bytes());
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "string value",
            ..
        }
    ));
    // Booleans other than 0/1.
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", BOOL, &[2]);
    assert_eq!(err(&b).kind, ErrorKind::BadBool(2));
    let mut arr = BOOL.to_le_bytes().to_vec();
    arr.extend(3u64.to_le_bytes());
    arr.extend([1, 0, 5]);
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &arr);
    let e = err(&b);
    assert_eq!(e.kind, ErrorKind::BadBool(5));
    assert_eq!(e.offset, b.len() as u64 - 1);
    // A truncated scalar.
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", U64, &[1, 2, 3]);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::Truncated {
            what: "scalar value",
            ..
        }
    ));
}

#[test]
fn array_problems() {
    let mut nested = ARRAY.to_le_bytes().to_vec();
    nested.extend(1u64.to_le_bytes());
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &nested);
    assert_eq!(err(&b).kind, ErrorKind::NestedArray);

    let mut huge = U32.to_le_bytes().to_vec();
    huge.extend(u64::MAX.to_le_bytes());
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &huge);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "array length",
            ..
        }
    ));

    // Under the cap, more than the file holds: refused before any allocation.
    let mut long = U64.to_le_bytes().to_vec();
    long.extend((1u64 << 25).to_le_bytes());
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &long);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::Truncated {
            what: "array elements",
            ..
        }
    ));

    let mut strings = STRING.to_le_bytes().to_vec();
    strings.extend(2u64.to_le_bytes());
    string(&mut strings, b"ok");
    strings.extend(u64::MAX.to_le_bytes());
    strings.extend([0u8; 8]);
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &strings);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "string array element",
            ..
        }
    ));

    let mut bad_elem = 77u32.to_le_bytes().to_vec();
    bad_elem.extend(0u64.to_le_bytes());
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &bad_elem);
    assert_eq!(err(&b).kind, ErrorKind::BadValueType(77));

    // An empty array is valid (llama.cpp reads them).
    let mut empty = U32.to_le_bytes().to_vec();
    empty.extend(0u64.to_le_bytes());
    let mut b = header(3, 0, 1);
    kv(&mut b, b"k", ARRAY, &empty);
    let f = GgufFile::parse(&b).unwrap();
    assert!(f.metadata.get_array("k").unwrap().unwrap().is_empty());
}

#[test]
fn alignment_problems() {
    for (ty, payload) in [
        (U64, 32u64.to_le_bytes().to_vec()),
        (STRING, str_payload("32")),
    ] {
        let mut b = header(3, 0, 1);
        kv(&mut b, b"general.alignment", ty, &payload);
        assert!(
            matches!(err(&b).kind, ErrorKind::AlignmentType(_)),
            "{}",
            err(&b)
        );
    }
    for a in [0u32, 3, 48, 1 << 21] {
        let mut b = header(3, 0, 1);
        kv(&mut b, b"general.alignment", U32, &a.to_le_bytes());
        assert_eq!(err(&b).kind, ErrorKind::BadAlignment(a.into()));
    }
    let mut b = header(3, 0, 1);
    kv(&mut b, b"general.alignment", U32, &64u32.to_le_bytes());
    assert_eq!(GgufFile::parse(&b).unwrap().alignment, 64);
}

#[test]
fn tensor_name_problems() {
    let mut b = header(3, 1, 0);
    tensor_info(&mut b, b"", &[4], F32_T, 0);
    assert_eq!(err(&b).kind, ErrorKind::EmptyTensorName);

    let mut b = header(3, 1, 0);
    tensor_info(&mut b, &[b'n'; 64], &[4], F32_T, 0);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::TooLarge {
            what: "tensor name",
            ..
        }
    ));

    let mut b = header(3, 1, 0);
    tensor_info(&mut b, b"\xc3(", &[4], F32_T, 0);
    assert!(matches!(
        err(&b).kind,
        ErrorKind::InvalidUtf8 {
            what: "tensor name"
        }
    ));

    let mut b = header(3, 2, 0);
    tensor_info(&mut b, b"t", &[4], F32_T, 0);
    tensor_info(&mut b, b"t", &[4], F32_T, 32);
    pad(&mut b, 32);
    b.resize(b.len() + 64, 0);
    assert_eq!(err(&b).kind, ErrorKind::DuplicateTensor("t".into()));
}

#[test]
fn shape_problems() {
    assert_eq!(
        err(&with_tensor(&[1, 1, 1, 1, 1], F32_T, 0, 4)).kind,
        ErrorKind::TooManyDims(5)
    );
    let e = err(&with_tensor(&[4, 1 << 63], F32_T, 0, 16));
    assert_eq!(
        e.kind,
        ErrorKind::NegativeDim {
            index: 1,
            value: 1 << 63
        }
    );
    assert!(matches!(
        err(&with_tensor(&[1 << 32, 1 << 32], F32_T, 0, 16)).kind,
        ErrorKind::ElementOverflow(_)
    ));
    assert!(matches!(
        err(&with_tensor(&[1 << 62], F32_T, 0, 16)).kind,
        ErrorKind::SizeOverflow { .. }
    ));
    let e = err(&with_tensor(&[33, 2], Q8_0_T, 0, 1024));
    assert_eq!(
        e.kind,
        ErrorKind::RowNotBlockMultiple {
            ty: "Q8_0",
            block: 32,
            ne0: 33
        }
    );
    // Zero-sized and zero-dimensional tensors are well-formed.
    GgufFile::parse(&with_tensor(&[0, 4], F32_T, 0, 0)).unwrap();
    GgufFile::parse(&with_tensor(&[], F32_T, 0, 4)).unwrap();
}

#[test]
fn tensor_type_problems() {
    let e = err(&with_tensor(&[32], 100, 0, 64));
    assert_eq!(
        e.kind,
        ErrorKind::TensorType(TypeIdError::Unknown { id: 100 })
    );
    assert!(e.to_string().contains("100"));
    let e = err(&with_tensor(&[32], 31, 0, 64));
    assert!(matches!(
        e.kind,
        ErrorKind::TensorType(TypeIdError::Removed {
            id: 31,
            name: "Q4_0_4_4"
        })
    ));
    // IQ1_S is a valid container type: the parser reads it, the loader refuses it.
    let b = with_tensor(&[256], 19, 0, 50);
    let f = GgufFile::parse(&b).unwrap();
    assert_eq!(f.tensors[0].ty.name(), "IQ1_S");
}

#[test]
fn offset_problems() {
    let e = err(&with_tensor(&[4], F32_T, 8, 64));
    assert_eq!(
        e.kind,
        ErrorKind::MisalignedOffset {
            offset: 8,
            alignment: 32
        }
    );

    let e = err(&with_tensor(&[4], F32_T, 32, 40));
    assert!(matches!(e.kind, ErrorKind::DataOutOfFile { .. }), "{e}");
    let e = err(&with_tensor(&[4], F32_T, u64::MAX - 31, 40));
    assert!(matches!(e.kind, ErrorKind::DataOutOfFile { .. }), "{e}");

    // A first tensor whose end overflows u64 (found by the fuzzer: the overlap check
    // added the offsets unchecked).
    let mut b = header(3, 2, 0);
    tensor_info(&mut b, b"a", &[16], F32_T, u64::MAX - 31);
    tensor_info(&mut b, b"b", &[4], F32_T, 32);
    pad(&mut b, 32);
    b.resize(b.len() + 256, 0);
    let e = err(&b);
    assert!(matches!(e.kind, ErrorKind::Overlap { .. }), "{e}");

    // Overlapping, and out of order.
    for second in [0u64, 32] {
        let mut b = header(3, 2, 0);
        tensor_info(&mut b, b"a", &[16], F32_T, 32);
        tensor_info(&mut b, b"b", &[4], F32_T, second);
        pad(&mut b, 32);
        b.resize(b.len() + 256, 0);
        let e = err(&b);
        assert!(matches!(e.kind, ErrorKind::Overlap { .. }), "{e}");
    }
}

#[test]
fn errors_name_field_and_offset() {
    let mut b = header(3, 0, 2);
    kv(&mut b, b"ok", U32, &[0; 4]);
    let at = b.len() as u64;
    kv(&mut b, b"general.alignment", U32, &7u32.to_le_bytes());
    let e = err(&b);
    assert_eq!(e.offset, at);
    let msg = e.to_string();
    assert!(
        msg.contains("general.alignment") && msg.contains(&format!("byte {at}")),
        "{msg}"
    );
}

#[test]
fn single_byte_corruptions_never_panic() {
    let b = valid_file();
    for i in 0..b.len() {
        for v in [0u8, 1, 0x7f, 0x80, 0xff, b[i].wrapping_add(1)] {
            let mut m = b.clone();
            m[i] = v;
            let _ = GgufFile::parse(&m);
        }
    }
}
