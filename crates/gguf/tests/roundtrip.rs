//! Property: any metadata and tensor table the writer accepts, the reader reads back
//! identically, and rewriting what was read reproduces the file byte for byte.

use llamay_formats::{ALL_TYPES, GgmlType};
use llamay_gguf::{Array, GgufFile, GgufStr, GgufWriter, Value, ValueType};
use proptest::prelude::*;
use std::borrow::Cow;

/// Scalars of the `i`-th fixed-size type.
fn scalar_of(i: usize) -> BoxedStrategy<Value<'static>> {
    match i {
        0 => any::<u8>().prop_map(Value::U8).boxed(),
        1 => any::<i8>().prop_map(Value::I8).boxed(),
        2 => any::<u16>().prop_map(Value::U16).boxed(),
        3 => any::<i16>().prop_map(Value::I16).boxed(),
        4 => any::<u32>().prop_map(Value::U32).boxed(),
        5 => any::<i32>().prop_map(Value::I32).boxed(),
        6 => (-1e30f32..1e30).prop_map(Value::F32).boxed(),
        7 => any::<bool>().prop_map(Value::Bool).boxed(),
        8 => any::<u64>().prop_map(Value::U64).boxed(),
        9 => any::<i64>().prop_map(Value::I64).boxed(),
        _ => (-1e300f64..1e300).prop_map(Value::F64).boxed(),
    }
}

const N_SCALAR_TYPES: usize = 11;

fn scalar() -> impl Strategy<Value = Value<'static>> {
    (0..N_SCALAR_TYPES).prop_flat_map(scalar_of)
}

fn leak(s: String) -> GgufStr<'static> {
    GgufStr(Box::leak(s.into_bytes().into_boxed_slice()))
}

fn value() -> impl Strategy<Value = Value<'static>> {
    prop_oneof![
        4 => scalar(),
        2 => ".{0,40}".prop_map(|s| Value::String(leak(s))),
        1 => prop::collection::vec(".{0,12}", 0..20)
            .prop_map(|v| Value::Array(Array::strings(v.into_iter().map(leak).collect()))),
        2 => (0..N_SCALAR_TYPES, 0usize..40).prop_flat_map(|(i, n)| {
            prop::collection::vec(scalar_of(i), n).prop_map(|vals| {
                let ty = vals.first().map_or(ValueType::U8, Value::value_type);
                Value::Array(Array::from_values(ty, &vals).expect("one type"))
            })
        }),
    ]
}

#[derive(Debug, Clone)]
struct Tensor {
    ty: GgmlType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn tensor() -> impl Strategy<Value = Tensor> {
    (
        0..ALL_TYPES.len(),
        1u64..4,
        prop::collection::vec(1u64..4, 0..3),
    )
        .prop_flat_map(|(t, blocks, rest)| {
            let ty = ALL_TYPES[t];
            let mut shape = vec![blocks * ty.block_size()];
            shape.extend(rest);
            let n: u64 = shape.iter().product();
            let len = ty.bytes_for(n).unwrap() as usize;
            prop::collection::vec(any::<u8>(), len).prop_map(move |data| Tensor {
                ty,
                shape: shape.clone(),
                data,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn write_then_read_is_identity(
        kvs in prop::collection::btree_map("[a-z]{1,6}(\\.[a-z_]{1,8}){0,3}", value(), 0..24),
        tensors in prop::collection::vec(tensor(), 0..6),
        align_log2 in 0u32..9,
    ) {
        let alignment = 1u32 << align_log2;
        let mut w = GgufWriter::new();
        w.add_kv("general.alignment", Value::U32(alignment)).unwrap();
        for (k, v) in &kvs {
            if k != "general.alignment" {
                w.add_kv(k, v.clone()).unwrap();
            }
        }
        for (i, t) in tensors.iter().enumerate() {
            w.add_tensor(&format!("tensor.{i}"), t.ty, &t.shape).unwrap();
        }
        let mut bytes = Vec::new();
        w.write(&mut bytes, |i| Ok(Cow::Borrowed(&tensors[i].data[..]))).unwrap();

        let f = GgufFile::parse(&bytes).unwrap();
        prop_assert_eq!(f.alignment, u64::from(alignment));
        prop_assert_eq!(f.data_offset % u64::from(alignment), 0);
        prop_assert_eq!(f.metadata.get("general.alignment"), Some(&Value::U32(alignment)));
        for (k, v) in &kvs {
            if k != "general.alignment" {
                prop_assert_eq!(f.metadata.get(k), Some(v), "key {}", k);
            }
        }
        prop_assert_eq!(f.tensors.len(), tensors.len());
        for (i, (got, want)) in f.tensors.iter().zip(&tensors).enumerate() {
            prop_assert_eq!(got.name, format!("tensor.{i}"));
            prop_assert_eq!(got.ty, want.ty);
            prop_assert_eq!(&got.shape, &want.shape);
            prop_assert_eq!(got.data, &want.data[..]);
        }

        // Read → write reproduces the bytes.
        let mut w2 = GgufWriter::new();
        for (k, v) in f.metadata.iter() {
            w2.add_kv(k, v.clone()).unwrap();
        }
        for t in &f.tensors {
            w2.add_tensor(t.name, t.ty, &t.shape).unwrap();
        }
        let mut again = Vec::new();
        w2.write(&mut again, |i| Ok(Cow::Borrowed(f.tensors[i].data))).unwrap();
        prop_assert!(again == bytes);
    }
}

#[test]
fn writer_refuses_what_the_reader_would() {
    let mut w = GgufWriter::new();
    w.add_kv("k", Value::U8(1)).unwrap();
    assert!(w.add_kv("k", Value::U8(2)).is_err(), "duplicate key");
    assert!(w.add_kv("", Value::U8(2)).is_err(), "empty key");
    assert!(
        w.add_kv("general.alignment", Value::U32(3)).is_err(),
        "alignment not a power of two"
    );
    assert!(
        w.add_kv("general.alignment", Value::U64(32)).is_err(),
        "alignment not u32"
    );
    assert!(
        w.add_tensor("t", GgmlType::Q8_0, &[33]).is_err(),
        "row not a block multiple"
    );
    assert!(
        w.add_tensor("t", GgmlType::F32, &[1, 1, 1, 1, 1]).is_err(),
        "five dims"
    );
    assert!(
        w.add_tensor(&"n".repeat(64), GgmlType::F32, &[1]).is_err(),
        "long name"
    );
    w.add_tensor("t", GgmlType::F32, &[4]).unwrap();
    assert!(
        w.add_tensor("t", GgmlType::F32, &[4]).is_err(),
        "duplicate tensor"
    );
    let mut out = Vec::new();
    let e = w
        .write(&mut out, |_| Ok(Cow::Owned(vec![0; 15])))
        .unwrap_err();
    assert!(
        e.to_string().contains("15 bytes supplied, 16 declared"),
        "{e}"
    );
    assert_eq!(Array::from_values(ValueType::U8, &[Value::U16(1)]), None);
}
