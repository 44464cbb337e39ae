//! The server's readers of request bodies: every route's parser (fields read and
//! range-checked before any model is touched) on arbitrary JSON, and the field helpers
//! on arbitrary values. None may panic; an accepted request holds only values in range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamay_server::{ollama, openai, params, responses};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((&route, rest)) = data.split_first() else { return };
    let Ok(v) = serde_json::from_slice::<Value>(rest) else { return };
    let _ = params::keep_alive(Some(&v));
    let Value::Object(body) = v else { return };
    match route % 5 {
        0 => drop(ollama::GenerateRequest::parse(&body)),
        1 => drop(ollama::ChatRequest::parse(&body)),
        2 => drop(openai::ChatRequest::parse(&body)),
        3 => drop(responses::parse(&body)),
        _ => drop(openai::CompletionRequest::parse(&body)),
    }
});
