#!/usr/bin/env python3
"""Times PyTorch's own Muon Newton-Schulz on the shapes `muonbed bench ns` uses, for comparison.

The function timed is torch.optim.Muon's orthogonalization, torch.optim._muon._zeropower_via_newtonschulz
(bf16, Keller Jordan's coefficients, 5 steps, eps 1e-7); it takes one 2-D matrix, so a batched
group (the llama-7b Muon set) is timed as a loop over its matrices, as torch.optim.Muon runs it.
Columns match muonbed's table: shape, batch, median_ms, p95_ms, TFLOP/s counted as
batch * steps * (4 m^2 n + 2 m^3) with m <= n, and % of a large bf16 GEMM's TFLOP/s measured in
the same run. CUDA events, warm-ups, median of many runs, inputs rotated, L2 flushed before each.

Without torch (or without torch.optim.Muon) it says so and exits 0. Without CUDA it times the
CPU on the smaller CPU shapes and says so.

  python3 kernels/dev/bench_torch_muon.py [--repeats 30] [--warmup 5] [--no-model-set]
                                         [--json torch.json]

--json writes the rows in the layout of `muonbed bench ns --json`, for kernels/dev/compare_ns.py.
"""

import argparse
import json
import os
import statistics
import sys
import time

STEPS = 5
COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7
GPU_SHAPES = [(1, 1024, 1024), (1, 2048, 2048), (1, 4096, 4096), (1, 8192, 8192),
              (1, 4096, 11008), (1, 8192, 28672)]
# llama-7b's Muon parameters grouped by shape (32 layers; embeddings and lm_head use AdamW).
LLAMA_7B_GROUPS = [(64, 11008, 4096), (128, 4096, 4096), (32, 4096, 11008)]
CPU_SHAPES = [(1, 256, 256), (1, 512, 512), (1, 1024, 1024), (1, 512, 1376)]


def ns_flops(batch, rows, cols, steps=STEPS):
    m, n = min(rows, cols), max(rows, cols)
    return batch * steps * (4.0 * m * m * n + 2.0 * m ** 3)


def percentile95(values):
    ordered = sorted(values)
    rank = max(1, -(-95 * len(ordered) // 100))  # nearest rank, ceil(0.95 n)
    return ordered[rank - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--no-model-set", action="store_true", help="skip the llama-7b groups")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    args = parser.parse_args()

    try:
        import torch
    except ImportError:
        print("bench_torch_muon: PyTorch is not installed here (import torch failed); nothing "
              "to time. Install torch >= 2.9 (torch.optim.Muon) and run again.")
        return 0
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz as zeropower
    except ImportError:
        print(f"bench_torch_muon: torch {torch.__version__} has no torch.optim.Muon "
              "(added in 2.9); nothing to time.")
        return 0

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    repeats = args.repeats if args.repeats is not None else (30 if cuda else 5)
    if cuda:
        name = torch.cuda.get_device_name(device)
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        flush = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=device)
        print(f"torch {torch.__version__} Muon Newton-Schulz on GPU {name}: bf16, "
              f"keller_jordan x{STEPS}; median of {repeats} runs after {warmup} warm-ups, "
              "L2 flushed before each run, inputs rotated")
    else:
        flush = None
        print(f"torch {torch.__version__} Muon Newton-Schulz ran on the CPU, not a GPU "
              f"(torch.cuda.is_available() is False): bf16 as torch computes it; median of "
              f"{repeats} runs after {warmup} warm-up(s)")

    def timed(fn):
        """Milliseconds of fn(): CUDA events on the GPU, a wall clock on the CPU."""
        if cuda:
            flush.zero_()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    # The yardstick: a large bf16 GEMM (fp32 accumulation) on the GPU, 1024^3 fp32 on the CPU.
    size = 8192 if cuda else 1024
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.rand(size, size, device=device, dtype=dtype)
    b = torch.rand(size, size, device=device, dtype=dtype)
    for _ in range(warmup):
        a @ b
    gemm_ms = statistics.median(timed(lambda: a @ b) for _ in range(repeats))
    gemm_tflops = 2.0 * size ** 3 / (gemm_ms * 1e-3) / 1e12
    print(f"yardstick: {size}^3 {'bf16' if cuda else 'fp32'} GEMM (torch.matmul) "
          f"{gemm_tflops:.1f} TFLOP/s")
    del a, b

    rows = [(s, "") for s in (GPU_SHAPES if cuda else CPU_SHAPES)]
    if cuda and not args.no_model_set:
        rows += [(s, "llama-7b") for s in LLAMA_7B_GROUPS]

    records = []
    print(f"{'shape':<16}{'batch':>7}{'median_ms':>12}{'p95_ms':>12}{'TFLOP/s':>11}{'%GEMM':>10}")
    for (batch, r, c), group in rows:
        try:
            # Two inputs in turn; a batch is one fp32 tensor, orthogonalized matrix by matrix.
            inputs = [torch.rand(batch, r, c, device=device) * 2 - 1 for _ in range(2)]

            def run(x):
                for i in range(batch):
                    zeropower(x[i], COEFFICIENTS, STEPS, EPS)

            for k in range(warmup):
                run(inputs[k % 2])
            ms = [timed(lambda k=k: run(inputs[k % 2])) for k in range(repeats)]
            del inputs
        except torch.cuda.OutOfMemoryError:
            print(f"{f'{r}x{c}':<16}{batch:>7}  skipped: out of memory")
            records.append({"batch": batch, "rows": r, "cols": c, "group": group,
                            "flops": ns_flops(batch, r, c), "skipped": "out of memory"})
            continue
        median = statistics.median(ms)
        tflops = ns_flops(batch, r, c) / (median * 1e-3) / 1e12
        tail = f"  ({group})" if group else ""
        print(f"{f'{r}x{c}':<16}{batch:>7}{median:>12.3f}{percentile95(ms):>12.3f}"
              f"{tflops:>11.{4 if tflops < 1 else 1}f}{100 * tflops / gemm_tflops:>9.1f}%{tail}")
        records.append({"batch": batch, "rows": r, "cols": c, "group": group,
                        "flops": ns_flops(batch, r, c), "skipped": "", "median_ms": median,
                        "p95_ms": percentile95(ms), "max_ms": max(ms), "tflops": tflops,
                        "fraction_of_gemm": tflops / gemm_tflops})
    print("TFLOP/s counts batch * steps * (4 m^2 n + 2 m^3), m <= n; % is of the GEMM rate above.")
    if args.json:
        record = {"device": "gpu" if cuda else "cpu", "implementation": "torch",
                  "torch_version": torch.__version__,
                  "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
                  "coefficients": "keller_jordan", "steps": STEPS, "gemm_tflops": gemm_tflops,
                  "results": records}
        tmp = f"{args.json}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
