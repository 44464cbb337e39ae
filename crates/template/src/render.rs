//! The renderer: Jinja as Hugging Face transformers sets it up — `trim_blocks` and
//! `lstrip_blocks`, Python string methods (minijinja-contrib's pycompat), an
//! HF-compatible `tojson` (Python's `json.dumps` separators, no HTML escaping),
//! `raise_exception`, `strftime_now` and the `{% generation %}` block. Fuel and an
//! output bound stop what a hostile template can make us compute.

use crate::Message;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, syntax::SyntaxConfig};

/// Instructions a template may execute per render: real templates use thousands.
const FUEL: u64 = 5_000_000;

/// Bytes a render may produce: far above any real prompt (a 10M-token context is about
/// 40 MB of text), far below what a runaway loop would allocate. A single string
/// repetition is capped by minijinja itself (100 MB), before it allocates.
pub const MAX_OUTPUT: usize = 64 << 20;

/// A writer that refuses to grow past `limit` bytes: the render fails at the bound
/// instead of allocating what a hostile template asks for.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
    /// Set when a write was refused (minijinja reports only that the write failed).
    overflowed: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            self.overflowed = true;
            return Err(std::io::Error::other("output bound"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("chat template does not parse: {0}")]
    Syntax(String),
    /// The template's own `raise_exception(message)`: the conversation is one it refuses.
    #[error("chat template refused the conversation: {0}")]
    Raised(String),
    #[error("chat template failed: {0}")]
    Render(String),
}

/// The error `raise_exception` returns, found again in the render error's sources.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// What a render is given besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    /// OpenAI tool definitions (`[{"type": "function", "function": {...}}]`), passed
    /// as given; `None` renders with `tools` = none, as transformers does.
    pub tools: Option<serde_json::Value>,
    pub bos_token: String,
    pub eos_token: String,
    /// Further variables templates read: `enable_thinking`, `reasoning_effort`, ...
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

/// How Python's `json.dumps` writes (HF's `tojson` passes its four arguments on).
struct PyJson {
    /// `indent`: None writes one line; Some(s) a newline and s per level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl Default for PyJson {
    fn default() -> Self {
        PyJson {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

impl PyJson {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            out.push_str(&ind.repeat(level));
        }
    }

    fn write(&self, v: &serde_json::Value, level: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => out.push_str(&n.to_string()),
            J::String(s) => self.string(s, out),
            J::Array(a) if a.is_empty() => out.push_str("[]"),
            J::Object(o) if o.is_empty() => out.push_str("{}"),
            J::Array(a) => {
                out.push('[');
                for (i, e) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(e, level + 1, out);
                }
                self.newline(out, level);
                out.push(']');
            }
            J::Object(o) => {
                let mut entries: Vec<(&String, &serde_json::Value)> = o.iter().collect();
                if self.sort_keys {
                    // Python compares str by code point: UTF-8 byte order is the same.
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, e)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(e, level + 1, out);
                }
                self.newline(out, level);
                out.push('}');
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    // Past the BMP as a surrogate pair, as Python writes it.
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// `json.dumps` with those arguments (no HTML escaping, unlike Jinja2's own).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let bad = |what: &str| Error::new(ErrorKind::InvalidOperation, format!("tojson: {what}"));
    let mut style = PyJson::default();
    if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
        style.indent = match (indent.as_i64(), indent.as_str()) {
            _ if indent.is_none() || indent.is_undefined() => None,
            (Some(n), _) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => return Err(bad("indent must be an integer or a string")),
        };
        if style.indent.is_some() {
            style.item_sep = ",".into();
        }
    }
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        let [item, key] = <[String; 2]>::try_from(seps)
            .map_err(|_| bad("separators must be two strings (item, key)"))?;
        style.item_sep = item;
        style.key_sep = key;
    }
    style.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    style.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
}

/// Python's notion, which templates test before `| length` (`tools is iterable and
/// tools | length > 0`): strings, sequences, mappings and undefined iterate; none,
/// numbers and booleans do not (minijinja's own test says yes to none).
fn is_iterable(v: &Value) -> bool {
    use minijinja::value::ValueKind as K;
    matches!(
        v.kind(),
        K::Undefined | K::String | K::Bytes | K::Seq | K::Map | K::Iterable
    )
}

