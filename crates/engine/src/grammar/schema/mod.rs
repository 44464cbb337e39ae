//! JSON Schema → GBNF, for `--json-schema` and the servers' structured output (and
//! `{}` for `--json`: any JSON value).
//!
//! Supported: `type` (object, array, string, number, integer, boolean, null, or a list
//! of them); objects' `properties` / `required` / `additionalProperties` (a boolean or a
//! schema) / `minProperties` / `maxProperties`; arrays' `items` / `prefixItems` /
//! `minItems` / `maxItems`; strings' `minLength` / `maxLength` / `pattern` (an ECMA
//! regex subset, `pattern.rs`) / `format` (`format.rs`); `minimum` / `maximum` /
//! `exclusiveMinimum` / `exclusiveMaximum` on integers, and on numbers with whole
//! bounds; `enum`, `const`, `anyOf`, `oneOf` (branches of distinct types, or told
//! apart by a `discriminator`'s constants), `allOf` (one schema, or object schemas
//! merged), `$ref` to `#/$defs/…` or `#/definitions/…` within the document.
//! Annotations (`title`, `description`, `default`, `examples`, …) are ignored; every
//! other keyword is refused by name, never silently dropped.
//!
//! Every sentence of the grammar validates against the schema; not every valid
//! document is a sentence: properties come in declared order, required ones first
//! kept in order; an object with declared properties gets no others unless
//! `additionalProperties` is a schema (a valid subset of what JSON Schema allows);
//! whitespace is llama.cpp's `space` rule; numbers keep to 16 significant digits and a
//! two-digit exponent, so that every one is a finite double (JSON readers refuse or
//! overflow on `1e2293420473`), and bounded ones to no exponent; `\u` escapes exclude
//! the surrogates D800–DFFF (a lone one is refused by strict readers; characters past
//! the BMP come as UTF-8).

mod format;
mod ints;
mod pattern;

use super::GrammarError;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fmt::Write;

const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "readOnly",
    "writeOnly",
    "deprecated",
];
const KNOWN: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
    "$defs",
    "definitions",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "allOf",
    "prefixItems",
    "minProperties",
    "maxProperties",
    "discriminator",
];
/// Nesting past this is refused (a schema is outside input).
const MAX_DEPTH: usize = 64;
/// Bounds that become `{m,n}` repetitions.
pub(super) const MAX_BOUND: u64 = 10_000;

const PRIMITIVES: &str = r#"space ::= | " " | "\n" [ \t]{0,20}
boolean ::= ("true" | "false") space
null ::= "null" space
integer ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) space
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})? space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))
string ::= "\"" char* "\"" space
value ::= object | array | string | number | boolean | null
object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? "}" space
array ::= "[" space ( value ("," space value)* )? "]" space
"#;

struct Compiler<'s> {
    root: &'s Value,
    /// Generated rule bodies by name.
    rules: Vec<(String, String)>,
    /// `$ref` target → its rule name (so recursive schemas refer to themselves).
    refs: HashMap<String, String>,
    /// Whether a `format` was used (its helper rules are then emitted).
    formats: bool,
    /// The document's rule name: the prefix of its `$ref` rules, so that several
    /// documents share one grammar.
    top: String,
}

fn err(what: impl Into<String>) -> GrammarError {
    GrammarError::Schema(what.into())
}

