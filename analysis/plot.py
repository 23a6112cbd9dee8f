#!/usr/bin/python3
"""Plots of one muonbed experiment's results: reads the results JSON files (schema of
core/results/results.hpp) and step traces under a folder and draws what the sweep makes meaningful.

  /usr/bin/python3 analysis/plot.py results/quickstart [--out DIR] [--formats png,pdf]
                   [--timelines none|first|all] [--skip-infeasible] [--claims FILE]
                   [--jobs N]

Plots (each as PNG and PDF, chosen from what varies in the sweep; one module each in
analysis/muonbed_plots/), one progress line each as they are drawn, by --jobs processes at once:
  <exp>-strategies     step time per sweep point, split into computation only, overlapped
                       communication, exposed communication and idle; average and worst step
                       apart; a log facet beside a % facet when one point is >10x another
  <exp>-training       (experiments with a training: section) each point's training step in %
                       of its AdamW step: compute, exposed communication, exposed optimizer
  <exp>-throughput     seed 002's per-GPU reporting: parameters updated/s, useful TFLOP/s (each
                       matrix once) and communication GB/s per GPU, each average and worst step
  <exp>-traffic        bytes per step by link class (NVLink/PCIe vs network) and peak memory
                       against one GPU's memory
  <exp>-scaling        step time and per-GPU throughput against GPU count (world size varies)
  <exp>-ranks-<be>     per-rank breakdown of each point (min/median/max ranks for big meshes)
  <exp>-timeline-<be>-<point>   one step's Gantt chart per rank and stream from the trace JSON
                       (--timelines: none, the first point's per backend, or all; many
                       communication lanes fold into one row per stream class)
  <exp>-claims         claimed vs predicted speedups, when the experiment states claims

Only verified results are drawn: listed in muonbed-run.json as the point they are (point
identity), with a matching SHA-256 checksum, every field a finite number of the right type.
Others are left out with the reason on stderr and a count in every figure's footer. Points whose
backends disagree by more than 10 % are marked ≠, points that exceed GPU memory ⊘ and grey
(--skip-infeasible leaves them out), and footers name each point's fidelity (marks.py).

Uses only the standard library, numpy and matplotlib (Debian's python3-matplotlib, importable by
/usr/bin/python3), PyYAML when present. Output is deterministic: fixed sizes and fonts, no dates
in the files' metadata, and only provenance (version, git hash) in the footer.
Exit codes: 0 plots written (or matplotlib missing), 1 nothing to plot or a write failed,
2 bad arguments.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

from muonbed_plots.claims import (ClaimsError, evaluate_claims, load_claims,  # noqa: E402
                                  plot_claims, seed000_rows)
from muonbed_plots.common import DEFAULT_MAX_RANKS, differ, num  # noqa: E402
from muonbed_plots.loader import FolderError, load_dir, report  # noqa: E402
from muonbed_plots.ranks import plot_ranks  # noqa: E402
from muonbed_plots.scaling import plot_scaling, scaling_series  # noqa: E402
from muonbed_plots.strategies import plot_strategies  # noqa: E402
from muonbed_plots.style import Plotter, setup_style  # noqa: E402
from muonbed_plots.sweep import Sweep  # noqa: E402
from muonbed_plots.throughput import plot_throughput  # noqa: E402
from muonbed_plots.timeline import plot_timeline, timeline_name  # noqa: E402
from muonbed_plots.traffic import plot_traffic  # noqa: E402
from muonbed_plots.training import has_training, plot_training  # noqa: E402


def label_order(manifest):
    """Point labels in the experiment's sweep order (the manifest lists them so)."""
    out = []
    for e in (manifest or {}).get("results", []):
        if isinstance(e, dict) and isinstance(e.get("point"), str) and e["point"] not in out:
            out.append(e["point"])
    return out


