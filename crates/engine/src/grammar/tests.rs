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
fn json_mode_takes_objects_only() {
    let g = Rules::json_object();
    for ok in ["{}", "{\"a\": [1, {\"b\": null}]}", "{ \"k\": \"v\" }"] {
        assert!(accepts(&g, ok), "{ok}");
    }
    // What the any-value grammar let through in JSON mode (seen on the wire).
    for bad in ["1.1", "-1", "\"name\"", "[]", "true", "null"] {
        assert!(!accepts(&g, bad), "{bad}");
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
        (json!({"type": "string", "pattern": "^(?=a)"}), "lookaround"),
        (
            json!({"type": "string", "pattern": "(a)\\1"}),
            "backreferences",
        ),
        (
            json!({"type": "string", "pattern": "\\bword"}),
            "word boundaries",
        ),
        (
            json!({"type": "string", "pattern": "a(^b)"}),
            "anchor inside",
        ),
        (
            json!({"type": "string", "format": "password"}),
            "\"password\"",
        ),
        (
            json!({"type": "string", "format": "date", "maxLength": 5}),
            "length bound",
        ),
        (
            json!({"type": "string", "pattern": "^a+$", "maxLength": 5}),
            "beside `pattern`",
        ),
        (json!({"type": "number", "minimum": 0.5}), "bound of 0.5"),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 4}),
            "admit no value",
        ),
        (
            json!({"type": "integer", "exclusiveMinimum": true}),
            "draft-4",
        ),
        (
            json!({"type": "array", "uniqueItems": true}),
            "`uniqueItems`",
        ),
        (
            json!({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}),
            "distinct",
        ),
        (
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "`allOf`",
        ),
        (
            json!({"allOf": [{"properties": {"a": {"type": "string"}}, "additionalProperties": false},
                          {"properties": {"b": {"type": "string"}}}]}),
            "forbids",
        ),
        (
            json!({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}},
                          {"type": "object", "properties": {"k": {"const": "a"}}}],
                "discriminator": {"propertyName": "k"}}),
            "anyOf",
        ),
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

/// Every integer of a window (and a few far ones) against the bounds, for ranges on
/// either side of zero, exclusive and open ones included.
#[test]
fn integer_bounds_admit_exactly_the_range() {
    let cases: &[(Value, i64, i64)] = &[
        (json!({"minimum": 0}), 0, i64::MAX),
        (json!({"minimum": 1, "maximum": 100}), 1, 100),
        (json!({"minimum": -17, "maximum": 230}), -17, 230),
        (
            json!({"exclusiveMinimum": -5, "exclusiveMaximum": 5}),
            -4,
            4,
        ),
        (json!({"maximum": -3}), i64::MIN, -3),
        (json!({"minimum": 7, "maximum": 7}), 7, 7),
        (json!({"minimum": 99, "maximum": 1001}), 99, 1001),
        (json!({"minimum": 2.5, "maximum": 9.5}), 3, 9),
        (
            json!({"minimum": -1000, "exclusiveMaximum": -999}),
            -1000,
            -1000,
        ),
        (
            json!({"minimum": 0, "exclusiveMinimum": 10, "maximum": 20}),
            11,
            20,
        ),
    ];
    for (bounds, lo, hi) in cases {
        let mut s = bounds.clone();
        s["type"] = json!("integer");
        let g = Rules::json_schema(&s).unwrap();
        let far = [
            12_345_678_i64,
            -12_345_678,
            9_999_999_999_999_999,
            -9_999_999_999_999_999,
        ];
        for n in (-1200..=1200).chain(far) {
            assert_eq!(
                accepts(&g, &n.to_string()),
                (*lo..=*hi).contains(&n),
                "{s}: {n}"
            );
        }
        for bad in ["007", "-0", "1.0", "1e2", "99999999999999999", "+5"] {
            let v: f64 = bad.parse().unwrap_or(f64::NAN);
            if !(v >= *lo as f64 && v <= *hi as f64) || bad.len() > 1 {
                assert!(!accepts(&g, bad), "{s}: {bad}");
            }
        }
    }
}

