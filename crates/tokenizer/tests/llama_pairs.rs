//! llama.cpp's own tokenizer test pairs (`models/ggml-vocab-*.gguf.inp/.out`), for
//! every vocabulary llama.cpp b11434 runs them for (tests/CMakeLists.txt):
//! add_special = false, parse_special = false, ids equal section by section.
//!
//! Needs the reference tree: run `scripts/fetch-ref` and export
//! `LLAMAY_REF_TREE=<the path it prints>`. Without it: fails under scripts/test, skips saying why elsewhere.

mod common;

use common::VOCABS;
use llamay_gguf::MappedModel;
use llamay_tokenizer::Tokenizer;

fn load(path: &std::path::Path) -> Tokenizer {
    let mapped = MappedModel::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let model = mapped
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_metadata(model.metadata()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_pairs(base: &std::path::Path) -> Vec<(Vec<u8>, Vec<u32>)> {
    let inp = std::fs::read(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let sep = b"\n__ggml_vocab_test__\n";
    let mut sinp = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match memfind(&inp[pos..], sep) {
            Some(i) => {
                sinp.push(inp[pos..pos + i].to_vec());
                pos += i + sep.len();
            }
            None => {
                sinp.push(inp[pos..].to_vec());
                break;
            }
        }
    }
    let sout: Vec<Vec<u32>> = out
        .split('\n')
        .collect::<Vec<_>>()
        .iter()
        .take(sinp.len())
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse::<u32>().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(sinp.len(), sout.len(), "{}", base.display());
    sinp.into_iter().zip(sout).collect()
}

fn memfind(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

#[test]
fn llama_cpp_vocab_pairs() {
    let Some(tree) =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")
    else {
        return;
    };
    let mut failures = Vec::new();
    for v in VOCABS {
        let path = tree.join("models").join(format!("ggml-vocab-{v}.gguf"));
        let tok = load(&path);
        let pairs = read_pairs(&path);
        let mut ok = 0;
        for (inp, want) in &pairs {
            let got = tok.encode(inp, false, false);
            if &got == want {
                ok += 1;
            } else {
                failures.push(format!(
                    "{v}: {:?}\n   want {want:?}\n   got  {got:?}",
                    String::from_utf8_lossy(inp)
                ));
            }
        }
        eprintln!(
            "{v:16} {ok}/{} exact (pre {:?}, rule set {})",
            pairs.len(),
            tok.pre(),
            tok.rule_set()
        );
    }
    for f in failures.iter().take(40) {
        eprintln!("{f}");
    }
    assert!(failures.is_empty(), "{} sections differ", failures.len());
}
