//! JSON Schema → GBNF, for `--json-schema` (and `{}` for `--json`: any JSON value).
//!
//! Supported: `type` (object, array, string, number, integer, boolean, null, or a list
//! of them), `properties` / `required` / `additionalProperties`, `items` / `minItems` /
//! `maxItems`, `minLength` / `maxLength`, `enum`, `const`, `anyOf` / `oneOf`, `$ref` to
//! `#/$defs/…` or `#/definitions/…` within the document. Annotations (`title`,
//! `description`, `default`, `examples`, `$schema`, `$id`, `$comment`) are ignored;
//! every other keyword is refused by name, never silently dropped.
//!
//! Every sentence of the grammar validates against the schema; not every valid
//! document is a sentence: properties come in declared order, required ones first
//! kept in order; an object with declared properties gets no others (a valid subset
//! of what `additionalProperties` allows); whitespace is llama.cpp's `space` rule;
//! numbers keep to 16 significant digits and a two-digit exponent, so that every one
//! is a finite double (JSON readers refuse or overflow on `1e2293420473`); `\u`
//! escapes exclude the surrogates D800–DFFF (a lone one is refused by strict readers;
//! characters past the BMP come as UTF-8).

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
];
/// Nesting past this is refused (a schema is outside input).
const MAX_DEPTH: usize = 64;
/// Bounds that become `{m,n}` repetitions.
const MAX_BOUND: u64 = 10_000;

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
    out: String,
    /// Generated rule bodies by name.
    rules: Vec<(String, String)>,
    /// `$ref` target → its rule name (so recursive schemas refer to themselves).
    refs: HashMap<String, String>,
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
                if key == "oneOf" && list.len() > 1 {
                    // Exactly-one cannot be checked by a grammar; alternatives whose
                    // sentences overlap would let an output match two. Accept only
                    // when the branches are distinguishable by their type.
                    let types: Vec<Option<&Value>> = list.iter().map(|s| s.get("type")).collect();
                    let distinct = types.iter().all(Option::is_some)
                        && (0..types.len())
                            .all(|i| (i + 1..types.len()).all(|j| types[i] != types[j]));
                    if !distinct {
                        return Err(err(
                            "`oneOf` whose branches do not each have a distinct `type` is not supported (a grammar cannot check \"exactly one\"); use `anyOf`",
                        ));
                    }
                }
                let mut alts = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    alts.push(self.expr(s, &format!("{hint}-{i}"), depth + 1)?);
                }
                let body = alts.join(" | ");
                return Ok(self.rule(hint, body));
            }
        }
        let types: Vec<&str> = match o.get("type") {
            None => {
                if o.contains_key("properties") {
                    vec!["object"]
                } else if o.contains_key("items") {
                    vec!["array"]
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
                "number" => "number".into(),
                "integer" => "integer".into(),
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
        // Name the rule first, so a recursive schema refers to it.
        let name = format!("ref-{}", self.rules.len());
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
        if min.is_none() && max.is_none() {
            return Ok("string".into());
        }
        let (min, max) = (min.unwrap_or(0), max);
        if max.is_some_and(|m| m < min) {
            return Err(err(format!("`{hint}`: maxLength < minLength")));
        }
        let rep = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(self.rule(hint, format!("\"\\\"\" char{rep} \"\\\"\" space")))
    }

    fn array(
        &mut self,
        o: &Map<String, Value>,
        hint: &str,
        depth: usize,
    ) -> Result<String, GrammarError> {
        let item = match o.get("items") {
            None => "value".to_string(),
            Some(s) => self.expr(s, &format!("{hint}-item"), depth + 1)?,
        };
        let min = self.bound(o, "minItems")?.unwrap_or(0);
        let max = self.bound(o, "maxItems")?;
        if max.is_some_and(|m| m < min) {
            return Err(err(format!("`{hint}`: maxItems < minItems")));
        }
        let more = |n: Option<u64>| match n {
            Some(n) => format!("(\",\" space {item}){{0,{n}}}"),
            None => format!("(\",\" space {item})*"),
        };
        let body = match (min, max) {
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
        if props.is_empty() {
            // A map: string keys, values as `additionalProperties` says.
            let value = match o.get("additionalProperties") {
                None | Some(Value::Bool(true)) => "value".to_string(),
                Some(Value::Bool(false)) => {
                    return Ok(self.rule(hint, "\"{\" space \"}\" space".into()));
                }
                Some(s) => self.expr(s, &format!("{hint}-value"), depth + 1)?,
            };
            let kv = format!("string \":\" space {value}");
            return Ok(self.rule(
                hint,
                format!("\"{{\" space ({kv} (\",\" space {kv})*)? \"}}\" space"),
            ));
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
            let _ = write!(body, "({})?", firsts.join(" | "));
        }
        body.push_str(" \"}\" space");
        Ok(self.rule(hint, body))
    }
}

/// The GBNF text of a JSON Schema (`root` the document).
pub fn to_gbnf(schema: &Value) -> Result<String, GrammarError> {
    let mut c = Compiler {
        root: schema,
        out: String::new(),
        rules: Vec::new(),
        refs: HashMap::new(),
    };
    let root = c.expr(schema, "root", 0)?;
    let _ = writeln!(c.out, "root ::= {root}");
    for (name, body) in &c.rules {
        let _ = writeln!(c.out, "{name} ::= {body}");
    }
    c.out.push_str(PRIMITIVES);
    Ok(c.out)
}
