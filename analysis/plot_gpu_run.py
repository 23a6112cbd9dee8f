"""Figures of a GPU device run (scripts/gpu-bundle's run.sh): the CUDA loopback runtime's step
times per point, eager beside graph-captured, from the worker's JSON rows
(muonbed-gpu-worker loopback ... --json FILE).

    /usr/bin/python3 plot_gpu_run.py RUN_FOLDER OUT_FOLDER

writes loopback.png (the quickstart's strategies as 8 logical ranks on one GPU) and
llama_loopback.png (one GPU, eager vs graph) for each JSON file present. Standard library and
matplotlib only.
"""

import json
import os
import sys


def plot(rows, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for row in rows:
        if row["point"] not in points:
            points.append(row["point"])
    modes = sorted({row["mode"] for row in rows})
    width = 0.8 / max(len(modes), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(points)), 4))
    for i, mode in enumerate(modes):
        xs, ys, errs = [], [], []
        for j, point in enumerate(points):
            for row in rows:
                if row["point"] == point and row["mode"] == mode:
                    xs.append(j + (i - (len(modes) - 1) / 2) * width)
                    ys.append(row["gpu_ms_p50"])
                    errs.append(max(row["gpu_ms_p95"] - row["gpu_ms_p50"], 0))
        ax.bar(xs, ys, width, yerr=[[0] * len(errs), errs], label=mode, capsize=3)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p.replace("strategy.name=", "") for p in points], rotation=20, ha="right")
    ax.set_ylabel("GPU step time, median (ms; bar to p95)")
    device = rows[0].get("device", "") if rows else ""
    ax.set_title(title + ("\n" + device if device else ""), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    print(path)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    src, dest = sys.argv[1], sys.argv[2]
    titles = {
        "loopback.json": "quickstart strategies, 8 logical ranks on one GPU (CUDA loopback)",
        "llama_loopback.json": "llama-7b shapes on one GPU: eager vs CUDA graph",
    }
    for name, title in titles.items():
        path = os.path.join(src, name)
        if os.path.exists(path):
            with open(path) as f:
                plot(json.load(f), title, os.path.join(dest, name.replace(".json", ".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
