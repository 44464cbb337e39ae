//! Tokenising speed: `cargo run --release -p llamay-tokenizer --example tokbench -- VOCAB.gguf TEXT`
//! (add_special = false, parse_special = false, as `test-tokenizer-0 VOCAB TEXT`,
//! which prints llama.cpp's time for the same call). Prints ms and token count.
use llamay_gguf::MappedModel;
use llamay_tokenizer::Tokenizer;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 3 {
        eprintln!("usage: tokbench VOCAB.gguf TEXT");
        std::process::exit(1);
    }
    let m = MappedModel::open(std::path::Path::new(&a[1])).expect("open");
    let p = m.parse().expect("parse");
    let t = Tokenizer::from_metadata(p.metadata()).expect("tokenizer");
    let text = std::fs::read(&a[2]).expect("text");
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        n = t.encode(&text, false, false).len();
        best = best.min(t0.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "tokenized {} bytes in {best:.3} ms (llamay), {n} tokens",
        text.len()
    );
}