/// transformers' `{% generation %}…{% endgeneration %}` (a training-mask marker) renders
/// its body: rewritten as `{% if true %}…{% endif %}`, which keeps the tags' whitespace
/// control (`{%-`, `-%}`) and so the bytes around them.
fn rewrite_generation_blocks(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        // The closing `%}` after the opening `{%` (in `{%}` they overlap).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (left, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, right) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{left} if true {right}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{left} endif {right}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The proleptic Gregorian (year, month 1..=12, day 1..=31) of `days` since 1970-01-01
/// (Howard Hinnant's `civil_from_days`). Also what `llamay bench` stamps its results with.
pub fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `strftime_now(fmt)`: the current UTC date, for the formats templates use.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_date((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", month)
        .replace("%b", &month[..3])
        .replace("%H", &format!("{:02}", secs / 3600 % 24))
        .replace("%M", &format!("{:02}", secs / 60 % 60))
}

impl ChatTemplate {
    /// Compiles a template.
    pub fn new(source: &str) -> Result<Self, TemplateError> {
        Self::build(source, None)
    }

    /// As [`ChatTemplate::new`], with `strftime_now` returning `date` whatever the format:
    /// reproducible renders for tests and comparisons.
    pub fn with_fixed_date(source: &str, date: &str) -> Result<Self, TemplateError> {
        Self::build(source, Some(date.to_string()))
    }

    fn build(source: &str, fixed_date: Option<String>) -> Result<Self, TemplateError> {
        let source = rewrite_generation_blocks(source);
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_test("iterable", is_iterable);
        match fixed_date {
            Some(date) => env.add_function("strftime_now", move |_fmt: String| date.clone()),
            None => env.add_function("strftime_now", strftime_now),
        }
        env.add_template_owned("chat", source)
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        Ok(ChatTemplate { env })
    }

    /// Renders `messages` as transformers' `apply_chat_template` does.
    pub fn render(
        &self,
        messages: &[Message],
        opts: &RenderOptions,
    ) -> Result<String, TemplateError> {
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Syntax(e.to_string()))?;
        let mut out = Bounded {
            out: Vec::new(),
            limit: MAX_OUTPUT,
            overflowed: false,
        };
        let messages: Vec<serde_json::Value> =
            messages.iter().map(Message::to_template_value).collect();
        let mut vars = serde_json::Map::new();
        for (k, v) in &opts.kwargs {
            vars.insert(k.clone(), v.clone());
        }
        vars.insert("messages".into(), messages.into());
        vars.insert("tools".into(), opts.tools.clone().unwrap_or_default());
        vars.insert("documents".into(), serde_json::Value::Null);
        vars.insert(
            "add_generation_prompt".into(),
            opts.add_generation_prompt.into(),
        );
        vars.insert("bos_token".into(), opts.bos_token.clone().into());
        vars.insert("eos_token".into(), opts.eos_token.clone().into());
        let ctx = Value::from(minijinja::value::Serde(&vars));
        if let Err(e) = t.render_captured_to(ctx, &mut out) {
            if out.overflowed {
                return Err(TemplateError::Render(format!(
                    "the rendered prompt would exceed {} MiB",
                    MAX_OUTPUT >> 20
                )));
            }
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = source {
                if let Some(Raised(msg)) = s.downcast_ref::<Raised>() {
                    return Err(TemplateError::Raised(msg.clone()));
                }
                source = s.source();
            }
            return Err(TemplateError::Render(format!("{e:#}")));
        }
        // Templates are UTF-8 and so is every value they are given.
        String::from_utf8(out.out).map_err(|e| TemplateError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(-1), (1969, 12, 31));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(20_786), (2026, 11, 29));
    }

    #[test]
    fn tojson_is_pythons() {
        // Each expected text is what Python 3.11's json.dumps(v, **kwargs) prints.
        let v = serde_json::json!({"b": [1, "x\n\"<y>\"", true, null], "é": {}, "a": "日😀"});
        let render = |args: &str| {
            let t = format!("{{{{ v | tojson({args}) }}}}");
            let mut env = Environment::new();
            env.add_filter("tojson", tojson);
            env.render_str(
                &t,
                minijinja::context! { v => Value::from(minijinja::value::Serde(&v)) },
            )
            .unwrap()
        };
        assert_eq!(
            render(""),
            r#"{"b": [1, "x\n\"<y>\"", true, null], "é": {}, "a": "日😀"}"#
        );
        assert_eq!(
            render("ensure_ascii=True"),
            r#"{"b": [1, "x\n\"<y>\"", true, null], "\u00e9": {}, "a": "\u65e5\ud83d\ude00"}"#
        );
        assert_eq!(
            render("sort_keys=True, separators=(',', ':')"),
            r#"{"a":"日😀","b":[1,"x\n\"<y>\"",true,null],"é":{}}"#
        );
        assert_eq!(
            render("indent=2"),
            "{\n  \"b\": [\n    1,\n    \"x\\n\\\"<y>\\\"\",\n    true,\n    null\n  ],\n  \"é\": {},\n  \"a\": \"日😀\"\n}"
        );
        assert_eq!(
            render("indent='\t', sort_keys=True"),
            "{\n\t\"a\": \"日😀\",\n\t\"b\": [\n\t\t1,\n\t\t\"x\\n\\\"<y>\\\"\",\n\t\ttrue,\n\t\tnull\n\t],\n\t\"é\": {}\n}"
        );
    }

    #[test]
    fn generation_blocks_keep_their_whitespace_control() {
        assert_eq!(
            rewrite_generation_blocks("a {%- generation %}b{% endgeneration -%} c {% if x %}"),
            "a {%- if true %}b{% endif -%} c {% if x %}"
        );
        assert_eq!(rewrite_generation_blocks("{{ x }} {%"), "{{ x }} {%");
        // Found by fuzzing: `{%}` (the close overlapping the open) and friends.
        for s in ["{%}", "{%%}", "{%-%}", "{%}%}"] {
            assert_eq!(rewrite_generation_blocks(s), s);
        }
    }

    #[test]
    fn hostile_templates_are_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}"),
            Err(TemplateError::Syntax(_))
        ));
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        )
        .unwrap();
        assert!(
            matches!(t.render(&[], &opts()), Err(TemplateError::Render(_))),
            "fuel runs out"
        );
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        let e = t.render(&[], &opts()).unwrap_err();
        assert_eq!(e, TemplateError::Raised("no system role".into()));
    }

    fn opts() -> RenderOptions {
        RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        }
    }

    fn render_err(src: &str) -> String {
        let t = ChatTemplate::new(src).unwrap();
        match t.render(&[Message::new("user", "hi")], &opts()) {
            Err(TemplateError::Render(e)) => e,
            other => panic!("{src}: {other:?}"),
        }
    }

    /// One instruction asking for 2 GiB: refused before it allocates.
    #[test]
    fn a_huge_string_repetition_is_an_error() {
        // minijinja checks the result's size against the fuel left (its fuel also
        // pays for bytes) and against its own 100 MB cap, before the allocation.
        for src in [
            "{{ 'x' * 2**31 }}",
            "{{ 'x' * 2147483648 }}",
            "{{ ('x' * 99999999) * 30 }}",
        ] {
            let e = render_err(src);
            assert!(e.contains("fuel") || e.contains("too large"), "{src}: {e}");
        }
    }

    /// Each iteration is cheap in fuel but makes 1 MB: stopped by the output bound,
    /// long before the 5 GB it asks for.
    #[test]
    fn output_beyond_the_bound_is_an_error() {
        let e = render_err("{% for i in range(5000) %}{{ 'x' * 1000000 }}{% endfor %}");
        assert!(e.contains("exceed"), "{e}");
        // Just under the bound renders.
        let t = ChatTemplate::new("{{ 'x' * 60000000 }}").unwrap();
        assert_eq!(t.render(&[], &opts()).unwrap().len(), 60_000_000);
    }

    #[test]
    fn endless_recursion_and_loops_are_errors() {
        let e = render_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(e.contains("recursion"), "{e}");
        let e = render_err("{% for m in messages * 100000000 %}{% endfor %}");
        assert!(!e.is_empty());
        let e = render_err("{% for i in range(10000000) %}{% endfor %}");
        assert!(e.contains("too many"), "{e}");
        let e = render_err(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        );
        assert!(e.contains("fuel"), "{e}");
    }
}
