#!/usr/bin/python3
"""Plots of `muonbed compare` (measured beside predicted) from its JSON:

  /usr/bin/python3 analysis/compare.py results/EXP/compare.json [--out DIR] [--timeline POINT]
                                       [--formats png,pdf]

Writes <exp>-compare-scatter (predicted vs measured, y = x and +-10 % bands), <exp>-compare-points
(per-point bars with error %) and <exp>-compare-timeline-<point> (measured trace over the
predicted one) as PNG and PDF; analysis/muonbed_plots/compare.py says what each shows.
Exit codes: 0 written (or matplotlib missing), 1 nothing to plot or unreadable input, 2 bad
arguments.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True

from muonbed_plots.compare import plot_compare  # noqa: E402
from muonbed_plots.loader import LoadError  # noqa: E402
from muonbed_plots.style import Plotter, setup_style  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compare_json")
    ap.add_argument("--out", default=None, help="folder for the figures (default: beside the "
                    "JSON, in compare/)")
    ap.add_argument("--timeline", default=None, help="point (sweep label) of the overlay")
    ap.add_argument("--formats", default="png,pdf")
    args = ap.parse_args(argv)
    try:
        with open(args.compare_json, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare.py: error: {args.compare_json}: {e}", file=sys.stderr)
        return 1
    if not isinstance(doc, dict) or not doc.get("points"):
        print(f"compare.py: error: {args.compare_json}: no compared points", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare.py: matplotlib is missing for this python; nothing drawn", file=sys.stderr)
        return 0
    setup_style(matplotlib)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.compare_json)), "compare")
    formats = [f for f in args.formats.split(",") if f]
    p = Plotter(plt, out, formats, max_ranks=64)
    try:
        plot_compare(p, doc, args.timeline)
    except LoadError as e:
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 1
    if not p.written:
        print("compare.py: nothing to plot", file=sys.stderr)
        return 1
    print("plots:")
    for path in p.written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
