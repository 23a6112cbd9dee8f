#!/usr/bin/env python3
"""Side-by-side table of Newton-Schulz timings: PyTorch's Muon against muonbed's kernel versions.

Reads the JSON files `muonbed bench ns --json` (one per kernel version) and
`kernels/dev/bench_torch_muon.py --json` write, matches rows by (batch, rows, cols), and prints
a Markdown table: the median milliseconds of each implementation and each version's speed-up
over PyTorch (PyTorch's median / the version's median; > 1 means muonbed is faster). A group's
rows (the llama-7b Muon set) are also summed into one "whole set" row.

  python3 kernels/dev/compare_ns.py --torch torch.json v1.json v2.json
"""

import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def label(record):
    if record.get("implementation") == "torch":
        return f"torch {record.get('torch_version', '')}".strip()
    return f"v{record['kernel_version']} {record['kernel']}"


def timed_rows(record):
    return {(r["batch"], r["rows"], r["cols"]): r for r in record["results"] if not r["skipped"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="bench_torch_muon.py --json output")
    parser.add_argument("muonbed", nargs="+", help="muonbed bench ns --json outputs")
    args = parser.parse_args()

    torch_record = load(args.torch)
    versions = [load(p) for p in args.muonbed]
    torch_rows = timed_rows(torch_record)
    version_rows = [timed_rows(v) for v in versions]

    header = ["shape", "batch", f"{label(torch_record)} ms"]
    for v in versions:
        header += [f"{label(v)} ms", "speed-up"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")

    def cells(key_rows, key):
        torch_ms = key_rows[0]
        out = [f"{torch_ms:.3f}" if torch_ms is not None else "–"]
        for ms in key_rows[1:]:
            if ms is None:
                out += ["–", "–"]
            else:
                speedup = f"{torch_ms / ms:.2f}x" if torch_ms is not None else "–"
                out += [f"{ms:.3f}", speedup]
        return out

    group_totals = {}
    for r in torch_record["results"]:
        key = (r["batch"], r["rows"], r["cols"])
        times = [torch_rows[key]["median_ms"] if key in torch_rows else None]
        times += [rows[key]["median_ms"] if key in rows else None for rows in version_rows]
        name = f"{r['rows']}x{r['cols']}" + (f" ({r['group']})" if r["group"] else "")
        print("| " + " | ".join([name, str(r["batch"])] + cells(times, key)) + " |")
        if r["group"]:
            totals = group_totals.setdefault(r["group"], [0.0] * len(times))
            for i, t in enumerate(times):
                totals[i] = None if t is None or totals[i] is None else totals[i] + t
    for group, totals in group_totals.items():
        print("| " + " | ".join([f"**whole {group} set**", ""] + cells(totals, None)) + " |")
    gemm = [f"{label(torch_record)} {torch_record['gemm_tflops']:.0f}"]
    gemm += [f"{label(v)} {v['gemm_tflops']:.0f}" for v in versions]
    print(f"\n8192^3 bf16 GEMM yardstick in the same runs (TFLOP/s): {', '.join(gemm)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