def figure_jobs(p, records, root, claims_file, manifest=None, timelines="first",
                skip_infeasible=False):
    """The figures of one experiment, in the order they are drawn: [(file name, draw)], each
    draw() a call that makes and saves that figure. Listed before any is drawn, so progress can
    say "figure 3 of 9"."""
    skipped = 0
    if skip_infeasible:
        out = {r.label for r in records if r.feasible is False}
        skipped = len(out)
        records = [r for r in records if r.label not in out]
        if not records:
            return [], skipped
    sweep = Sweep(records, label_order(manifest), skipped_infeasible=skipped)
    name = records[0].experiment
    jobs = [(f"{name}-strategies", lambda: plot_strategies(p, sweep, name)),
            (f"{name}-throughput", lambda: plot_throughput(p, sweep, name)),
            (f"{name}-traffic", lambda: plot_traffic(p, sweep, name))]
    if has_training(records):
        jobs.insert(1, (f"{name}-training", lambda: plot_training(p, sweep, name)))
    if any(scaling_series(sweep, b) for b in sweep.backends):
        jobs.append((f"{name}-scaling", lambda: plot_scaling(p, sweep, name)))
    for backend in sweep.backends:
        jobs.append((f"{name}-ranks-{backend}",
                     lambda backend=backend: plot_ranks(p, sweep, name, backend, "average")))
        recs = [r for r in records if r.backend == backend]
        if any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s")) for r in recs):
            jobs.append((f"{name}-ranks-{backend}-worst",
                         lambda backend=backend: plot_ranks(p, sweep, name, backend, "worst")))
    # Timelines: none, the first point with a trace of each backend, or every point's.
    drawn = set()
    for label in sweep.labels:
        for backend in sweep.backends:
            r = sweep.record(label, backend)
            if r is None or not r.trace or timelines == "none":
                continue
            if timelines == "first" and backend in drawn:
                continue
            drawn.add(backend)
            jobs.append((timeline_name(sweep, name, r),
                         lambda r=r: plot_timeline(p, sweep, name, r)))
    claims, source = load_claims(sweep, root, claims_file)
    rows = evaluate_claims(sweep, claims) if claims else []
    sources = [os.path.basename(str(source))] if rows else []
    seed = seed000_rows(sweep, manifest)
    if seed:
        rows += seed
        sources.append("seed 000 (classified by muonbed run)")
    if rows:
        jobs.append((f"{name}-claims",
                     lambda: plot_claims(p, sweep, name, rows, " + ".join(sources))))
    return jobs, skipped


def plot_experiment(p, records, root, claims_file, manifest=None, timelines="first",
                    skip_infeasible=False, progress=None, workers=1):
    """Draws every figure of one experiment; `progress` (a stream) gets one line per figure:
    its number, name and how long it took. With workers > 1 the figures are drawn by that many
    forked processes at once (each figure is independent; the files are the same). Returns how
    many infeasible points were skipped."""
    jobs, skipped = figure_jobs(p, records, root, claims_file, manifest, timelines,
                                skip_infeasible)
    if workers > 1 and len(jobs) > 1 and not p.keep_figures:
        draw_in_processes(p, jobs, workers, progress)
        return skipped
    for i, (name, draw) in enumerate(jobs, 1):
        start = time.monotonic()
        if progress:
            print(f"{progress_head(i, len(jobs))} {name} ...", end="", file=progress,
                  flush=True)
        before = len(p.written)
        draw()
        if progress:
            print(progress_tail(time.monotonic() - start, len(p.written) > before),
                  file=progress, flush=True)
    return skipped


def progress_head(done, total):
    return f"plot: [{done:>{len(str(total))}}/{total}]"


def progress_tail(seconds, wrote):
    return f" {seconds:.1f} s" + ("" if wrote else " (nothing to draw)")


_JOBS = None  # (plotter, jobs) for the forked workers: inherited, never pickled


def draw_one(i):
    """In a worker: draws figure i, returns (i, the files it wrote, seconds)."""
    p, jobs = _JOBS
    start = time.monotonic()
    before = len(p.written)
    jobs[i][1]()
    return i, p.written[before:], time.monotonic() - start