/// A GBNF string literal for `s`.
fn literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl<'s> Compiler<'s> {
    fn rule(&mut self, hint: &str, body: String) -> String {
        let base: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        let base = if base.is_empty() {
            "r".to_string()
        } else {
            base
        };
        let name = format!("{base}-{}", self.rules.len());
        self.rules.push((name.clone(), body));
        name
    }

    fn bound(&self, o: &Map<String, Value>, key: &str) -> Result<Option<u64>, GrammarError> {
        match o.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| err(format!("`{key}` must be a non-negative integer")))?;
                if n > MAX_BOUND {
                    return Err(err(format!("`{key}` {n} is over {MAX_BOUND}")));
                }
                Ok(Some(n))
            }
        }
    }

    /// The grammar expression for `schema` (a rule name or an inline expression).
    fn expr(&mut self, schema: &Value, hint: &str, depth: usize) -> Result<String, GrammarError> {
        if depth > MAX_DEPTH {
            return Err(err(format!("nested deeper than {MAX_DEPTH}")));
        }
        let o = match schema {
            Value::Bool(true) => return Ok("value".into()),
            Value::Bool(false) => {
                return Err(err(format!("`{hint}`: the schema `false` admits nothing")));
            }
            Value::Object(o) => o,
            _ => {
                return Err(err(format!(
                    "`{hint}`: a schema must be an object or a boolean"
                )));
            }
        };
        for k in o.keys() {
            if !KNOWN.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return Err(err(format!(
                    "`{k}` (in `{hint}`) is not supported; supported: {}",
                    KNOWN.join(", ")
                )));
            }
        }
        if let Some(r) = o.get("$ref") {
            if o.keys().any(|k| {
                k != "$ref"
                    && k != "$defs"
                    && k != "definitions"
                    && !ANNOTATIONS.contains(&k.as_str())
            }) {
                return Err(err(format!(
                    "`{hint}`: keywords beside `$ref` are not supported"
                )));
            }
            let r = r.as_str().ok_or_else(|| err("`$ref` must be a string"))?;
            return self.reference(r, depth);
        }
        if let Some(c) = o.get("const") {
            return Ok(format!("{} space", literal(&c.to_string())));
        }
        if let Some(e) = o.get("enum") {
            let e = e.as_array().ok_or_else(|| err("`enum` must be an array"))?;
            if e.is_empty() {
                return Err(err(format!("`{hint}`: an empty `enum` admits nothing")));
            }
            let alts: Vec<String> = e.iter().map(|v| literal(&v.to_string())).collect();
            return Ok(format!("({}) space", alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(list) = o.get(key) {
                let list = list
                    .as_array()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| err(format!("`{key}` must be a non-empty array")))?;
                if key == "oneOf" && list.len() > 1 && !self.exclusive(o, list)? {
                    return Err(err(
                        "`oneOf` whose branches do not each have a distinct `type` (or a `discriminator` constant) is not supported (a grammar cannot check \"exactly one\"); use `anyOf`",
                    ));
                }
                let mut alts = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    alts.push(self.expr(s, &format!("{hint}-{i}"), depth + 1)?);
                }
                let body = alts.join(" | ");
                return Ok(self.rule(hint, body));
            }
        }
        if let Some(list) = o.get("allOf") {
            return self.all_of(o, list, hint, depth);
        }
        let types: Vec<&str> = match o.get("type") {
            // No `type`: the type its keywords constrain (a valid subset; keywords of
            // another type would not apply to the other types' values).
            None => {
                let has = |ks: &[&str]| ks.iter().any(|k| o.contains_key(*k));
                if has(&[
                    "properties",
                    "additionalProperties",
                    "minProperties",
                    "maxProperties",
                ]) {
                    vec!["object"]
                } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
                    vec!["array"]
                } else if has(&["pattern", "format", "minLength", "maxLength"]) {
                    vec!["string"]
                } else if has(&["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]) {
                    vec!["number"]
                } else {
                    return Ok("value".into());
                }
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| err("`type` entries must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(err("`type` must be a string or an array of strings")),
        };
        let mut alts = Vec::new();
        for t in types {
            alts.push(match t {
                "object" => self.object(o, hint, depth)?,
                "array" => self.array(o, hint, depth)?,
                "string" => self.string(o, hint)?,
                "number" => self.number(o, hint, false)?,
                "integer" => self.number(o, hint, true)?,
                "boolean" => "boolean".into(),
                "null" => "null".into(),
                other => return Err(err(format!("unknown `type` \"{other}\""))),
            });
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            self.rule(hint, alts.join(" | "))
        })
    }

    fn reference(&mut self, r: &str, depth: usize) -> Result<String, GrammarError> {
        if let Some(name) = self.refs.get(r) {
            return Ok(name.clone());
        }
        let target = self.target(r)?;
        // Name the rule first, so a recursive schema refers to it.
        let name = format!("{}-ref-{}", self.top, self.rules.len());
        self.rules.push((name.clone(), String::new()));
        self.refs.insert(r.to_string(), name.clone());
        let body = self.expr(target, &name, depth + 1)?;
        let slot = self
            .rules
            .iter_mut()
            .find(|(n, _)| *n == name)
            .expect("named above");
        slot.1 = body;
        Ok(name)
    }

    fn string(&mut self, o: &Map<String, Value>, hint: &str) -> Result<String, GrammarError> {
        let min = self.bound(o, "minLength")?;
        let max = self.bound(o, "maxLength")?;
        if max.is_some_and(|m| m < min.unwrap_or(0)) {
            return Err(err(format!("`{hint}`: maxLength < minLength")));
        }
        if let Some(p) = o.get("pattern") {
            if o.contains_key("format") {
                return Err(err(format!(
                    "`{hint}`: `pattern` beside `format` is not supported"
                )));
            }
            if min.is_some() || max.is_some() {
                return Err(err(format!(
                    "`{hint}`: `minLength`/`maxLength` beside `pattern` are not supported (bound the length in the pattern)"
                )));
            }
            let p = p
                .as_str()
                .ok_or_else(|| err("`pattern` must be a string"))?;
            let body = pattern::to_gbnf(p, "char").map_err(err)?;
            return Ok(self.rule(hint, format!("\"\\\"\" {body} \"\\\"\" space")));
        }
        if let Some(f) = o.get("format") {
            let name = f.as_str().ok_or_else(|| err("`format` must be a string"))?;
            let f = format::find(name).ok_or_else(|| {
                err(format!(
                    "`format` \"{name}\" (in `{hint}`) is not supported; supported: {}",
                    format::names()
                ))
            })?;
            if min.is_some_and(|m| m > f.min_len) || max.is_some_and(|m| m < f.max_len) {
                return Err(err(format!(
                    "`{hint}`: `format` \"{name}\" writes {} to {} characters; a length bound inside that is not supported",
                    f.min_len, f.max_len
                )));
            }
            self.formats = true;
            return Ok(self.rule(hint, format!("\"\\\"\" {} \"\\\"\" space", f.body)));
        }
        if min.is_none() && max.is_none() {
            return Ok("string".into());
        }
        let min = min.unwrap_or(0);
        let rep = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(self.rule(hint, format!("\"\\\"\" char{rep} \"\\\"\" space")))
    }

    /// A numeric bound keyword's value (draft-4 boolean `exclusive*` refused by name).
    fn numeric(&self, o: &Map<String, Value>, key: &str) -> Result<Option<f64>, GrammarError> {
        match o.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    err(format!(
                        "`{key}` must be a number (the draft-4 boolean form is not supported)"
                    ))
                }),
        }
    }

    /// `integer` or `number`, within its bounds.
    fn number(
        &mut self,
        o: &Map<String, Value>,
        hint: &str,
        integer: bool,
    ) -> Result<String, GrammarError> {
        let side =
            |inclusive: &str, exclusive: &str| -> Result<Option<ints::Bound>, GrammarError> {
                let (a, b) = (self.numeric(o, inclusive)?, self.numeric(o, exclusive)?);
                Ok(match (a, b) {
                    (None, None) => None,
                    (Some(v), None) => Some(ints::Bound {
                        value: v,
                        exclusive: false,
                    }),
                    (None, Some(v)) => Some(ints::Bound {
                        value: v,
                        exclusive: true,
                    }),
                    // Both: the tighter one.
                    (Some(i), Some(e)) => {
                        let tighter_e = if inclusive == "minimum" {
                            e >= i
                        } else {
                            e <= i
                        };
                        Some(ints::Bound {
                            value: if tighter_e { e } else { i },
                            exclusive: tighter_e,
                        })
                    }
                })
            };
        let lo = side("minimum", "exclusiveMinimum")?;
        let hi = side("maximum", "exclusiveMaximum")?;
        if lo.is_none() && hi.is_none() {
            return Ok(if integer { "integer" } else { "number" }.into());
        }
        let body = if integer {
            ints::integer_range(lo, hi)
        } else {
            for b in lo.iter().chain(&hi) {
                if b.value.fract() != 0.0 || b.value.abs() > ints::MAX_MAGNITUDE as f64 {
                    return Err(err(format!(
                        "`{hint}`: a bound of {} on a number is not supported (whole-number bounds are; or use `integer`)",
                        b.value
                    )));
                }
            }
            ints::number_range(lo, hi)
        }
        .ok_or_else(|| err(format!("`{hint}`: the bounds admit no value")))?;
        Ok(self.rule(hint, format!("{body} space")))
    }

    /// Whether `oneOf`'s branches can never both match: each has a distinct `type`, or
    /// the `discriminator` property is a required constant, distinct per branch.
    fn exclusive(&self, o: &Map<String, Value>, list: &[Value]) -> Result<bool, GrammarError> {
        let types: Vec<Option<&Value>> = list.iter().map(|s| s.get("type")).collect();
        if types.iter().all(Option::is_some)
            && (0..types.len()).all(|i| (i + 1..types.len()).all(|j| types[i] != types[j]))
        {
            return Ok(true);
        }
        let Some(prop) = o
            .get("discriminator")
            .and_then(|d| d.get("propertyName"))
            .and_then(Value::as_str)
        else {
            return Ok(false);
        };
        let mut seen = Vec::new();
        for branch in list {
            let b = self.resolve(branch)?;
            let required = b
                .get("required")
                .and_then(Value::as_array)
                .is_some_and(|r| r.iter().any(|n| n == prop));
            let p = b.get("properties").and_then(|p| p.get(prop));
            let constant = p.and_then(|p| {
                p.get("const").or_else(|| {
                    p.get("enum")
                        .and_then(Value::as_array)
                        .filter(|e| e.len() == 1)
                        .map(|e| &e[0])
                })
            });
            match constant {
                Some(c) if required && !seen.contains(&c) => seen.push(c),
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// A schema with its `$ref`s followed (within the document).
    fn resolve<'v>(&'v self, mut s: &'v Value) -> Result<&'v Value, GrammarError> {
        for _ in 0..MAX_DEPTH {
            let Some(r) = s.get("$ref").and_then(Value::as_str) else {
                return Ok(s);
            };
            s = self.target(r)?;
        }
        Err(err(format!("`$ref`s chained deeper than {MAX_DEPTH}")))
    }

    /// What a `$ref` within the document points at.
    fn target(&self, r: &str) -> Result<&'s Value, GrammarError> {
        let path = r.strip_prefix("#/").ok_or_else(|| {
            err(format!(
                "`$ref` \"{r}\": only references within the document (#/$defs/NAME) are supported"
            ))
        })?;
        let mut target = self.root;
        for part in path.split('/') {
            let part = part.replace("~1", "/").replace("~0", "~");
            target = target
                .get(&part)
                .ok_or_else(|| err(format!("`$ref` \"{r}\" points nowhere")))?;
        }
        Ok(target)
    }

    /// `allOf`: one schema (with annotations beside it) is that schema; several are
    /// merged when each is an object schema; anything else is refused by name.
    fn all_of(
        &mut self,
        o: &Map<String, Value>,
        list: &Value,
        hint: &str,
        depth: usize,
    ) -> Result<String, GrammarError> {
        let list = list
            .as_array()
            .filter(|l| !l.is_empty())
            .ok_or_else(|| err("`allOf` must be a non-empty array"))?;
        let mut parts: Vec<Value> = list.clone();
        let mut rest = o.clone();
        rest.remove("allOf");
        if rest.keys().any(|k| !ANNOTATIONS.contains(&k.as_str())) {
            parts.push(Value::Object(rest));
        }
        if parts.len() == 1 {
            return self.expr(&parts[0], hint, depth + 1);
        }
        let mut props = Map::new();
        let mut required: Vec<Value> = Vec::new();
        let mut closed: Vec<Value> = Vec::new();
        for part in &parts {
            let p = self.resolve(part)?;
            let p = p
                .as_object()
                .ok_or_else(|| err("`allOf` members must be objects"))?;
            let object_like = p.get("type").is_none_or(|t| t == "object")
                && p.keys().all(|k| {
                    ANNOTATIONS.contains(&k.as_str())
                        || [
                            "type",
                            "properties",
                            "required",
                            "additionalProperties",
                            "$defs",
                            "definitions",
                        ]
                        .contains(&k.as_str())
                });
            if !object_like || p.get("additionalProperties").is_some_and(Value::is_object) {
                return Err(err(format!(
                    "`{hint}`: `allOf` is supported over one schema or over object schemas (properties, required); this one merges {}",
                    Value::Object(p.clone())
                )));
            }
            for (k, v) in p
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if props.get(k).is_some_and(|old| old != v) {
                    return Err(err(format!(
                        "`{hint}`: `allOf` members declare property \"{k}\" differently"
                    )));
                }
                props.insert(k.clone(), v.clone());
            }
            for r in p
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !required.contains(r) {
                    required.push(r.clone());
                }
            }
            if p.get("additionalProperties") == Some(&Value::Bool(false)) {
                closed.push(p.get("properties").cloned().unwrap_or_default());
            }
        }
        // A closed member forbids the properties only the others declare.
        if closed
            .iter()
            .any(|c| props.keys().any(|k| c.get(k).is_none()))
        {
            return Err(err(format!(
                "`{hint}`: an `allOf` member with `additionalProperties: false` forbids properties another member declares"
            )));
        }
        let closed = !closed.is_empty();
        let mut merged = Map::new();
        merged.insert("type".into(), "object".into());
        merged.insert("properties".into(), Value::Object(props));
        merged.insert("required".into(), Value::Array(required));
        if closed {
            merged.insert("additionalProperties".into(), false.into());
        }
        self.object(&merged, hint, depth)
    }

    fn array(
        &mut self,
        o: &Map<String, Value>,
        hint: &str,
        depth: usize,
    ) -> Result<String, GrammarError> {
        let min = self.bound(o, "minItems")?.unwrap_or(0);
        let max = self.bound(o, "maxItems")?;
        if max.is_some_and(|m| m < min) {
            return Err(err(format!("`{hint}`: maxItems < minItems")));
        }
        let prefix: Vec<String> = match o.get("prefixItems") {
            None => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, s)| self.expr(s, &format!("{hint}-tuple-{i}"), depth + 1))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(err("`prefixItems` must be an array")),
        };
        let k = prefix.len() as u64;
        if max.is_some_and(|m| m < k) {
            return Err(err(format!(
                "`{hint}`: maxItems below the {k} `prefixItems` is not supported"
            )));
        }
        // Items past the prefix: `items` when it is a schema; with a prefix and no
        // `items`, none unless minItems asks for more (a valid subset).
        let item = match o.get("items") {
            Some(Value::Bool(false)) => None,
            None if k > 0 && min <= k => None,
            None => Some("value".to_string()),
            Some(s) => Some(self.expr(s, &format!("{hint}-item"), depth + 1)?),
        };
        let (extra_min, extra_max) = (min.saturating_sub(k), max.map(|m| m - k));
        if item.is_none() && extra_min > 0 {
            return Err(err(format!(
                "`{hint}`: minItems {min} with no `items` past the prefix"
            )));
        }
        let body = if k == 0 {
            let item = item.expect("no prefix: items default to any value");
            let more = |n: Option<u64>| match n {
                Some(n) => format!("(\",\" space {item}){{0,{n}}}"),
                None => format!("(\",\" space {item})*"),
            };
            match (min, max) {
                (_, Some(0)) => "\"[\" space \"]\" space".to_string(),
                (0, max) => format!(
                    "\"[\" space ({item} {})? \"]\" space",
                    more(max.map(|m| m - 1))
                ),
                (min, max) => format!(
                    "\"[\" space {item} (\",\" space {item}){{{}}} {} \"]\" space",
                    min - 1,
                    more(max.map(|m| m - min))
                ),
            }
        } else {
            let mut body = format!("\"[\" space {}", prefix.join(" \",\" space "));
            if let Some(item) = item.filter(|_| extra_max != Some(0)) {
                let rep = match extra_max {
                    Some(m) => format!("{{{extra_min},{m}}}"),
                    None => format!("{{{extra_min},}}"),
                };
                let _ = write!(body, " (\",\" space {item}){rep}");
            }
            body.push_str(" \"]\" space");
            body
        };
        Ok(self.rule(hint, body))
    }

    fn object(
        &mut self,
        o: &Map<String, Value>,
        hint: &str,
        depth: usize,
    ) -> Result<String, GrammarError> {
        let props = match o.get("properties") {
            None => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return Err(err("`properties` must be an object")),
        };
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|n| {
                    n.as_str()
                        .ok_or_else(|| err("`required` entries must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(err("`required` must be an array")),
        };
        for r in &required {
            if !props.contains_key(*r) {
                return Err(err(format!(
                    "`{hint}`: required property \"{r}\" is not among `properties` (declare it there)"
                )));
            }
        }
        let min_props = self.bound(o, "minProperties")?.unwrap_or(0);
        let max_props = self.bound(o, "maxProperties")?;
        if max_props.is_some_and(|m| m < min_props) {
            return Err(err(format!("`{hint}`: maxProperties < minProperties")));
        }
        if props.is_empty() {
            // A map: string keys, values as `additionalProperties` says.
            let value = match o.get("additionalProperties") {
                None | Some(Value::Bool(true)) => "value".to_string(),
                Some(Value::Bool(false)) => {
                    if min_props > 0 {
                        return Err(err(format!(
                            "`{hint}`: minProperties with no property allowed admits nothing"
                        )));
                    }
                    return Ok(self.rule(hint, "\"{\" space \"}\" space".into()));
                }
                Some(s) => self.expr(s, &format!("{hint}-value"), depth + 1)?,
            };
            // A grammar cannot keep keys distinct, and a repeated key counts once.
            if min_props > 1 {
                return Err(err(format!(
                    "`{hint}`: minProperties {min_props} on a map is not supported (a grammar cannot keep its keys distinct); 0 and 1 are"
                )));
            }
            let kv = format!("string \":\" space {value}");
            let body = match max_props {
                Some(0) => String::new(),
                Some(m) => format!("{kv} (\",\" space {kv}){{0,{}}}", m - 1),
                None => format!("{kv} (\",\" space {kv})*"),
            };
            let body = if min_props == 1 || body.is_empty() {
                body
            } else {
                format!("({body})?")
            };
            return Ok(self.rule(hint, format!("\"{{\" space {body} \"}}\" space")));
        }
        let n_required = required.len() as u64;
        let extra = match o.get("additionalProperties") {
            Some(s @ Value::Object(_)) => {
                let value = self.expr(s, &format!("{hint}-extra-value"), depth + 1)?;
                let key = self.key_not_in(props.keys().map(String::as_str), hint);
                Some(self.rule(
                    &format!("{hint}-extra-kv"),
                    format!("\"\\\"\" {key} \"\\\"\" space \":\" space {value}"),
                ))
            }
            _ => None,
        };
        if min_props > n_required
            || max_props.is_some_and(|m| extra.is_some() || m < props.len() as u64)
        {
            return Err(err(format!(
                "`{hint}`: minProperties/maxProperties that bind beside declared properties are not supported (minProperties up to the {n_required} required ones and maxProperties of at least the {} declared are)",
                props.len()
            )));
        }
        let mut kvs = Vec::new();
        for (name, s) in &props {
            let value = self.expr(s, &format!("{hint}-{name}"), depth + 1)?;
            let kv = self.rule(
                &format!("{hint}-{name}-kv"),
                format!(
                    "{} space \":\" space {value}",
                    literal(&format!("\"{name}\""))
                ),
            );
            kvs.push((name.as_str(), kv, required.contains(&name.as_str())));
        }
        // Required properties in declared order first, then the optional ones in order.
        let req: Vec<&String> = kvs.iter().filter(|k| k.2).map(|k| &k.1).collect();
        let opt: Vec<&String> = kvs.iter().filter(|k| !k.2).map(|k| &k.1).collect();
        let mut body = String::from("\"{\" space ");
        if !req.is_empty() {
            body.push_str(
                &req.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" \",\" space "),
            );
            for k in &opt {
                let _ = write!(body, " (\",\" space {k})?");
            }
        } else {
            // Any in-order subset of the optional ones: rest_i follows kv_i.
            let mut rests: Vec<String> = vec![String::new(); opt.len()];
            for i in (0..opt.len()).rev() {
                let alts: Vec<String> = (i + 1..opt.len())
                    .map(|j| format!("\",\" space {} {}", opt[j], rests[j]))
                    .collect();
                rests[i] = if alts.is_empty() {
                    String::new()
                } else {
                    let body = format!("({})?", alts.join(" | "));
                    self.rule(&format!("{hint}-rest"), body)
                };
            }
            let firsts: Vec<String> = (0..opt.len())
                .map(|i| format!("{} {}", opt[i], rests[i]))
                .collect();
            match &extra {
                None => {
                    let _ = write!(body, "({})?", firsts.join(" | "));
                }
                Some(x) => {
                    let _ = write!(
                        body,
                        "(({}) (\",\" space {x})* | {x} (\",\" space {x})*)?",
                        firsts.join(" | ")
                    );
                }
            }
        }
        if let (Some(x), false) = (&extra, req.is_empty()) {
            let _ = write!(body, " (\",\" space {x})*");
        }
        body.push_str(" \"}\" space");
        Ok(self.rule(hint, body))
    }
}

