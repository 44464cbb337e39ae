#!/usr/bin/env python3
"""Transcribes the i-quant codebooks and sign tables from llama.cpp's ggml-common.h into
crates/formats/src/tables.rs. The tables are data: generating them avoids typos.

usage: scripts/ref-quantize/gen-tables.py [LLAMA_CPP_DIR] > crates/formats/src/tables.rs
       cargo fmt -p llamay-formats   (the committed file is rustfmt-formatted)
"""
import os
import re
import subprocess
import sys

TABLES = [
    # (C name, Rust name, Rust type, expected length)
    ("kmask_iq2xs", "KMASK_IQ2XS", "u8", 8),
    ("ksigns_iq2xs", "KSIGNS_IQ2XS", "u8", 128),
    ("iq2xxs_grid", "IQ2XXS_GRID", "u64", 256),
    ("iq2xs_grid", "IQ2XS_GRID", "u64", 512),
    ("iq2s_grid", "IQ2S_GRID", "u64", 1024),
    ("iq3xxs_grid", "IQ3XXS_GRID", "u32", 256),
    ("iq3s_grid", "IQ3S_GRID", "u32", 512),
    ("kvalues_iq4nl", "KVALUES_IQ4NL", "i8", 16),
    ("kvalues_fp4", "KVALUES_MXFP4", "i8", 16),
]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
        [os.path.join(os.path.dirname(__file__), "..", "fetch-ref")],
        check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    text = open(os.path.join(root, "ggml", "src", "ggml-common.h")).read()
    out = [
        "//! i-quant codebooks, sign tables and 4-bit value tables, transcribed from llama.cpp",
        "//! b11434 `ggml/src/ggml-common.h` by `scripts/ref-quantize/gen-tables.py`. Generated: do",
        "//! not edit by hand; the checksums in the tests pin every entry.",
        "",
    ]
    for cname, rname, rtype, n in TABLES:
        m = re.search(r"GGML_TABLE_BEGIN\(\w+,\s*%s,\s*\w+\)(.*?)GGML_TABLE_END\(\)" % cname, text, re.S)
        if not m:
            sys.exit(f"table {cname} not found")
        body = re.sub(r"//[^\n]*", "", m.group(1))
        vals = [int(v, 0) for v in re.findall(r"-?(?:0x[0-9a-fA-F]+|\d+)", body)]
        if len(vals) != n:
            sys.exit(f"table {cname}: {len(vals)} entries, expected {n}")
        width = {"u8": 2, "u32": 8, "u64": 16, "i8": 0}[rtype]
        per_line = {"u8": 16, "u32": 8, "u64": 4, "i8": 16}[rtype]
        fmt = (lambda v: str(v)) if width == 0 else (lambda v, w=width: "0x%0*x" % (w, v))
        out.append(f"pub(crate) static {rname}: [{rtype}; {n}] = [")
        for i in range(0, n, per_line):
            out.append("    " + ", ".join(fmt(v) for v in vals[i:i + per_line]) + ",")
        out.append("];")
        out.append("")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