#[test]
fn number_bounds_admit_exactly_the_range() {
    let cases: &[(Value, f64, bool, f64, bool)] = &[
        (json!({"minimum": 0}), 0.0, false, f64::INFINITY, false),
        (json!({"minimum": 0, "maximum": 1}), 0.0, false, 1.0, false),
        (
            json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1}),
            0.0,
            true,
            1.0,
            true,
        ),
        (
            json!({"minimum": -3, "exclusiveMaximum": 2}),
            -3.0,
            false,
            2.0,
            true,
        ),
        (
            json!({"exclusiveMaximum": -1}),
            f64::NEG_INFINITY,
            false,
            -1.0,
            true,
        ),
        (
            json!({"minimum": -10, "maximum": 25}),
            -10.0,
            false,
            25.0,
            false,
        ),
    ];
    let mut samples = Vec::new();
    for i in -40..=40 {
        samples.push(format!("{i}"));
        for f in [".5", ".25", ".05", ".999"] {
            samples.push(format!("{i}{f}"));
        }
    }
    samples.extend(["-0.5", "-0.05", "0.0", "1.0", "1e1"].map(String::from));
    for (bounds, lo, lo_x, hi, hi_x) in cases {
        let mut s = bounds.clone();
        s["type"] = json!("number");
        let g = Rules::json_schema(&s).unwrap();
        for t in &samples {
            let v: f64 = t.parse().unwrap();
            let inside = (if *lo_x { v > *lo } else { v >= *lo })
                && (if *hi_x { v < *hi } else { v <= *hi });
            // Fractions ending in 0 (and exponents) are outside the grammar: a subset.
            let written = !(t.contains('e') || t.contains('.') && t.ends_with('0'));
            assert_eq!(accepts(&g, t), inside && written, "{s}: {t}");
        }
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Patterns against the `regex` crate's matching of the same pattern (ASCII samples,
/// where its syntax and ECMA's agree), through the JSON encoding of each sample.
#[test]
fn patterns_match_what_the_regex_matches() {
    let patterns = [
        "^[A-Z]{2}-[0-9]{3,4}$",
        "^\\d+(\\.\\d{1,2})?$",
        "^(red|green|blue)$",
        "^[a-z_][a-z0-9_]*$",
        "^\\w+@\\w+\\.com$",
        "ab+c",
        "^[^aeiou]*$",
        "x?y{2}$",
        "^(?:a|b)*c$",
        "^\\s*\\S+$",
        "^[\\-+]?\\d$",
        "^\"q\"\\\\n$",
        "^.{3}$",
        "^(ab|cd){1,2}e?$",
        "^[\\x41-\\x43]+$",
    ];
    let samples = [
        "",
        "AB-123",
        "AB-1234",
        "ab-123",
        "AB-12",
        "12",
        "12.5",
        "12.345",
        "1.",
        "red",
        "green",
        "blue",
        "redd",
        "_x1",
        "1x",
        "a@b.com",
        "a@b.org",
        "abbc",
        "xxabcxx",
        "ac",
        "bcd",
        "yy",
        "xyy",
        "xyyz",
        "aabbc",
        "c",
        "  word",
        "two words",
        "-1",
        "+9",
        "--1",
        "\"q\"\\n",
        "\"q\"",
        "abc",
        "ab",
        "a\"c",
        "a\\c",
        "abcd",
        "cde",
        "abe",
        "ABC",
        "ABD",
        "a b",
        "tab\t",
        "new\nline",
    ];
    for p in patterns {
        let g = Rules::json_schema(&json!({"type": "string", "pattern": p})).unwrap();
        let re = regex::Regex::new(p).unwrap();
        for s in samples {
            assert_eq!(accepts(&g, &json_string(s)), re.is_match(s), "{p} on {s:?}");
        }
    }
    // `.` is any character but a line terminator, non-ASCII included.
    let g = Rules::json_schema(&json!({"type": "string", "pattern": "^.$"})).unwrap();
    assert!(accepts(&g, "\"é\"") && accepts(&g, "\"日\"") && accepts(&g, "\"\\\"\""));
    assert!(!accepts(&g, "\"\\n\"") && !accepts(&g, "\"\u{2028}\""));
}

/// Random walks through each format's grammar: every one a valid value (dates that
/// exist in every year, times with an offset, version-4-shaped UUIDs).
#[test]
fn formats_write_only_valid_values() {
    let days = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let date_ok = |d: &str| {
        let p: Vec<&str> = d.split('-').collect();
        p.len() == 3 && p[0].len() == 4 && p[0] != "0000" && {
            let (m, day): (usize, u32) = (p[1].parse().unwrap(), p[2].parse().unwrap());
            (1..=12).contains(&m)
                && day >= 1
                && day <= days[m - 1]
                && p[1].len() == 2
                && p[2].len() == 2
        }
    };
    let time_ok = |t: &str| {
        let (hms, rest) = t.split_at(8);
        let f: Vec<u32> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        f[0] < 24
            && f[1] < 60
            && f[2] < 60
            && (rest.ends_with('Z')
                || rest.len() >= 6 && rest[rest.len() - 6..].starts_with(['+', '-']))
    };
    for (format, check) in [
        ("date", &date_ok as &dyn Fn(&str) -> bool),
        ("time", &time_ok),
        ("date-time", &|s: &str| {
            s.len() > 11 && date_ok(&s[..10]) && &s[10..11] == "T" && time_ok(&s[11..])
        }),
        ("uuid", &|s: &str| {
            s.len() == 36 && s.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        }),
        ("ipv4", &|s: &str| {
            s.split('.')
                .filter(|o| o.parse::<u8>().is_ok() && (o.len() == 1 || !o.starts_with('0')))
                .count()
                == 4
        }),
        ("email", &|s: &str| {
            s.split('@').count() == 2 && s.rsplit('.').next().unwrap().len() >= 2
        }),
        ("uri", &|s: &str| {
            s.starts_with("http://") || s.starts_with("https://")
        }),
        ("duration", &|s: &str| {
            s.starts_with('P') && s.len() >= 3 && !s.ends_with('T')
        }),
    ] {
        let rules = Rules::json_schema(&json!({"type": "string", "format": format})).unwrap();
        let mut finished = 0;
        for seed in 0..60 {
            let (mut c, eog) = constraint(rules.clone());
            if let Some(text) = walk(&mut c, eog, seed, 400) {
                let v: String = serde_json::from_str(&text).unwrap();
                assert!(check(&v), "{format}: {v:?}");
                finished += 1;
            }
        }
        assert!(finished > 30, "{format}: {finished} walks finished");
    }
    let d = Rules::json_schema(&json!({"type": "string", "format": "date"})).unwrap();
    for bad in [
        "2023-02-29",
        "2023-04-31",
        "2023-13-01",
        "2023-00-10",
        "23-01-01",
    ] {
        assert!(!accepts(&d, &json_string(bad)), "{bad}");
    }
    assert!(accepts(&d, &json_string("2024-12-31")));
}

#[test]
fn all_of_prefix_items_extra_properties_and_discriminators() {
    // allOf over one $ref (pydantic's field-with-description shape) and over objects.
    let s = json!({"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "type": "object", "properties": {"p": {"allOf": [{"$ref": "#/$defs/P"}], "description": "d"}}, "required": ["p"]});
    let g = Rules::json_schema(&s).unwrap();
    assert!(accepts(&g, "{\"p\": {\"x\": 1}}") && !accepts(&g, "{\"p\": {}}"));
    let s = json!({"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                             {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]});
    let g = Rules::json_schema(&s).unwrap();
    assert!(accepts(&g, "{\"a\": \"s\", \"b\": 2}"));
    assert!(!accepts(&g, "{\"a\": \"s\"}") && !accepts(&g, "{\"b\": 2}"));

    // A tuple, then more items of another schema, bounded.
    let s = json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "items": {"type": "boolean"}, "maxItems": 3});
    let g = Rules::json_schema(&s).unwrap();
    for (t, want) in [
        ("[1, \"a\"]", true),
        ("[1, \"a\", true]", true),
        ("[1, \"a\", true, false]", false),
        ("[\"a\", 1]", false),
        ("[1]", false),
    ] {
        assert_eq!(accepts(&g, t), want, "{t}");
    }

    // Declared properties, then others whose keys are none of the declared ones.
    let s = json!({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name"], "additionalProperties": {"type": "integer"}});
    let g = Rules::json_schema(&s).unwrap();
    for (t, want) in [
        ("{\"name\": \"a\"}", true),
        (
            "{\"name\": \"a\", \"n\": 1, \"nam\": 2, \"names\": 3, \"x\": 4}",
            true,
        ),
        ("{\"name\": \"a\", \"name\": 2}", false),
        ("{\"name\": \"a\", \"n\": 1, \"n\": 2}", false),
        ("{\"name\": \"a\", \"other\": \"str\"}", false),
        ("{\"name\": \"a\", \"\": 5}", true),
    ] {
        assert_eq!(accepts(&g, t), want, "{t}");
    }
    // Maps with property counts.
    let s = json!({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2});
    let g = Rules::json_schema(&s).unwrap();
    for (t, want) in [
        ("{}", false),
        ("{\"a\": 1}", true),
        ("{\"a\": 1, \"b\": 2}", true),
        ("{\"a\": 1, \"b\": 2, \"c\": 3}", false),
    ] {
        assert_eq!(accepts(&g, t), want, "{t}");
    }

    // pydantic's discriminated union.
    let s = json!({"$defs": {
            "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind", "lives"]},
            "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["kind", "good"]}},
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}});
    let g = Rules::json_schema(&s).unwrap();
    assert!(
        accepts(&g, "{\"kind\": \"cat\", \"lives\": 9}")
            && accepts(&g, "{\"kind\": \"dog\", \"good\": true}")
    );
    assert!(!accepts(&g, "{\"kind\": \"dog\", \"lives\": 9}"));
}
