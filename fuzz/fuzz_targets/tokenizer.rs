//! Fuzz tokenizer loading and tokenising: the input is a GGUF file followed by
//! text after a 0xFF 0xFE 0xFD separator (or all text for a fixed small vocab).
//! Any panic is a bug: bad vocabularies must be load errors.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamay_gguf::GgufFile;
use llamay_tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let sep = data.windows(3).position(|w| w == [0xFF, 0xFE, 0xFD]);
    let (file, text) = match sep {
        Some(i) => (&data[..i], &data[i + 3..]),
        None => (data, &b"Hello, world! <s> \xe2\x96\x81 \xf0\x9f\x98\x80 12345\n\t x"[..]),
    };
    let Ok(parsed) = GgufFile::parse(file) else { return };
    let Ok(tok) = Tokenizer::from_metadata(&parsed.metadata) else { return };
    for (add, parse) in [(false, false), (true, true)] {
        let ids = tok.encode(text, add, parse);
        let _ = tok.decode(&ids);
        let mut s = tok.stream_decoder();
        for &id in &ids {
            let _ = s.push(id);
        }
        let _ = s.finish();
    }
    let _ = tok.decode(&[u32::MAX, 0, 1]);
});
