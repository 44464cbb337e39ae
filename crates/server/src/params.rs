//! Request fields read with their ranges checked: every bad value is a 400 whose
//! message names the field (`options.top_k: must be an integer >= 0, got -1`).

use crate::error::ApiError;
use serde_json::{Map, Value};

/// A JSON object's fields, named with `prefix` in errors (`options.`, or none).
pub struct Fields<'a> {
    map: Option<&'a Map<String, Value>>,
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    /// `v` must be an object or absent/null.
    pub fn of(v: Option<&'a Value>, prefix: &'static str) -> Result<Self, ApiError> {
        match v {
            None | Some(Value::Null) => Ok(Fields { map: None, prefix }),
            Some(Value::Object(m)) => Ok(Fields {
                map: Some(m),
                prefix,
            }),
            Some(_) => Err(ApiError::field(
                prefix.trim_end_matches('.'),
                "must be a JSON object",
            )),
        }
    }

    pub fn top(map: &'a Map<String, Value>) -> Self {
        Fields {
            map: Some(map),
            prefix: "",
        }
    }

    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map?.get(key).filter(|v| !v.is_null())
    }

    pub fn err(&self, key: &str, why: impl std::fmt::Display) -> ApiError {
        ApiError::field(&self.name(key), why)
    }

    /// A number in `[lo, hi]`.
    pub fn f32(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x as f32)),
            Some(x) => Err(self.err(key, format!("must be between {lo} and {hi}, got {x}"))),
            None => Err(self.err(key, format!("must be a number, got {v}"))),
        }
    }

    /// An integer in `[lo, hi]`.
    pub fn int(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            }),
            _ => None,
        };
        match n {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            Some(x) if x < lo => Err(self.err(key, format!("must be an integer >= {lo}, got {x}"))),
            Some(x) => Err(self.err(key, format!("must be an integer <= {hi}, got {x}"))),
            None => Err(self.err(key, format!("must be an integer, got {v}"))),
        }
    }

    /// A seed: any integer (negative ones wrap, as llama.cpp's -1 = random does not).
    pub fn seed(&self, key: &str) -> Result<Option<u64>, ApiError> {
        Ok(self.int(key, i64::MIN, i64::MAX)?.map(|s| s as u64))
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, format!("must be true or false, got {v}"))),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(key, format!("must be a string, got {v}"))),
        }
    }

    /// A string or a list of strings (`stop`).
    pub fn strings(&self, key: &str) -> Result<Vec<String>, ApiError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| self.err(key, "must be a string or a list of strings"))
                })
                .collect(),
            Some(_) => Err(self.err(key, "must be a string or a list of strings")),
        }
    }
}

/// A random seed for a request that gave none.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Ollama's `keep_alive`: seconds as a number, or a Go duration string ("5m", "1h30m",
/// "300ms"); negative: forever (`None`).
pub fn keep_alive(v: Option<&Value>) -> Result<Option<Option<std::time::Duration>>, ApiError> {
    use std::time::Duration;
    let bad = || {
        ApiError::field(
            "keep_alive",
            "must be a number of seconds or a duration such as \"5m\" or \"-1\"",
        )
    };
    let secs = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(bad)?,
        Some(Value::String(s)) => go_duration(s).ok_or_else(bad)?,
        Some(_) => return Err(bad()),
    };
    if !secs.is_finite() {
        return Err(bad());
    }
    Ok(Some(
        (secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9))),
    ))
}

/// Seconds in a Go duration string; a bare number is seconds.
fn go_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<f64>() {
        return Some(n);
    }
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let mut total = 0.0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Some(if neg { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ranges_are_checked_and_the_field_named() {
        let v = json!({"top_k": -1, "temperature": "hot", "num_predict": 2.0, "seed": -1});
        let f = Fields::of(Some(&v), "options.").unwrap();
        let e = f.int("top_k", 0, 1 << 20).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(
            e.message
                .starts_with("options.top_k: must be an integer >= 0"),
            "{}",
            e.message
        );
        assert!(
            f.f32("temperature", 0.0, 100.0)
                .unwrap_err()
                .message
                .contains("options.temperature")
        );
        assert_eq!(f.int("num_predict", -2, i64::MAX).unwrap(), Some(2));
        assert_eq!(f.seed("seed").unwrap(), Some(u64::MAX));
        assert_eq!(f.int("absent", 0, 1).unwrap(), None);
    }

    #[test]
    fn keep_alive_reads_go_durations() {
        use std::time::Duration;
        assert_eq!(
            keep_alive(Some(&json!("5m"))).unwrap(),
            Some(Some(Duration::from_secs(300)))
        );
        assert_eq!(
            keep_alive(Some(&json!("1h30m"))).unwrap(),
            Some(Some(Duration::from_secs(5400)))
        );
        assert_eq!(
            keep_alive(Some(&json!(0))).unwrap(),
            Some(Some(Duration::ZERO))
        );
        assert_eq!(keep_alive(Some(&json!("-1"))).unwrap(), Some(None));
        assert_eq!(keep_alive(Some(&json!(-1))).unwrap(), Some(None));
        assert!(keep_alive(Some(&json!("soon"))).is_err());
        assert!(keep_alive(Some(&json!("5"))).is_ok());
    }
}
