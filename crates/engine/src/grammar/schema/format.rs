//! `format` on strings: each supported one is a grammar of the string's contents whose
//! every sentence the format's validator accepts (a valid subset: dates keep to days
//! every year has, so no 29 February), with the shortest and longest sentence in
//! characters, so that a length bound beside a format can be checked, not ignored.

pub struct Format {
    pub name: &'static str,
    /// GBNF of the contents between the quotes (may name `date` and `time`, defined
    /// with `date-time`).
    pub body: &'static str,
    pub min_len: u64,
    pub max_len: u64,
}

const DATE: &str = r#"[0-9]{3} [1-9] "-" ( ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) )"#;
const TIME: &str = r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])"#;

pub const FORMATS: &[Format] = &[
    Format {
        name: "date",
        body: DATE,
        min_len: 10,
        max_len: 10,
    },
    Format {
        name: "time",
        body: TIME,
        min_len: 9,
        max_len: 21,
    },
    Format {
        name: "date-time",
        body: "fmt-date \"T\" fmt-time",
        min_len: 20,
        max_len: 32,
    },
    Format {
        name: "uuid",
        body: r#"[0-9a-f]{8} "-" [0-9a-f]{4} "-" [1-5] [0-9a-f]{3} "-" [89ab] [0-9a-f]{3} "-" [0-9a-f]{12}"#,
        min_len: 36,
        max_len: 36,
    },
    Format {
        name: "ipv4",
        body: r#"fmt-octet "." fmt-octet "." fmt-octet "." fmt-octet"#,
        min_len: 7,
        max_len: 15,
    },
    Format {
        name: "email",
        body: r#"[a-z0-9_+-]{1,32} ("." [a-z0-9_+-]{1,32}){0,2} "@" fmt-label ("." fmt-label){0,2} "." [a-z]{2,6}"#,
        min_len: 6,
        max_len: 32 * 3 + 2 + 1 + 63 * 3 + 2 + 1 + 6,
    },
    Format {
        name: "uri",
        body: r#"("https" | "http") "://" fmt-label ("." fmt-label){0,3} ("/" [A-Za-z0-9._~-]{1,32}){0,8}"#,
        min_len: 8,
        max_len: 8 + 63 * 4 + 3 + 33 * 8,
    },
    Format {
        name: "duration",
        body: r#""P" ([0-9]{1,4} "D" ("T" fmt-clock)? | "T" fmt-clock)"#,
        min_len: 3,
        max_len: 1 + 5 + 1 + 5 + 5 + 12,
    },
];

/// Rules the format bodies name (emitted once, when a format is used).
pub const HELPERS: &str = r#"fmt-date ::= DATE
fmt-time ::= TIME
fmt-octet ::= [0-9] | [1-9] [0-9] | "1" [0-9]{2} | "2" [0-4] [0-9] | "25" [0-5]
fmt-label ::= [a-z0-9] ([a-z0-9-]{0,61} [a-z0-9])?
fmt-seconds ::= [0-9]{1,4} ("." [0-9]{1,6})? "S"
fmt-clock ::= [0-9]{1,4} "H" ([0-9]{1,4} "M")? fmt-seconds? | [0-9]{1,4} "M" fmt-seconds? | fmt-seconds
"#;

pub fn helpers() -> String {
    HELPERS.replace("DATE", DATE).replace("TIME", TIME)
}

pub fn find(name: &str) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.name == name)
}

pub fn names() -> String {
    FORMATS
        .iter()
        .map(|f| f.name)
        .collect::<Vec<_>>()
        .join(", ")
}
