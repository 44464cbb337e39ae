//! Structure-aware: the input picks a table row, a weight format and a shape, then up to
//! eight hostile mutations (dimensions 0 or huge, types swapped, tensors dropped or
//! added, metadata keys removed or given hostile values). llamay-synth writes the result
//! through the GGUF writer, so every input is a container the parser accepts and the
//! fuzzer's time goes to `Model::check`, `Model::load` and one decode step. The oracle
//! (`llamay_synth::exercise`): no panic; check and load agree, error for error; a model
//! that loads decodes a valid batch.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(m) = llamay_synth::hostile(data) {
        llamay_synth::exercise(&m.bytes);
    }
});
