use super::*;
use proptest::prelude::*;
use serde_json::{Value, json};

fn accepts(rules: &Arc<Rules>, text: &str) -> bool {
    GrammarState::new(rules.clone())
        .advance(text.as_bytes())
        .is_some_and(|s| s.is_complete())
}

fn prefix_ok(rules: &Arc<Rules>, text: &[u8]) -> bool {
    GrammarState::new(rules.clone()).advance(text).is_some()
}

#[test]
fn gbnf_basics() {
    let g = Rules::gbnf(
        "root ::= \"a\" [b-d]+ (\"x\" | \"yz\")? num\nnum ::= [0-9]{2,3} # two or three digits\n",
    )
    .unwrap();
    for ok in [
        "ab12",
        "abcd123x".replace('x', "").as_str(),
        "abyz99",
        "acx12",
    ] {
        assert!(accepts(&g, ok), "{ok}");
    }
    for bad in ["a12", "ab1", "ab1234", "abq12", "abyx12"] {
        assert!(!accepts(&g, bad), "{bad}");
    }
    assert!(prefix_ok(&g, b"abyz9"), "a prefix of a sentence");
    // Negated classes, `.`, escapes, and a rule continued over lines inside ( ).
    let g = Rules::gbnf("root ::= [^\"\\\\]* \"\\x41\" (\n  . |\n  \"\\u00e9\"\n)\n").unwrap();
    assert!(accepts(&g, "hello world!Aé"));
    assert!(accepts(&g, "Az"));
    assert!(!accepts(&g, "a\"bAz"));
}

#[test]
fn gbnf_errors_name_the_problem() {
    for (src, want) in [
        ("value ::= \"x\"", GrammarError::NoRoot),
        ("root ::= item", GrammarError::Undefined("item".into())),
        (
            "root ::= root \"a\" | \"b\"",
            GrammarError::LeftRecursion("root".into()),
        ),
        (
            "root ::= x \"a\"\nx ::= \"\" | root",
            GrammarError::LeftRecursion("root".into()),
        ),
    ] {
        assert_eq!(Rules::gbnf(src).unwrap_err(), want, "{src}");
    }
    for (src, want) in [
        ("root ::= \"abc", "unterminated string"),
        ("root ::= [a-", "unterminated character class"),
        ("root ::= [z-a]", "backwards"),
        ("root ::= \"a\"{3,1}", "n < m"),
        ("root ::= \"a\"{99999}", "over"),
        ("root ::= * \"a\"", "follows nothing"),
        ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
        ("root = \"a\"", "expected '::='"),
        ("root ::= \"\\q\"", "unknown escape"),
        ("root ::= (\"a\"", "expected ')'"),
        (
            &format!("root ::= {}\"a\"{}", "(".repeat(300), ")".repeat(300)),
            "nested deeper",
        ),
    ] {
        let e = Rules::gbnf(src).unwrap_err().to_string();
        assert!(e.contains(want), "{src}: {e}");
    }
}

#[test]
fn the_json_grammar_takes_json_and_only_json() {
    let g = Rules::json();
    for ok in [
        "{}",
        "[1, -2.5e3, \"x\\n\\u00e9\", true, null, {\"a\": []}]",
        "\"plain\"",
        "0",
        "{\n  \"k\": {\"n\": [1,2]}\n}",
        "\"\\u00e9\\uFFFD\\uc000\"",
    ] {
        assert!(accepts(&g, ok), "{ok}");
        serde_json::from_str::<Value>(ok).unwrap();
    }
    // A lone surrogate escape is refused (strict readers refuse it; found by the
    // property test below).
    for bad in [
        "{",
        "[1,]",
        "01",
        "{\"a\" 1}",
        "tru",
        "\"\u{1}\"",
        "{'a': 1}",
        "\"\\ud800\"",
        "\"\\uDFFF\"",
    ] {
        assert!(!accepts(&g, bad), "{bad}");
    }
}

