//! Files and tensors larger than the target's address space: refused by name on a
//! 32-bit build (scripts/test-cross runs this under qemu-i386), opened on a 64-bit one.
//! The files are sparse: only their headers are written.

use llamay_gguf::{ErrorKind, GgufFile, MappedModel, OpenError};
use std::io::Write;
use std::path::PathBuf;

const F32: u32 = 0;

/// A GGUF header declaring F32 tensors of the given element counts, and the whole
/// file's length (header padded to 32, then the tensors back to back).
fn header(tensors: &[(&str, u64)]) -> (Vec<u8>, u64) {
    let mut h = Vec::new();
    h.extend_from_slice(b"GGUF");
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    h.extend_from_slice(&1u64.to_le_bytes());
    let key = b"general.architecture";
    h.extend_from_slice(&(key.len() as u64).to_le_bytes());
    h.extend_from_slice(key);
    h.extend_from_slice(&8u32.to_le_bytes()); // string
    h.extend_from_slice(&5u64.to_le_bytes());
    h.extend_from_slice(b"llama");
    let mut offset = 0u64;
    for (name, n) in tensors {
        h.extend_from_slice(&(name.len() as u64).to_le_bytes());
        h.extend_from_slice(name.as_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&n.to_le_bytes());
        h.extend_from_slice(&F32.to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        offset += n * 4;
    }
    h.resize(h.len().next_multiple_of(32), 0);
    let len = h.len() as u64 + offset;
    (h, len)
}

fn sparse_file(name: &str, tensors: &[(&str, u64)]) -> (PathBuf, Vec<u8>, u64) {
    let (h, len) = header(tensors);
    let path = std::env::temp_dir().join(format!("llamay-{}-{name}.gguf", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&h).unwrap();
    f.set_len(len).unwrap();
    (path, h, len)
}

const BITS32: bool = cfg!(target_pointer_width = "32");

#[test]
fn a_tensor_beyond_the_address_space_is_refused_by_name() {
    // 1_342_177_280 F32 values: 5.4 GB.
    let (path, h, len) = sparse_file("5gb-tensor", &[("blk.0.ffn_up.weight", 1_342_177_280)]);
    let parsed = GgufFile::parse_header(&h, len);
    let opened = MappedModel::open(&path);
    std::fs::remove_file(&path).unwrap();
    if BITS32 {
        let e = match parsed {
            Ok(_) => panic!("a 5.4 GB tensor parses on a 32-bit build"),
            Err(e) => e,
        };
        assert!(
            matches!(e.kind, ErrorKind::BeyondAddressSpace { .. }),
            "{e}"
        );
        let msg = match opened {
            Ok(_) => panic!("a 5.4 GB file opens on a 32-bit build"),
            Err(e) => e,
        }
        .to_string();
        eprintln!("{msg}");
        assert!(
            msg.contains("tensor 'blk.0.ffn_up.weight'")
                && msg.contains("is 5.4 GB")
                && msg.contains("this 32-bit build addresses at most 2.1 GB"),
            "{msg}"
        );
    } else {
        assert_eq!(parsed.unwrap().tensors[0].n_bytes, 5_368_709_120);
        let mapped = opened.unwrap();
        let model = mapped.parse().unwrap();
        assert_eq!(
            model.tensor("blk.0.ffn_up.weight").unwrap().data.len(),
            5_368_709_120u64 as usize
        );
    }
}

#[test]
fn a_file_beyond_the_address_space_is_refused_with_its_size() {
    // Two tensors of 1.6 GB each: each fits a 32-bit slice, the file does not.
    let n = 400_000_000;
    let (path, _, _) = sparse_file("3gb-file", &[("a.weight", n), ("b.weight", n)]);
    let opened = MappedModel::open(&path);
    std::fs::remove_file(&path).unwrap();
    if BITS32 {
        let e = match opened {
            Ok(_) => panic!("a 3.2 GB file opens on a 32-bit build"),
            Err(e) => e,
        };
        assert!(matches!(e, OpenError::BeyondAddressSpace { .. }), "{e}");
        let msg = e.to_string();
        eprintln!("{msg}");
        assert!(
            msg.contains("the file is 3.2 GB; this 32-bit build maps at most 2.1 GB"),
            "{msg}"
        );
    } else {
        assert_eq!(opened.unwrap().parse().unwrap().tensor_count(), 2);
    }
}
