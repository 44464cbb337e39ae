//! The hub's readers of outside data: model references (typed by users, sent by API
//! clients), stored manifests, and the header-only GGUF parse `validate` runs on a
//! remote file's first bytes (with any declared length). None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamay_gguf::GgufFile;
use llamay_hub::{Manifest, Reference, check_digest};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => {
            if let Ok(s) = std::str::from_utf8(rest)
                && let Ok(r) = Reference::parse_name(s)
            {
                // The canonical form names the same thing (the store keys models by it).
                let again = Reference::parse_name(&r.to_string());
                assert!(again.as_ref() == Ok(&r), "{s:?} -> {r} re-parses as {again:?}");
            }
        }
        1 => {
            if let Ok(m) = serde_json::from_slice::<Manifest>(rest) {
                for l in &m.layers {
                    let _ = check_digest(&l.digest);
                }
            }
        }
        _ => {
            let (len, bytes) = rest.split_at(rest.len().min(8));
            let mut n = [0u8; 8];
            n[..len.len()].copy_from_slice(len);
            let _ = GgufFile::parse_header(bytes, u64::from_le_bytes(n));
        }
    }
});