#[test]
fn utf8_split_across_tokens() {
    let g = Rules::gbnf("root ::= \"é\" [^a]").unwrap();
    let s = GrammarState::new(g.clone());
    let e = "é".as_bytes();
    // The first byte of é alone is a live prefix; a wrong lead byte is not.
    let half = s.advance(&e[..1]).expect("a partial é");
    assert!(!half.is_complete());
    assert!(s.advance("è".as_bytes()).is_none());
    let whole = half.advance(&e[1..]).unwrap();
    assert!(whole.advance(b"a").is_none());
    assert!(whole.advance("日".as_bytes()).unwrap().is_complete());
    // Invalid UTF-8 never matches, even `.`.
    let any = Rules::gbnf("root ::= .").unwrap();
    assert!(GrammarState::new(any.clone()).advance(&[0xff]).is_none());
    assert!(
        GrammarState::new(any).advance(&[0xc0, 0x80]).is_none(),
        "overlong"
    );
}

/// A small vocabulary: single characters, multi-character pieces, partial UTF-8.
fn vocab() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = (0x20u8..0x7f).map(|b| vec![b]).collect();
    for s in [
        "{\"", "\":", "\", \"", "true", "false", "null", "  ", "\n", "12", "-3", ".5", "e+", "\"}",
        "]}", "[{", "name", "age", "é", "日本", "\\n", "\\u00",
    ] {
        v.push(s.as_bytes().to_vec());
    }
    v.push(vec![0xc3]); // the first byte of é
    v.push(vec![0xa9]); // its second
    v.push(Vec::new()); // a control token: never allowed
    v.push(b"</s>".to_vec()); // end of generation
    v
}

fn constraint(rules: Arc<Rules>) -> (Constraint, u32) {
    let pieces = vocab();
    let eog = pieces.len() as u32 - 1;
    let trie = Arc::new(TokenTrie::new(&pieces, &[eog]));
    (Constraint::new(rules, trie), eog)
}

#[test]
fn the_trie_mask_is_the_per_token_check() {
    let (mut c, eog) = constraint(Rules::json());
    for piece in ["{\"", "name", "\":", " ", "\"", "é", "\"", "}"] {
        let mask = c.allowed();
        for (id, &a) in mask.iter().enumerate() {
            assert_eq!(a, c.accepts(id as u32), "token {id} before {piece:?}");
        }
        let id = vocab().iter().position(|p| p == piece.as_bytes()).unwrap() as u32;
        assert!(c.accept(id), "{piece}");
    }
    assert!(c.accepts(eog) && c.state().is_complete());
    assert!(!c.accept(vocab().len() as u32 - 2), "a control token");
}

/// A random walk through the constraint's masks: a sentence (or None if it ran long).
fn walk(c: &mut Constraint, eog: u32, seed: u64, max_tokens: usize) -> Option<String> {
    let pieces = vocab();
    let mut rng = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut out = Vec::new();
    for step in 0..max_tokens {
        if c.state().is_complete()
            && (c.state().is_finished() || next() % 4 == 0 || step > max_tokens / 2)
        {
            return Some(String::from_utf8(out).expect("the grammar keeps UTF-8 whole"));
        }
        let allowed: Vec<u32> = c
            .allowed()
            .iter()
            .enumerate()
            .filter(|&(id, &a)| a && id as u32 != eog)
            .map(|(id, _)| id as u32)
            .collect();
        assert!(!allowed.is_empty(), "a live state always has a next token");
        // Past half the budget, prefer closing characters so walks end.
        let closing: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| {
                matches!(
                    pieces[t as usize].as_slice(),
                    b"}" | b"]" | b"\"" | b"\"}" | b"]}"
                )
            })
            .collect();
        let pool = if step > max_tokens / 2 && !closing.is_empty() {
            &closing
        } else {
            &allowed
        };
        let t = pool[(next() % pool.len() as u64) as usize];
        assert!(c.accept(t));
        out.extend_from_slice(&pieces[t as usize]);
    }
    None
}

