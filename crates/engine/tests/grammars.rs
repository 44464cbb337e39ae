//! Every GBNF grammar shipped in llama.cpp b11434's `grammars/` compiles, and takes a
//! sentence of its own language. Needs `LLAMAY_REF_TREE=$(scripts/fetch-ref)`.

use llamay_engine::grammar::{GrammarState, Rules};

#[test]
fn llama_cpp_grammars_compile_and_accept_their_sentences() {
    let Some(tree) =
        llamay_synth::reference::path("LLAMAY_REF_TREE", "LLAMAY_REF_TREE=$(scripts/fetch-ref)")
    else {
        return;
    };
    let samples = [
        (
            "json.gbnf",
            "{\"a\": [1, 2.5, \"x\"], \"b\": {\"c\": null}}",
        ),
        ("json_arr.gbnf", "[\n{\"a\": 1}\n]"),
        ("arithmetic.gbnf", "(1+2)*3-4/5\n"),
        ("list.gbnf", "- one\n- two\n"),
        ("chess.gbnf", "1. e4 e5\n2. Nf3 Nc6\n"),
        ("english.gbnf", "Hello world."),
        ("japanese.gbnf", "こんにちは。"),
        ("c.gbnf", "int main(){return 0;}"),
    ];
    let mut n = 0;
    for entry in std::fs::read_dir(tree.join("grammars")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "gbnf") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let rules = Rules::gbnf(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some((_, s)) = samples.iter().find(|(f, _)| *f == name) {
            let st = GrammarState::new(rules).advance(s.as_bytes());
            assert!(st.is_some(), "{name} refuses {s:?}");
        }
        n += 1;
    }
    assert!(n >= 8, "{n} grammars");
}