impl Compiler<'_> {
    /// The contents of a key (raw characters, no escapes) that is none of `names`:
    /// a rule per node of the names' trie.
    fn key_not_in<'n>(&mut self, names: impl Iterator<Item = &'n str>, hint: &str) -> String {
        #[derive(Default)]
        struct Node {
            kids: Vec<(char, Node)>,
            word: bool,
        }
        let mut root = Node::default();
        for name in names {
            let mut n = &mut root;
            for c in name.chars() {
                let i = match n.kids.iter().position(|(k, _)| *k == c) {
                    Some(i) => i,
                    None => {
                        n.kids.push((c, Node::default()));
                        n.kids.len() - 1
                    }
                };
                n = &mut n.kids[i].1;
            }
            n.word = true;
        }
        let any = self.rule(
            &format!("{hint}-key-char"),
            "[^\"\\\\\\x00-\\x1F\\x7F]".into(),
        );
        fn walk(c: &mut Compiler<'_>, n: &Node, hint: &str, any: &str) -> String {
            let mut alts = Vec::new();
            if !n.word {
                alts.push(String::new());
            }
            let mut class = String::from("[^\"\\\\\\x00-\\x1F\\x7F");
            for (ch, kid) in &n.kids {
                let rest = walk(c, kid, hint, any);
                alts.push(format!("{} {rest}", literal(&ch.to_string())));
                let _ = write!(class, "\\U{:08X}", *ch as u32);
            }
            class.push(']');
            alts.push(format!("{class} {any}*"));
            c.rule(&format!("{hint}-key"), alts.join(" | "))
        }
        walk(self, &root, hint, &any)
    }
}

/// The GBNF text of a JSON Schema (`root` the document).
pub fn to_gbnf(schema: &Value) -> Result<String, GrammarError> {
    to_gbnf_as(schema, "root")
}

/// As [`to_gbnf`], the document's rule named `top` (no `root` unless `top` is it).
pub fn to_gbnf_as(schema: &Value, top: &str) -> Result<String, GrammarError> {
    to_gbnf_tops(&[(schema, top)])
}

/// Several documents in one grammar, each as its rule `top` (distinct names), the
/// primitives once.
pub fn to_gbnf_tops(docs: &[(&Value, &str)]) -> Result<String, GrammarError> {
    let mut out = String::new();
    let mut formats = false;
    for &(schema, top) in docs {
        let mut c = Compiler {
            root: schema,
            rules: Vec::new(),
            refs: HashMap::new(),
            formats: false,
            top: top.to_string(),
        };
        let root = c.expr(schema, top, 0)?;
        let _ = writeln!(out, "{top} ::= {root}");
        for (name, body) in &c.rules {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        formats |= c.formats;
    }
    out.push_str(PRIMITIVES);
    if formats {
        out.push_str(&format::helpers());
    }
    Ok(out)
}