/// A validator for the subset `schema.rs` compiles (the property test's oracle).
fn valid(v: &Value, s: &Value, root: &Value) -> bool {
    let Some(o) = s.as_object() else {
        return s == &json!(true);
    };
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        let t = r
            .strip_prefix("#/")
            .unwrap()
            .split('/')
            .fold(root, |t, p| &t[p]);
        return valid(v, t, root);
    }
    if let Some(c) = o.get("const") {
        return v == c;
    }
    if let Some(e) = o.get("enum") {
        return e.as_array().unwrap().contains(v);
    }
    if let Some(list) = o.get("anyOf").or_else(|| o.get("oneOf")) {
        let n = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| valid(v, s, root))
            .count();
        return if o.contains_key("oneOf") {
            n == 1
        } else {
            n >= 1
        };
    }
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t],
        Some(Value::Array(ts)) => ts.iter().map(|t| t.as_str().unwrap()).collect(),
        _ => return true,
    };
    types.iter().any(|t| match (*t, v) {
        ("null", Value::Null) | ("boolean", Value::Bool(_)) => true,
        ("number", Value::Number(_)) => true,
        // JSON Schema's integer is any number with no fraction: `-0` is one.
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        ("string", Value::String(x)) => {
            let n = x.chars().count() as u64;
            o.get("minLength")
                .and_then(Value::as_u64)
                .is_none_or(|m| n >= m)
                && o.get("maxLength")
                    .and_then(Value::as_u64)
                    .is_none_or(|m| n <= m)
        }
        ("array", Value::Array(a)) => {
            let n = a.len() as u64;
            o.get("minItems")
                .and_then(Value::as_u64)
                .is_none_or(|m| n >= m)
                && o.get("maxItems")
                    .and_then(Value::as_u64)
                    .is_none_or(|m| n <= m)
                && o.get("items")
                    .is_none_or(|i| a.iter().all(|x| valid(x, i, root)))
        }
        ("object", Value::Object(m)) => {
            let props = o.get("properties").and_then(Value::as_object);
            let req = o.get("required").and_then(Value::as_array);
            req.is_none_or(|r| r.iter().all(|k| m.contains_key(k.as_str().unwrap())))
                && m.iter().all(|(k, x)| match props.and_then(|p| p.get(k)) {
                    Some(ps) => valid(x, ps, root),
                    None => match o.get("additionalProperties") {
                        Some(Value::Bool(false)) => false,
                        Some(a @ Value::Object(_)) => valid(x, a, root),
                        _ => true,
                    },
                })
        }
        _ => false,
    })
}

/// Random schemas of the supported subset.
fn schema_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        Just(json!({"type": "integer"})),
        Just(json!({"type": "number"})),
        Just(json!({"type": "boolean"})),
        Just(json!({"type": "null"})),
        Just(json!({"type": ["string", "null"]})),
        (0u64..3, 0u64..4)
            .prop_map(|(a, b)| json!({"type": "string", "minLength": a, "maxLength": a + b})),
        Just(json!({"enum": ["red", "green", 3, null]})),
        Just(json!({"const": {"k": [1, "two"]}})),
        Just(json!({})),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            (inner.clone(), 0u64..2, 0u64..3).prop_map(|(i, min, extra)| {
                json!({"type": "array", "items": i, "minItems": min, "maxItems": min + extra})
            }),
            prop::collection::vec((inner.clone(), any::<bool>()), 1..4).prop_map(|ps| {
                let names = ["name", "age", "tags", "é-key"];
                let mut props = serde_json::Map::new();
                let mut req = Vec::new();
                for (i, (s, r)) in ps.into_iter().enumerate() {
                    props.insert(names[i].into(), s);
                    if r {
                        req.push(json!(names[i]));
                    }
                }
                json!({"type": "object", "properties": props, "required": req})
            }),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| json!({"anyOf": [a, b]})),
            inner.prop_map(|v| json!({"type": "object", "additionalProperties": v})),
        ]
    })
    // `#/...` references resolve against the document: definitions live at its root.
    .prop_flat_map(|s| {
        prop_oneof![
            Just(s.clone()),
            Just(json!({"$defs": {"thing": s}, "$ref": "#/$defs/thing"})),
        ]
    })
}