def draw_in_processes(p, jobs, workers, progress):
    """Draws the jobs in `workers` forked processes, printing each figure's line as it is
    done; the files written are listed in the jobs' order, whatever order they finished in."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    global _JOBS
    _JOBS = (p, jobs)
    written = [[] for _ in jobs]
    sys.stdout.flush()  # else the workers would inherit and print it again
    sys.stderr.flush()
    try:
        # A worker that dies breaks the pool with an error (BrokenProcessPool), never a hang.
        with ProcessPoolExecutor(min(workers, len(jobs)),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(draw_one, i) for i in range(len(jobs))]
            for done, future in enumerate(as_completed(futures), 1):
                i, files, seconds = future.result()  # a worker's exception is raised here
                written[i] = files
                if progress:
                    print(f"{progress_head(done, len(jobs))} {jobs[i][0]} ..."
                          f"{progress_tail(seconds, bool(files))}", file=progress, flush=True)
    finally:
        _JOBS = None
    for files in written:
        p.written.extend(files)


MAX_JOBS = 4  # each process holds the records and one trace (a 405B trace: ~250 MB)


def default_jobs():
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_JOBS, cores))


def error(message, code):
    print(f"plot: error: {message}", file=sys.stderr)
    return code


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="plot.py",
        description="Plot one muonbed experiment's results (the JSON files `muonbed run` wrote).",
        epilog="Example: /usr/bin/python3 analysis/plot.py results/quickstart --formats png")
    ap.add_argument("results_dir", help="folder with the results JSON files (searched "
                    "recursively: <dir>/<point>/<backend>.json and traces)")
    ap.add_argument("--out", help="folder for the plots (default: RESULTS_DIR)")
    ap.add_argument("--formats", default="png,pdf", help="comma-separated: png,pdf,svg "
                    "(default png,pdf)")
    ap.add_argument("--max-ranks", type=int, default=DEFAULT_MAX_RANKS,
                    help=f"ranks drawn in a timeline (default {DEFAULT_MAX_RANKS})")
    ap.add_argument("--claims", help="claims file (YAML or JSON) to check against the results")
    ap.add_argument("--timelines", choices=("none", "first", "all"), default="first",
                    help="step timelines (Gantt charts from the traces) to draw: none, the "
                    "first point's of each backend (default), or every point's")
    ap.add_argument("--jobs", type=int, default=default_jobs(),
                    help="figures drawn at once, each in its own process (default: the cores "
                    f"this process may use, at most {MAX_JOBS}: {default_jobs()} here)")
    ap.add_argument("--skip-infeasible", action="store_true",
                    help="leave out the points whose memory exceeds one GPU's (result field "
                    "memory.feasible false; drawn grey and marked without this flag); the "
                    "footers say how many")
    args = ap.parse_args(argv)

    formats = [f.strip().lower().lstrip(".") for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        return error(f"unsupported format(s) {bad or args.formats!r}; use png, pdf or svg", 2)
    if not os.path.isdir(args.results_dir):
        return error(f"'{args.results_dir}' is not a folder; pass the experiment's output "
                     f"folder (the `output:` of its YAML)", 2)
    if args.claims and not os.path.isfile(args.claims):
        return error(f"claims file '{args.claims}' not found (or not a file)", 2)
    if not 1 <= args.max_ranks <= 4096:
        return error("--max-ranks must be in 1..4096", 2)
    if not 1 <= args.jobs <= 64:
        return error("--jobs must be in 1..64", 2)
    out = args.out or args.results_dir
    if os.path.lexists(out) and not os.path.isdir(out):
        return error(f"--out '{out}' is a file, not a folder; fix: choose another folder", 2)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        return error(f"cannot create the output folder '{out}': {e.strerror or e}; fix: choose "
                     f"a folder you can write (--out DIR)", 2)
    if not os.access(out, os.W_OK | os.X_OK):
        return error(f"cannot write into '{out}' (permission denied); fix: choose a folder you "
                     f"can write (--out DIR)", 2)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"plot: matplotlib is not available to {sys.executable} ({e}); no plots written. "
              f"Fix: run with /usr/bin/python3 after `apt-get install python3-matplotlib`.")
        return 0
    setup_style(matplotlib)

    try:
        loaded = load_dir(args.results_dir)
    except FolderError as e:
        return error(str(e), 1)
    report(loaded, args.results_dir)
    records = loaded.records
    if not records:
        why = (f" ({len(loaded.excluded)} file(s) failed the checks above)"
               if loaded.excluded else "")
        return error(f"no verified results under '{args.results_dir}'{why}; run `muonbed run "
                     f"EXPERIMENT.yaml` first", 1)
    p = Plotter(plt, out, formats, args.max_ranks, excluded=len(loaded.excluded))
    by_exp = {}
    for r in records:
        by_exp.setdefault(r.experiment, []).append(r)
    start = time.monotonic()
    try:
        for exp in sorted(by_exp):
            skipped = plot_experiment(p, by_exp[exp], args.results_dir, args.claims,
                                      loaded.manifest, args.timelines, args.skip_infeasible,
                                      progress=sys.stdout, workers=args.jobs)
            if skipped:
                print(f"plot: {exp}: {skipped} point(s) exceeding GPU memory left out "
                      f"(--skip-infeasible)")
    except ClaimsError as e:
        return error(f"{e}; fix: pass a YAML or JSON claims file (analysis/README.md)", 2)
    except OSError as e:
        where = f" '{e.filename}'" if getattr(e, "filename", None) else ""
        return error(f"cannot write{where}: {e.strerror or e}; fix: choose a folder you can "
                     f"write (--out DIR) with free space", 1)
    print(f"plot: read {len(records)} result file(s) of {len(by_exp)} experiment(s); "
          f"wrote {len(p.written)} file(s) in {time.monotonic() - start:.1f} s:")
    for path in p.written:
        print(f"  {path}")
    if loaded.excluded:
        print(f"plot: {len(loaded.excluded)} result file(s) were NOT plotted (reasons above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
