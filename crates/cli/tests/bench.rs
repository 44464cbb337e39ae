//! `llamay bench` on a generated fixture (scripts/gen-arch-fixtures): llama-bench's
//! markdown columns and JSON field names, depth, and bad flags.

mod common;

use common::{fixture, llamay, ok_stdout};

use std::process::Output;

fn assert_error(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(o.stdout.is_empty(), "nothing on stdout on failure");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "expected '{needle}' in: {err}"
    );
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_string())
        .collect()
}

#[test]
fn markdown_has_llama_bench_columns() {
    let m = fixture("llama-Q8_0.gguf");
    let out = ok_stdout(&llamay(&[
        "bench",
        m.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
    ]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        cells(lines[0]),
        [
            "model", "size", "params", "backend", "threads", "test", "t/s"
        ],
        "{out}"
    );
    assert!(lines[1].starts_with("| ---") && lines[1].contains("---: |"));
    let pp = cells(lines[2]);
    let tg = cells(lines[3]);
    assert!(
        pp[0].starts_with("llama ") && pp[0].ends_with("Q8_0"),
        "{out}"
    );
    assert!(pp[1].ends_with(" MiB") && pp[2].ends_with(" M"), "{out}");
    assert!(pp[3].starts_with("CPU"), "{out}");
    assert_eq!(pp[4], "1");
    assert_eq!((pp[5].as_str(), tg[5].as_str()), ("pp16", "tg4"));
    for row in [&pp, &tg] {
        let (avg, sd) = row[6].split_once(" ± ").expect("mean ± stddev");
        assert!(avg.parse::<f64>().unwrap() > 0.0 && sd.parse::<f64>().unwrap() >= 0.0);
    }
    assert!(out.contains("\nbuild: llamay "), "{out}");
}

/// The command-line contract's default: `-r 3`.
#[test]
fn repetitions_default_to_three() {
    let m = fixture("llama-Q8_0.gguf");
    let out = ok_stdout(&llamay(&[
        "bench",
        m.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "0",
        "-t",
        "1",
        "-o",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("a JSON array");
    assert_eq!(v[0]["samples_ns"].as_array().unwrap().len(), 3, "{out}");
}

#[test]
fn json_has_llama_bench_fields() {
    let m = fixture("llama-Q8_0.gguf");
    let out = ok_stdout(&llamay(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "3",
        "-d",
        "5",
        "-r",
        "3",
        "-o",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("a JSON array");
    let tests = v.as_array().expect("array");
    assert_eq!(tests.len(), 2);
    for (t, (p, g)) in tests.iter().zip([(8, 0), (0, 3)]) {
        for f in [
            "build_commit",
            "cpu_info",
            "backends",
            "model_filename",
            "model_type",
            "test_time",
            "type_k",
        ] {
            assert!(t[f].is_string(), "{f}: {t}");
        }
        for f in [
            "model_size",
            "model_n_params",
            "n_threads",
            "n_batch",
            "n_ubatch",
            "avg_ns",
            "stddev_ns",
        ] {
            assert!(t[f].is_u64(), "{f}: {t}");
        }
        assert_eq!(t["n_prompt"], p);
        assert_eq!(t["n_gen"], g);
        assert_eq!(t["n_depth"], 5);
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(t["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert_eq!(t["samples_ns"].as_array().unwrap().len(), 3);
        assert_eq!(t["samples_ts"].as_array().unwrap().len(), 3);
        assert!(
            t["model_filename"]
                .as_str()
                .unwrap()
                .ends_with("llama-Q8_0.gguf")
        );
    }
    // jsonl: one object a line, same fields.
    let out = ok_stdout(&llamay(&[
        "bench",
        m.to_str().unwrap(),
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "-o",
        "jsonl",
    ]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let t: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(
        (t["n_prompt"].as_u64(), t["n_gen"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(
        t["stddev_ts"].as_f64(),
        Some(0.0),
        "one repetition: no spread"
    );
}

#[test]
fn bad_flags_are_one_error_line() {
    let m = fixture("llama-Q8_0.gguf");
    let m = m.to_str().unwrap();
    assert_error(&llamay(&["bench", m, "-o", "csv"]), "-o csv");
    assert_error(
        &llamay(&["bench", m, "-p", "0", "-n", "0"]),
        "nothing to measure",
    );
    assert_error(&llamay(&["bench", m, "-r", "0"]), "-r 0");
    assert_error(&llamay(&["bench", m, "-t", "0"]), "-t 0");
    assert_error(&llamay(&["bench", m, "-p", "x"]), "-p");
    assert_error(&llamay(&["bench", m, "--kv", "q4"]), "--kv q4");
    assert_error(&llamay(&["bench"]), "no model given");
    assert_error(&llamay(&["bench", "/nonexistent.gguf"]), "nonexistent");
}