/// Most walks must end in a sentence, or the property test checks little.
#[test]
fn most_random_walks_finish() {
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}, "required": ["name"]});
    let rules = Rules::json_schema(&schema).unwrap();
    let done = (0..50u64)
        .filter(|&seed| {
            let (mut c, eog) = constraint(rules.clone());
            walk(&mut c, eog, seed, 400).is_some()
        })
        .count();
    assert!(done >= 45, "{done} of 50 walks finished");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every output a constrained walk can produce parses as JSON and validates.
    #[test]
    fn every_constrained_output_validates(schema in schema_strategy(), seed in any::<u64>()) {
        let rules = Rules::json_schema(&schema).unwrap();
        let (mut c, eog) = constraint(rules);
        if let Some(text) = walk(&mut c, eog, seed, 400) {
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{schema}: {text:?} is not JSON: {e}"));
            prop_assert!(valid(&v, &schema, &schema), "{schema}: {text} does not validate");
        }
    }
}

#[test]
fn schemas_refuse_what_they_cannot_enforce_by_name() {
    for (s, want) in [
        (json!({"type": "string", "pattern": "^a$"}), "`pattern`"),
        (json!({"type": "string", "format": "date-time"}), "`format`"),
        (json!({"type": "integer", "minimum": 3}), "`minimum`"),
        (json!({"allOf": [{}]}), "`allOf`"),
        (
            json!({"$ref": "https://example.com/s.json"}),
            "within the document",
        ),
        (json!({"$ref": "#/$defs/missing"}), "points nowhere"),
        (
            json!({"type": "object", "properties": {}, "required": ["a"]}),
            "\"a\"",
        ),
        (
            json!({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}),
            "anyOf",
        ),
        (
            json!({"type": "array", "minItems": 3, "maxItems": 1}),
            "maxItems < minItems",
        ),
        (json!({"type": "wat"}), "wat"),
        (json!({"enum": []}), "empty"),
    ] {
        let e = Rules::json_schema(&s).unwrap_err().to_string();
        assert!(e.contains(want), "{s}: {e}");
    }
    // Annotations are fine; a recursive schema compiles.
    let tree = json!({"title": "t", "$defs": {"node": {"type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"});
    let g = Rules::json_schema(&tree).unwrap();
    assert!(accepts(&g, "{\"kids\": [{}, {\"kids\": []}]}"));
    assert!(!accepts(&g, "{\"kids\": [1]}"));
}

#[test]
fn required_and_optional_properties() {
    let s = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"]});
    let g = Rules::json_schema(&s).unwrap();
    for ok in [
        "{\"b\": \"x\"}",
        "{\"b\": \"x\", \"a\": 1}",
        "{\"b\": \"x\", \"a\": 1, \"c\": true}",
        "{\"b\":\"\",\"c\":false}",
    ] {
        assert!(accepts(&g, ok), "{ok}");
    }
    for bad in ["{}", "{\"a\": 1}", "{\"b\": 1}", "{\"b\": \"x\", \"d\": 1}"] {
        assert!(!accepts(&g, bad), "{bad}");
    }
    let none_required = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}});
    let g = Rules::json_schema(&none_required).unwrap();
    for ok in ["{}", "{\"a\": 1}", "{\"b\": 2}", "{\"a\": 1, \"b\": 2}"] {
        assert!(accepts(&g, ok), "{ok}");
    }
    assert!(!accepts(&g, "{, \"b\": 2}"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The flat trie (built from sorted pieces, duplicates and shared prefixes
    /// included) masks exactly what the per-token check allows, in any state.
    #[test]
    fn the_flat_trie_equals_the_per_token_check(
        pieces in prop::collection::vec(prop::collection::vec(prop::sample::select(b"{}\":, a1\xc3\xa9[]".to_vec()), 0..5), 1..120),
        steps in prop::collection::vec(any::<u8>(), 0..12),
    ) {
        let mut pieces = pieces;
        pieces.push(b"</s>".to_vec());
        let eog = pieces.len() as u32 - 1;
        let trie = Arc::new(TokenTrie::new(&pieces, &[eog]));
        let mut c = Constraint::new(Rules::json(), trie);
        for s in steps {
            let mask = c.allowed();
            for (id, &a) in mask.iter().enumerate() {
                prop_assert_eq!(a, c.accepts(id as u32), "token {} {:?}", id, pieces[id]);
            }
            let ok: Vec<u32> = (0..eog).filter(|&t| mask[t as usize]).collect();
            if ok.is_empty() {
                break;
            }
            prop_assert!(c.accept(ok[s as usize % ok.len()]));
        }
    }
}
