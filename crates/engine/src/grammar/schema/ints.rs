//! Integer and number ranges as grammar: `minimum` / `maximum` / `exclusiveMinimum` /
//! `exclusiveMaximum` become alternatives over decimal digits, so that every sentence
//! lies in the range (llama.cpp's json-schema-to-grammar builds integer ranges the same
//! way; numbers with whole bounds go beyond it).

/// The largest magnitude the `integer` primitive writes (16 digits).
pub const MAX_MAGNITUDE: i128 = 9_999_999_999_999_999;

fn digits(n: i128) -> usize {
    n.to_string().len()
}

/// The digit strings of equal length `lo..=hi` (lo ≤ hi, both `n` digits) as one
/// expression.
fn same_len(lo: &[u8], hi: &[u8]) -> String {
    debug_assert_eq!(lo.len(), hi.len());
    if lo == hi {
        return format!("\"{}\"", std::str::from_utf8(lo).expect("digits"));
    }
    let n = lo.len() - 1;
    let (l0, h0) = (lo[0] as char, hi[0] as char);
    if l0 == h0 {
        return format!("\"{l0}\" {}", same_len(&lo[1..], &hi[1..]));
    }
    let tail = |n: usize| {
        if n == 0 {
            String::new()
        } else {
            format!(" [0-9]{{{n}}}")
        }
    };
    let low_whole = lo[1..].iter().all(|&d| d == b'0');
    let high_whole = hi[1..].iter().all(|&d| d == b'9');
    let mut alts = Vec::new();
    let (mut first, mut last) = (lo[0], hi[0]);
    if !low_whole {
        alts.push(format!("\"{l0}\" ({})", same_len(&lo[1..], &vec![b'9'; n])));
        first += 1;
    }
    if !high_whole {
        last -= 1;
    }
    if first <= last {
        let class = if first == last {
            format!("\"{}\"", first as char)
        } else {
            format!("[{}-{}]", first as char, last as char)
        };
        alts.push(format!("{class}{}", tail(n)));
    }
    if !high_whole {
        alts.push(format!("\"{h0}\" ({})", same_len(&vec![b'0'; n], &hi[1..])));
    }
    format!("({})", alts.join(" | "))
}

/// Non-negative integers `lo..=hi` (`hi` None: up to the primitive's 16 digits), no
/// leading zeros; None when the range is empty.
fn non_negative(lo: i128, hi: Option<i128>) -> Option<String> {
    let hi_n = hi.unwrap_or(MAX_MAGNITUDE).min(MAX_MAGNITUDE);
    if lo > hi_n {
        return None;
    }
    let mut alts = Vec::new();
    let (dl, dh) = (digits(lo), digits(hi_n));
    // With no upper bound, the lengths past lo's are one class.
    let last_exact = if hi.is_none() { dl } else { dh };
    for len in dl..=last_exact {
        let floor = if len == 1 {
            0
        } else {
            10i128.pow(len as u32 - 1)
        };
        let ceil = 10i128.pow(len as u32) - 1;
        let (a, b) = (lo.max(floor), hi_n.min(ceil));
        if a <= b {
            alts.push(same_len(a.to_string().as_bytes(), b.to_string().as_bytes()));
        }
    }
    if hi.is_none() && dl < digits(MAX_MAGNITUDE) {
        alts.push(format!("[1-9] [0-9]{{{dl},{}}}", digits(MAX_MAGNITUDE) - 1));
    }
    Some(format!("({})", alts.join(" | ")))
}

/// Integers `lo..=hi` as JSON writes them (None: unbounded on that side); None when
/// the range holds no integer the primitive can write.
pub fn integers(lo: Option<i128>, hi: Option<i128>) -> Option<String> {
    let lo_c = lo.unwrap_or(-MAX_MAGNITUDE).max(-MAX_MAGNITUDE);
    let hi_c = hi.unwrap_or(MAX_MAGNITUDE).min(MAX_MAGNITUDE);
    if lo_c > hi_c {
        return None;
    }
    let mut alts = Vec::new();
    if lo_c < 0 {
        // -m for m in max(1, -hi)..=-lo.
        let m_lo = 1.max(-hi_c);
        let m_hi = if lo.is_none() { None } else { Some(-lo_c) };
        if let Some(e) = non_negative(m_lo, m_hi) {
            alts.push(format!("\"-\" {e}"));
        }
    }
    if hi_c >= 0 {
        let h = if hi.is_none() { None } else { Some(hi_c) };
        if let Some(e) = non_negative(lo_c.max(0), h) {
            alts.push(e);
        }
    }
    (!alts.is_empty()).then(|| format!("({})", alts.join(" | ")))
}

/// A bound of a range: its value and whether it is exclusive.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub value: f64,
    pub exclusive: bool,
}

/// Integers within the bounds (a fractional bound rounds inward).
pub fn integer_range(lo: Option<Bound>, hi: Option<Bound>) -> Option<String> {
    let lo = lo.map(|b| {
        let c = b.value.ceil();
        (if b.exclusive && c == b.value {
            c + 1.0
        } else {
            c
        }) as i128
    });
    let hi = hi.map(|b| {
        let f = b.value.floor();
        (if b.exclusive && f == b.value {
            f - 1.0
        } else {
            f
        }) as i128
    });
    integers(lo, hi)
}

/// Numbers within whole-number bounds, written without an exponent: the whole numbers
/// in range, and the fractions whose floor `n` keeps `n < x < n + 1` in range.
pub fn number_range(lo: Option<Bound>, hi: Option<Bound>) -> Option<String> {
    let whole = integer_range(lo, hi);
    // A fraction x with floor n: x > lo ⟺ n ≥ lo and x < hi ⟺ n ≤ hi − 1, for whole
    // bounds, exclusive or not.
    let n_lo = lo.map(|b| b.value as i128);
    let n_hi = hi.map(|b| b.value as i128 - 1);
    let frac = "\".\" [0-9]{0,15} [1-9]";
    let mut alts: Vec<String> = whole.into_iter().collect();
    let (a, b) = (n_lo.unwrap_or(i128::MIN).max(0), n_hi);
    if b.is_none_or(|b| a <= b)
        && let Some(e) = non_negative(a, b)
    {
        alts.push(format!("{e} {frac}"));
    }
    // Negative fractions: x = −(m + f) with floor n = −m − 1, so m = −n − 1.
    if n_lo.is_none_or(|l| l < 0) {
        let m_lo = n_hi.map_or(0, |h| (-h - 1).max(0));
        let m_hi = n_lo.map(|l| -l - 1);
        if m_hi.is_none_or(|h| m_lo <= h)
            && let Some(e) = non_negative(m_lo, m_hi)
        {
            alts.push(format!("\"-\" {e} {frac}"));
        }
    }
    (!alts.is_empty()).then(|| format!("({})", alts.join(" | ")))
}
