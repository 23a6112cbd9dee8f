#!/usr/bin/python3
"""Tests of analysis/plot.py on synthetic results folders laid out as `muonbed run` writes them
(<output>/<point slug>/<backend>.json per core/results/results.hpp, schema 2 with point identity and
checksum, muonbed-run.json, plus a trace JSON of one step): what is drawn matches the records
(bar lengths, point order, claim ratios), files are deterministic, results that do not belong to
the run (edited, of another configuration, mistyped, NaN) are left out and said so, and the CLI's
error paths exit as documented. Run: /usr/bin/python3 -m unittest analysis/test_plot.py (from the
repo root), or /usr/bin/python3 analysis/test_plot.py. `--make DIR` writes the synthetic folders
to DIR instead (for looking at the plots by hand)."""

import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT = os.path.join(HERE, "plot.py")
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import plot  # noqa: E402
from muonbed_plots import claims as claims_mod  # noqa: E402
from muonbed_plots import common, loader, sweep as sweep_mod  # noqa: E402

try:
    import matplotlib
    import matplotlib.collections
    import matplotlib.colors
    HAVE_MPL = True
except Exception:
    HAVE_MPL = False


def slug(label):
    return re.sub(r"[^A-Za-z0-9._=-]", "_", label) if label else "default"


def record(experiment, label, backend, strategy, world, step_s, worst_s=None, gpn=8,
           compute_frac=0.6, exposed_frac=0.25, claims=None):
    """A results record of schema 2 with plausible, self-consistent numbers."""
    worst_s = step_s if worst_s is None else worst_s
    params = 6.7e9
    ranks = []
    for r in range(world):
        wobble = 1.0 + 0.15 * math.sin(r * 1.7)
        comp = step_s * compute_frac * wobble
        exposed = step_s * exposed_frac * (2 - wobble) / 1.0
        comm = exposed + comp * 0.3
        idle = max(0.0, step_s - comp - exposed)
        k = worst_s / step_s
        ranks.append({
            "rank": r, "node": r // gpn,
            "average": {"compute_s": comp, "communication_s": comm, "exposed_comm_s": exposed,
                        "idle_s": idle, "finish_s": step_s - idle * 0.5},
            "worst": {"compute_s": comp * k, "communication_s": comm * k,
                      "exposed_comm_s": exposed * k, "idle_s": idle * k,
                      "finish_s": (step_s - idle * 0.5) * k},
            "bytes_sent": 2.1e9 / world, "bytes_received": 2.1e9 / world,
            "memory": {"static_bytes": int(16 * params / world),
                       "peak_transient_bytes": int(2 * params / world * wobble),
                       "peak_bytes": int(16 * params / world + 2 * params / world * wobble)}})
    mean = lambda key, which="average": sum(x[which][key] for x in ranks) / world
    flops = 5 * 4 * params * 4096
    doc = {
        "schema_version": 2, "backend": backend,
        "fidelity": "step" if backend == "sim" else "closed_form",
        "timestamp": "2025-01-31T12:34:56Z",
        "provenance": {"muonbed_version": "0.1.0", "git_hash": "0123456789abcdef" * 2 + "01234567",
                       "simgrid_version": "3.35" if backend == "sim" else "",
                       "host_name": "test", "experiment": experiment,
                       "experiment_file": "experiments/" + experiment + ".yaml",
                       "point": label,
                       "resolved_config": "name: %s\nstrategy: {name: %s}\n" % (experiment,
                                                                                strategy),
                       "point_id": point_id(experiment, label, backend)},
        "setup": {"strategy": strategy, "cluster": "dgx-h100", "model": "llama-7b",
                  "mesh": f"dp_shard={world} ({world} ranks, {gpn} per node)",
                  "world_size": world, "nodes": max(1, world // gpn), "gpus_per_node": gpn,
                  "params": int(params), "muon_matrices": 224,
                  "hyper_period": 8 if worst_s != step_s else 1},
        "step": {"average_s": step_s, "worst_s": worst_s, "worst_step": 0,
                 "patterns": [{"step": 0, "count": 1, "time_s": worst_s}] +
                 ([{"step": 1, "count": 7, "time_s": (8 * step_s - worst_s) / 7}]
                  if worst_s != step_s else [])},
        "throughput": {
            "params_per_s_per_gpu": {"average": params / step_s / world,
                                     "worst": params / worst_s / world},
            "computation": {"time_s": {"average": mean("compute_s"),
                                       "worst": mean("compute_s", "worst")},
                            "tflops_per_gpu": {"average": flops / step_s / world / 1e12,
                                               "worst": flops / worst_s / world / 1e12},
                            "utilization": {"average": 0.4, "worst": 0.3}},
            "communication": {"time_s": {"average": mean("communication_s"),
                                         "worst": mean("communication_s", "worst")},
                              "exposed_time_s": {"average": mean("exposed_comm_s"),
                                                 "worst": mean("exposed_comm_s", "worst")},
                              "GBps_per_gpu": {"average": 2.1 / step_s / world,
                                               "worst": 2.1 / worst_s / world}}},
        "traffic": {"model": "algorithm" if backend == "sim" else "closed_form",
                    "intra_node_bytes": {"average": 1.8e9, "worst": 1.8e9},
                    "network_bytes": {"average": 0.3e9 if world > gpn else 0.0,
                                      "worst": 0.3e9 if world > gpn else 0.0}},
        "collectives": [{"op": 3, "label": "gather layers.0.attn.q", "kind": "gather",
                         "group_size": world, "instances": 1, "steps": 1, "bytes": 33554432.0,
                         "time_s": 1e-4, "max_time_s": 1.2e-4, "algbw_GBps": 335.5,
                         "busbw_GBps": 293.6, "crosses_nodes": world > gpn}],
        "ranks": ranks,
        "notes": ["synthetic record for analysis/test_plot.py"],
    }
    if claims is not None:
        doc["claims"] = claims
    return doc


def trace(world, streams=("compute", "comm"), ops=12, step_us=4000.0, gpn=8, traced=64):
    """A trace as sim/src/replay.cpp writes it: pid = node, tid = rank x streams + stream,
    thread names "rank R STREAM", cat compute / collective / wait, args.kind, otherData."""
    ns = len(streams)
    traced = min(world, traced)
    events = [{"name": "process_name", "ph": "M", "pid": n, "args": {"name": f"node {n}"}}
              for n in range((traced + gpn - 1) // gpn)]
    for r in range(traced):
        for s, sname in enumerate(streams):
            events.append({"name": "thread_name", "ph": "M", "pid": r // gpn, "tid": r * ns + s,
                           "args": {"name": f"rank {r} {sname}"}})
    for r in range(traced):
        t = 0.0
        for i in range(ops):
            d = step_us / ops * 0.6
            wait = 0.1 * d * (r % 3)
            events.append({"name": f"ns layers.{i}", "cat": "compute", "ph": "X", "ts": t,
                           "dur": d - wait, "pid": r // gpn, "tid": r * ns,
                           "args": {"op": 3 * i, "kind": "newton_schulz"}})
            events.append({"name": f"wait: gather layers.{i}", "cat": "wait", "ph": "X",
                           "ts": t + d * 0.5 - wait, "dur": wait, "pid": r // gpn,
                           "tid": r * ns + 1, "args": {"op": 3 * i + 1, "kind": "gather"}})
            events.append({"name": f"gather layers.{i}", "cat": "collective", "ph": "X",
                           "ts": t + d * 0.5, "dur": d * 0.8, "pid": r // gpn,
                           "tid": r * ns + 1, "args": {"op": 3 * i + 1, "kind": "gather"}})
            t += step_us / ops
    return {"displayTimeUnit": "ms",
            "otherData": {"step": 0, "traced_ranks": traced, "world_size": world},
            "traceEvents": events}


def legacy_trace(world, ops=6, step_us=1000.0):
    """A plain list of events with pid = rank and tid = stream (the Chrome format's simplest
    form): the reader must take it too."""
    events = []
    for r in range(world):
        t = 0.0
        for i in range(ops):
            events.append({"name": f"newton_schulz {i}", "ph": "X", "ts": t, "dur": 80.0,
                           "pid": r, "tid": 0})
            events.append({"name": f"all_to_all {i}", "ph": "X", "ts": t + 40, "dur": 90.0,
                           "pid": r, "tid": 1})
            t += step_us / ops
    return events


def point_id(experiment, label, backend, config=""):
    """A stand-in for core/results/src/result_json.cpp's point_identity (plot.py only compares
    them)."""
    text = f"{experiment}\n{label}\n{backend}\n{config}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write(path, doc):
    """A trace or any JSON, as is."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def result_bytes(doc):
    """A result file as muonbed writes it: the checksum last, the SHA-256 of the text with it
    empty."""
    doc = {k: v for k, v in doc.items() if k != "checksum"}
    doc["checksum"] = ""
    raw = (json.dumps(doc, indent=1) + "\n").encode("utf-8")
    at = raw.rindex(b'"checksum": ""') + len(b'"checksum": "')
    return raw[:at] + hashlib.sha256(raw).hexdigest().encode() + raw[at:]


def write_result(path, doc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(result_bytes(doc))


def write_manifest(root, order=None, seed_claims=None):
    """muonbed-run.json as `muonbed run` writes it: every result under root (in `order` of point
    labels when given) with its point identity, and the traces."""
    results, traces = [], []
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if name == "muonbed-run.json" or not name.endswith(".json"):
                continue
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            if isinstance(doc, dict) and "step" in doc:
                results.append({"path": rel, "backend": doc["backend"],
                                "point": doc["provenance"]["point"],
                                "point_id": doc["provenance"]["point_id"]})
            else:
                traces.append(rel)
    if order:
        results.sort(key=lambda e: order.index(e["point"]) if e["point"] in order else 99)
    doc = {"experiment": "x", "schema_version": 2, "results": results, "traces": traces}
    if seed_claims is not None:
        doc["seed_claims"] = seed_claims
    write(os.path.join(root, "muonbed-run.json"), doc)


CLAIMS = [{"name": "parallel ~N x faster than sequential", "source": "seed 000",
           "baseline": "strategy.name=sequential", "target": "strategy.name=owner",
           "speedup": 8},
          {"name": "total 16-24 x on 8 GPUs", "source": "seed 000",
           "baseline": {"strategy.name": "sequential"}, "target": "strategy.name=all_to_all",
           "speedup": [16, 24]}]


STRATEGY_ORDER = ["sequential", "replicated", "owner", "all_to_all", "owner_allgather"]


def make_strategies(root, claims=True, only=None, manifest=True):
    """quickstart-like: five strategies x two backends on 8 GPUs, a trace per sim point; the
    replicated point has a level-sync pattern so average and worst differ. The manifest lists
    the points in the experiment's order (not alphabetical)."""
    # 9.2x between the slowest and the fastest step, as the quickstart's 8x: one linear axis
    # (strategies.py draws a log facet from 10x).
    times = {"sequential": 0.080, "replicated": 0.030, "owner": 0.0105, "all_to_all": 0.0092,
             "owner_allgather": 0.0098}
    for strategy, t in times.items():
        if only and strategy not in only:
            continue
        label = f"strategy.name={strategy}"
        # sim 6 % above analytic: within the 10 % that marks a disagreement (marks.py)
        for backend, f in (("analytic", 1.0), ("sim", 1.06)):
            worst = t * f * 1.9 if strategy == "replicated" else None
            write_result(os.path.join(root, slug(label), backend + ".json"),
                         record("quickstart", label, backend, strategy, 8, t * f, worst,
                                claims=CLAIMS if claims else None))
        write(os.path.join(root, slug(label), "sim.trace.json"), trace(8))
    if manifest:
        write_manifest(root, order=[f"strategy.name={x}" for x in STRATEGY_ORDER])


def make_scaling(root):
    """world size varies (8..128 GPUs) for two strategies; analytic only; big meshes."""
    for strategy in ("owner", "all_to_all"):
        for world in (8, 16, 32, 64, 128):
            label = f"strategy.name={strategy},mesh.dims=[{{name: dp_shard, size: {world}}}]"
            t = 0.01 * (8 / world) ** 0.7 * (1.0 if strategy == "owner" else 0.7)
            write_result(os.path.join(root, slug(label), "analytic.json"),
                         record("scaling", label, "analytic", strategy, world, t, t * 1.3))
            if world == 128 and strategy == "owner":
                write(os.path.join(root, slug(label), "analytic.trace.json"),
                      trace(world, ops=6))
            if world == 32 and strategy == "all_to_all":
                write(os.path.join(root, slug(label), "trace.json"), legacy_trace(world))
    write_manifest(root)


def make_seed_claims(root):
    """experiments/seed_claims.yaml's layout: the sweep key `strategy` takes maps; `muonbed run`
    classifies the variants (core/results/results.hpp seed_claims) and lists the rows in the manifest."""
    ids = {}
    for name, prefetch, t in (("sequential", 0, 0.95), ("owner", 0, 0.136), ("owner", 2, 0.117)):
        label = f"strategy={{name: {name}, prefetch_count: {prefetch}}}"
        doc = record("seed_claims", label, "analytic", name, 8, t)
        doc["provenance"]["resolved_config"] = (
            f"name: seed_claims\nstrategy:\n  name: {name}\n  prefetch_count: {prefetch}\n")
        ids[(name, prefetch)] = doc["provenance"]["point_id"]
        write_result(os.path.join(root, slug(label), "analytic.json"), doc)
    seq, par, pre = ids[("sequential", 0)], ids[("owner", 0)], ids[("owner", 2)]
    rows = [{"claim": "parallel owner vs sequential", "claimed": "~N x (N = 8)", "low": 8 / 1.2,
             "high": 8 * 1.2, "backend": "analytic", "baseline_point_id": seq,
             "target_point_id": par},
            {"claim": "prefetch 2 vs parallel (on top)", "claimed": "2-3x", "low": 2, "high": 3,
             "backend": "analytic", "baseline_point_id": par, "target_point_id": pre},
            {"claim": "prefetch 2 vs sequential (total)", "claimed": "16-24x", "low": 16,
             "high": 24, "backend": "analytic", "baseline_point_id": seq,
             "target_point_id": pre}]
    write_manifest(root, seed_claims=rows)


def make_points(root, experiment, points, manifest=True):
    """A sweep of our own: points = [(label, backend, strategy, world, step_s, edit)], where
    edit(doc) (or None) changes the record before it is written, e.g. to add issue 22's
    optional blocks (memory, cross_check, useful FLOP rate)."""
    for label, backend, strategy, world, step_s, edit in points:
        doc = record(experiment, label, backend, strategy, world, step_s)
        if edit:
            edit(doc)
        write_result(os.path.join(root, slug(label), backend + ".json"), doc)
    if manifest:
        write_manifest(root, order=[pt[0] for pt in points])


def make_marks(root):
    """issue 22's marks on one sweep, to look at: world sizes 8..64 for two strategies on
    analytic and sim; the 8-GPU points exceed 80 GB, analytic and sim disagree by 20 % on
    all_to_all at 32 GPUs, sim ran at flow fidelity but for one point, useful FLOP rates."""
    points = []
    for strategy, base in (("owner", 0.08), ("all_to_all", 0.06)):
        for world in (8, 16, 32, 64):
            label = f"strategy.name={strategy},mesh.dp_shard={world}"
            analytic = base * 8 / world
            sim = analytic * (1.2 if (strategy, world) == ("all_to_all", 32) else 1.03)
            for backend, own, other in (("analytic", analytic, sim), ("sim", sim, analytic)):
                def edit(doc, own=own, other=other, backend=backend, world=world,
                         strategy=strategy):
                    doc["memory"] = memory_block(640e9 / world + 20e9, 80e9, world)
                    doc["cross_check"] = cross_check("sim" if backend == "analytic"
                                                     else "analytic", own, other)
                    if backend == "sim":
                        doc["fidelity"] = "step" if (strategy, world) == ("owner", 16) \
                            else "flow"
                    doc["throughput"]["computation"]["useful_tflops_per_gpu"] = {
                        "average": 60 / own / world, "worst": 60 / own / world}
                points.append((label, backend, strategy, world, own, edit))
    make_points(root, "marks", points)


def memory_block(peak, limit, world, over=None):
    """The memory block core writes (issue 22), fullest rank `peak` bytes of `limit`."""
    over = (world if peak > limit else 0) if over is None else over
    parts = {"parameters": peak * 0.1, "master_weights": peak * 0.2, "gradients": peak * 0.1,
             "optimizer_state": peak * 0.2, "transients": peak * 0.1, "activations": peak * 0.3}
    return {"model": "training_state", "limit_bytes": int(limit), "peak_bytes": int(peak),
            "peak_rank": 0, "over_ranks": over, "feasible": over == 0,
            "breakdown": {k: int(v) for k, v in parts.items()}}


def cross_check(other, own_s, other_s, fidelity="flow"):
    pct = (own_s / other_s - 1) * 100
    return [{"backend": other, "fidelity": fidelity, "step_s": other_s,
             "difference_pct": pct, "agree": abs(pct) <= 10}]


def lanes_trace(ranks, lanes, ops=6, step_us=1000.0):
    """A trace of a 128-lane plan: per rank a compute stream and `lanes` communication lanes
    ("comm.1".."comm.N" after "comm", as core/engine/src/timeline.cpp names plan streams), every
    gather on its own lane, three lanes busy at once."""
    ns = 1 + lanes
    names = ["compute", "comm"] + [f"comm.{i}" for i in range(1, lanes)]
    events = []
    for r in range(ranks):
        for s_, n in enumerate(names):
            events.append({"name": "thread_name", "ph": "M", "pid": r // 8, "tid": r * ns + s_,
                           "args": {"name": f"rank {r} {n}"}})
        for i in range(ops):
            t = i * step_us / ops
            events.append({"name": f"ns {i}", "cat": "compute", "ph": "X", "ts": t,
                           "dur": step_us / ops * 0.5, "pid": r // 8, "tid": r * ns,
                           "args": {"kind": "newton_schulz"}})
            for j in range(3):  # lanes i*3+j, overlapping: the union is [t, t + 100 + 20 j]
                lane = 1 + (i * 3 + j) % lanes
                events.append({"name": f"gather {i}.{j}", "cat": "collective", "ph": "X",
                               "ts": t + 10 * j, "dur": 100.0, "pid": r // 8,
                               "tid": r * ns + lane, "args": {"kind": "gather"}})
    return {"otherData": {"step": 0, "traced_ranks": ranks, "world_size": ranks},
            "traceEvents": events}


def texts_of(fig):
    """Every text a figure shows: titles, labels, tick labels, legends, annotations, footer."""
    from matplotlib.text import Text
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


class PlotTest(unittest.TestCase):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True,
                              timeout=600)

    def assert_files(self, out, names, formats=("png", "pdf")):
        for n in names:
            for ext in formats:
                path = os.path.join(out, f"{n}.{ext}")
                self.assertTrue(os.path.isfile(path), f"missing {path}")
                self.assertGreater(os.path.getsize(path), 1000, f"tiny {path}")

    def drawn(self, root, claims_file=None, **options):
        """Runs the plots in this process and keeps the figures: what was drawn, not just that
        files exist. `options` go to plot_experiment (timelines, skip_infeasible)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        loaded = loader.load_dir(root)
        out = tempfile.mkdtemp(dir=root)
        p = common_plotter(plt, out, len(loaded.excluded))
        self.addCleanup(plt.close, "all")
        plot.plot_experiment(p, loaded.records, root, claims_file, loaded.manifest, **options)
        return p, loaded

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_strategy_sweep(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d)
            res = self.run_cli(d)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assert_files(d, ["quickstart-strategies", "quickstart-throughput",
                                  "quickstart-traffic", "quickstart-ranks-analytic",
                                  "quickstart-ranks-sim", "quickstart-ranks-sim-worst",
                                  "quickstart-timeline-sim-sequential", "quickstart-claims"])
            self.assertFalse(os.path.exists(os.path.join(d, "quickstart-scaling.png")),
                             "no scaling plot when the world size does not vary")
            self.assertIn("quickstart-strategies.png", res.stdout)
            # Every file it lists exists; the claims table is printed; nothing was left out.
            listed = [l.strip() for l in res.stdout.splitlines() if l.startswith("  ")
                      and l.strip().endswith((".png", ".pdf"))]
            self.assertEqual(len(listed), len([f for f in os.listdir(d)
                                               if f.endswith((".png", ".pdf"))]))
            self.assertIn("holds", res.stdout)
            self.assertNotIn("warning", res.stderr)
            # By default only the first point's timeline (--timelines first).
            self.assertEqual(sorted(f for f in os.listdir(d) if "-timeline-" in f),
                             ["quickstart-timeline-sim-sequential.pdf",
                              "quickstart-timeline-sim-sequential.png"])

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_bars_are_the_records_numbers_in_sweep_order(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False)
            p, loaded = self.drawn(d)
            fig = p.figures["quickstart-strategies"]
            analytic = fig.axes[0]
            # 8x between the slowest and fastest point: one linear axis, parts stacked.
            self.assertEqual(analytic.get_xscale(), "linear")
            # Points in the experiment's order (the manifest's), not alphabetical.
            labels = [t.get_text() for t in analytic.get_yticklabels()]
            self.assertEqual(labels, STRATEGY_ORDER)
            # The stacked parts of each average bar add up to the record's average step.
            by_label = {r.label: r for r in loaded.records if r.backend == "analytic"}
            scale, _ = common.time_unit(max(max(r.doc["step"]["average_s"],
                                                r.doc["step"]["worst_s"])
                                            for r in loaded.records))
            for i, name in enumerate(STRATEGY_ORDER):
                r = by_label[f"strategy.name={name}"]
                worst_differs = r.doc["step"]["worst_s"] != r.doc["step"]["average_s"]
                y = i - 0.2 if worst_differs else i
                bars = [b for b in analytic.patches
                        if abs(b.get_y() + b.get_height() / 2 - y) < 1e-9]
                total = sum(b.get_width() for b in bars)
                self.assertAlmostEqual(total, r.doc["step"]["average_s"] * scale, delta=1e-9,
                                       msg=name)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_manifest_limits_plots_to_the_current_sweep(self):
        # An edited experiment no longer has the sequential point; its old files stay in the
        # folder, and muonbed run's manifest lists only the current points.
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False, only={"sequential", "owner"}, manifest=False)
            owner = os.path.join(d, slug("strategy.name=owner"))
            os.rename(os.path.join(d, slug("strategy.name=sequential")), d + ".seq")
            write_manifest(d)
            os.rename(d + ".seq", os.path.join(d, slug("strategy.name=sequential")))
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("read 2 result file(s)", res.stdout)
            self.assertIn("3 JSON file(s)", res.stdout)  # sequential's two results and trace
            timelines = [f for f in os.listdir(d) if f.startswith("quickstart-timeline-")]
            self.assertEqual(timelines, ["quickstart-timeline-sim-owner.png"])
            self.assertTrue(os.path.isdir(owner))

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_a_killed_rerun_of_an_edited_experiment_is_not_mixed_in(self):
        # The manifest names each point's identity; a result replaced afterwards by a run of
        # another configuration (killed before it rewrote the manifest) is flagged, not plotted.
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False, only={"sequential", "owner"})
            path = os.path.join(d, slug("strategy.name=owner"), "analytic.json")
            doc = record("quickstart", "strategy.name=owner", "analytic", "owner", 8, 0.5)
            doc["provenance"]["point_id"] = point_id("quickstart", "strategy.name=owner",
                                                     "analytic", "ns_steps: 4")
            write_result(path, doc)
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("result of another configuration", res.stderr)
            self.assertIn("read 3 result file(s)", res.stdout)
            self.assertIn("1 result file(s) were NOT plotted", res.stdout)
            p, loaded = self.drawn(d)
            self.assertNotIn(path, [r.path for r in loaded.records])
            footer = p.figures["quickstart-strategies"]._supxlabel.get_text()
            self.assertIn("NOT SHOWN: 1 result file(s)", footer)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_edited_mistyped_and_nonfinite_results_are_refused(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False, only={"sequential", "owner"})
            folder = os.path.join(d, slug("strategy.name=owner"))
            # A hand edit of one number (a 356,259,983x speedup): the checksum catches it.
            path = os.path.join(folder, "analytic.json")
            with open(path, "rb") as f:
                raw = f.read()
            edited = re.sub(rb'"average_s": [0-9.e-]+', b'"average_s": 2.24e-10', raw, count=1)
            self.assertNotEqual(raw, edited)
            with open(path, "wb") as f:
                f.write(edited)
            # Valid checksums over bad content (written by a broken tool): each field checked.
            sim = os.path.join(folder, "sim.json")
            for bad, why in ((lambda x: x["step"].update(average_s="fast"), "not a finite"),
                             (lambda x: x["step"].update(average_s=float("nan")), "not a finite"),
                             (lambda x: x.update(ranks=5), "ranks is not a list"),
                             (lambda x: x["setup"].update(world_size="8"), "not a whole"),
                             # issue 22's optional blocks: absent is fine, malformed is not
                             (lambda x: x.update(memory=dict(memory_block(9e9, 8e9, 8),
                                                             feasible="no")),
                              "memory.feasible is 'no'"),
                             (lambda x: x.update(cross_check=[dict(cross_check(
                                 "analytic", 1, 2)[0], difference_pct=float("nan"))]),
                              "cross_check[0].difference_pct is nan")):
                doc = record("quickstart", "strategy.name=owner", "sim", "owner", 8, 0.01)
                bad(doc)
                write_result(sim, doc)
                res = self.run_cli(d, "--formats", "png")
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertIn("checksum does not match", res.stderr)
                self.assertIn(why, res.stderr)
                self.assertNotIn("Traceback", res.stderr)
                self.assertIn("read 2 result file(s)", res.stdout)  # sequential's only
            # Nothing verified at all: an error, not an empty plot.
            for name in os.listdir(d):
                sub = os.path.join(d, name)
                for f in (os.listdir(sub) if os.path.isdir(sub) else []):
                    if f.endswith(".json") and "trace" not in f:
                        with open(os.path.join(sub, f), "ab") as fh:
                            fh.write(b" ")
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 1)
            self.assertIn("no verified results", res.stderr)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_untrusted_manifests_are_refused(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False, only={"owner"})
            manifest = os.path.join(d, "muonbed-run.json")
            for content, words in (
                    (b"{not json", "not valid JSON"),
                    (b'{"results": ["strategy.name=owner/sim.json"]}', "older muonbed"),
                    (b'{"schema_version": 2, "results": [{"path": "../../etc/passwd", '
                     b'"point_id": "x"}]}', "inside the folder"),
                    (b"\xff\xfe binary", "not UTF-8")):
                with open(manifest, "wb") as f:
                    f.write(content)
                res = self.run_cli(d, "--formats", "png")
                self.assertEqual(res.returncode, 1, res.stderr)
                self.assertIn(words, res.stderr)
                self.assertIn("rerun `muonbed run", res.stderr)
                self.assertNotIn("Traceback", res.stderr)
            # Without any manifest: every verified result, with a warning that they may mix.
            os.remove(manifest)
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("may be mixed", res.stderr)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_scaling_and_big_mesh(self):
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "res"), os.path.join(d, "plots")
            make_scaling(src)
            res = self.run_cli(src, "--out", out, "--formats", "png", "--timelines", "all")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assert_files(out, ["scaling-strategies", "scaling-scaling",
                                    "scaling-ranks-analytic", "scaling-ranks-analytic-worst"],
                              formats=("png",))
            timelines = sorted(f for f in os.listdir(out) if f.startswith("scaling-timeline-"))
            self.assertEqual(len(timelines), 2, timelines)
            self.assertFalse(any(f.endswith(".pdf") for f in os.listdir(out)))
            self.assertFalse(any(f.endswith(".png") for f in os.listdir(src)),
                             "--out keeps the results folder clean")
            # One line per strategy, its x values the world sizes, in order.
            p, _ = self.drawn(src)
            lines = p.figures["scaling-scaling"].axes[0].get_lines()
            self.assertEqual(len([l for l in lines if l.get_alpha() is None]), 2)
            for line in lines:
                self.assertEqual(list(line.get_xdata()), [8, 16, 32, 64, 128])

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_deterministic(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(os.path.join(d, "res"), only=("replicated", "owner"))
            outs = []
            # Drawn in one process, then by two at once: the same bytes.
            for i, jobs in enumerate(("1", "2")):
                out = os.path.join(d, f"out{i}")
                res = self.run_cli(os.path.join(d, "res"), "--out", out, "--jobs", jobs,
                                   "--timelines", "all")
                self.assertEqual(res.returncode, 0, res.stderr)
                files = {}
                for f in sorted(os.listdir(out)):
                    with open(os.path.join(out, f), "rb") as fh:
                        files[f] = fh.read()
                outs.append(files)
            self.assertEqual(sorted(outs[0]), sorted(outs[1]))
            for f in outs[0]:
                self.assertEqual(outs[0][f], outs[1][f], f"{f} differs between two runs")
            # The files are listed in the same order either way.
            listed = [[l for l in r.splitlines() if l.startswith("  ")] for r in (
                self.run_cli(os.path.join(d, "res"), "--out", os.path.join(d, f"out{i}"),
                             "--jobs", jobs).stdout for i, jobs in enumerate(("1", "2")))]
            self.assertEqual([os.path.basename(l) for l in listed[0]],
                             [os.path.basename(l) for l in listed[1]])

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_seed000_claims_from_the_manifest(self):
        with tempfile.TemporaryDirectory() as d:
            make_seed_claims(d)
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assert_files(d, ["seed_claims-strategies", "seed_claims-claims"],
                              formats=("png",))
            self.assertIn("seed 000", res.stdout)
            # 0.95 / 0.136 = 6.99 (within 8 x +-20 %), 0.136 / 0.117 = 1.16 (2-3 x claimed)
            self.assertRegex(res.stdout, r"6\.99×\s+holds")
            self.assertRegex(res.stdout, r"1\.16×\s+predicted below claim")
            # The ratios come from the verified records: drop one, and its rows say so.
            os.remove(os.path.join(d, slug("strategy={name: owner, prefetch_count: 2}"),
                                   "analytic.json"))
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertEqual(res.stdout.count("point missing"), 2)
            self.assertRegex(res.stdout, r"6\.99×\s+holds")

    # ---- issue 23: progress, timelines, readable at scale ----------------------------------------

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_progress_line_per_figure(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False, only={"sequential", "owner"})
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            lines = re.findall(r"^plot: \[\s*(\d+)/(\d+)\] (\S+) \.\.\. \d+\.\d s$",
                               res.stdout, re.MULTILINE)
            written = sorted(f[:-4] for f in os.listdir(d) if f.endswith(".png"))
            # One line per figure, numbered 1..N of N, naming the figure it drew.
            self.assertEqual(sorted(name for _, _, name in lines), written)
            self.assertEqual([int(i) for i, _, _ in lines], list(range(1, len(written) + 1)))
            self.assertEqual({int(n) for _, n, _ in lines}, {len(written)})
            self.assertRegex(res.stdout, r"wrote \d+ file\(s\) in \d+\.\d s")

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_timelines_none_first_all(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "res")
            make_strategies(src, claims=False, only={"sequential", "owner", "all_to_all"})

            def timelines(*args):
                out = tempfile.mkdtemp(dir=d)
                res = self.run_cli(src, "--out", out, "--formats", "png", *args)
                self.assertEqual(res.returncode, 0, res.stderr)
                return sorted(f for f in os.listdir(out) if "-timeline-" in f)
            self.assertEqual(timelines("--timelines", "none"), [])
            first = ["quickstart-timeline-sim-sequential.png"]  # the sweep's first point
            self.assertEqual(timelines(), first)
            self.assertEqual(timelines("--timelines", "first"), first)
            self.assertEqual(timelines("--timelines", "all"),
                             sorted(f"quickstart-timeline-sim-{x}.png"
                                    for x in ("sequential", "owner", "all_to_all")))
            res = self.run_cli(src, "--timelines", "some")
            self.assertEqual(res.returncode, 2)
            self.assertIn("invalid choice", res.stderr)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_timeline_folds_communication_lanes(self):
        # A 128-lane plan: ~130 streams per rank fold into one row per stream class, each
        # showing the union of its lanes' spans and how many lanes were busy at most.
        with tempfile.TemporaryDirectory() as d:
            label = "strategy.name=owner"
            make_points(d, "lanes", [(label, "sim", "owner", 4, 0.001, None)], manifest=False)
            write(os.path.join(d, slug(label), "sim.trace.json"), lanes_trace(4, 128))
            write_manifest(d)
            p, _ = self.drawn(d)
            ax = p.figures["lanes-timeline-sim-owner"].axes[0]
            labels = [t.get_text() for t in ax.get_yticklabels()]
            self.assertEqual(len(labels), 8, labels)  # 4 ranks x (compute, comm)
            self.assertEqual(labels[0], "rank 0 · compute")
            self.assertEqual(labels[1], "rank 0 · comm ×128 (≤3 busy)")
            gather = [c for c in ax.collections
                      if isinstance(c, matplotlib.collections.PolyCollection) and
                      tuple(c.get_facecolor()[0]) ==
                      matplotlib.colors.to_rgba(common.KIND_COLORS["gather"])]
            self.assertEqual(len(gather), 1)  # one artist for all gathers
            row1 = sorted((v[:, 0].min(), v[:, 0].max()) for v in
                          (path.vertices for path in gather[0].get_paths())
                          if abs((v[:, 1].min() + v[:, 1].max()) / 2 - 1) < 1e-9)
            # Three overlapping 100 us gathers 10 us apart per op: the union is 120 us long.
            self.assertEqual(len(row1), 6)
            for i, (lo, hi) in enumerate(row1):
                self.assertAlmostEqual(lo, i * 1000.0 / 6, places=6)
                self.assertAlmostEqual(hi - lo, 120.0, places=6)
            self.assertIn("lanes per stream class folded", p.figures[
                "lanes-timeline-sim-owner"]._suptitle.get_text())

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_one_slow_strategy_gets_a_log_facet(self):
        # One strategy 100x slower than the rest: a linear axis would leave the others a sliver,
        # so the step time goes on a log axis and the split into parts into a % facet.
        times = [("owner", 0.010), ("all_to_all", 0.012), ("sequential", 1.0)]
        with tempfile.TemporaryDirectory() as d:
            make_points(d, "slow", [(f"strategy.name={s}", "analytic", s, 8, t, None)
                                    for s, t in times])
            p, loaded = self.drawn(d)
            fig = p.figures["slow-strategies"]
            step_ax, split_ax = fig.axes[0], fig.axes[1]
            self.assertEqual(step_ax.get_xscale(), "log")
            self.assertEqual(split_ax.get_xscale(), "linear")
            lo, hi = (math.log(x) for x in step_ax.get_xlim())
            for i, (name, t) in enumerate(times):
                at = lambda ax: [b for b in ax.patches
                                 if abs(b.get_y() + b.get_height() / 2 - i) < 1e-9]
                (bar,) = at(step_ax)
                self.assertAlmostEqual(bar.get_x() + bar.get_width(), t, delta=1e-12)
                # Even the fastest bar spans a tenth of the axis (linear: under 1 %).
                share = (math.log(bar.get_x() + bar.get_width()) - math.log(bar.get_x())) / \
                    (hi - lo)
                self.assertGreater(share, 0.1, name)
                # Its parts, in % of its own step, add up to 100 %.
                self.assertAlmostEqual(sum(b.get_width() for b in at(split_ax)), 100.0,
                                       delta=1e-9)
            self.assertIn("the slowest point is 100x the fastest", fig._suptitle.get_text())

    # ---- issue 22: marks for numbers not to trust ----------------------------------------------

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_disagreeing_backends_are_marked(self):
        def checked(own, other, backend):
            return lambda doc: doc.update(cross_check=cross_check(backend, own, other))
        with tempfile.TemporaryDirectory() as d:
            # owner: analytic 20 % below sim (disagree); all_to_all: 3.8 % (agree).
            make_points(d, "m", [
                ("strategy.name=owner", "analytic", "owner", 8, 0.010,
                 checked(0.010, 0.0125, "sim")),
                ("strategy.name=owner", "sim", "owner", 8, 0.0125,
                 checked(0.0125, 0.010, "analytic")),
                ("strategy.name=all_to_all", "analytic", "all_to_all", 8, 0.010,
                 checked(0.010, 0.0104, "sim")),
                ("strategy.name=all_to_all", "sim", "all_to_all", 8, 0.0104,
                 checked(0.0104, 0.010, "analytic"))])
            p, _ = self.drawn(d)
            for fig in ("m-strategies", "m-throughput", "m-traffic"):
                labels = [t.get_text() for t in p.figures[fig].axes[0].get_yticklabels()]
                self.assertEqual(labels, ["owner ≠", "all_to_all"], fig)
                footer = p.figures[fig]._supxlabel.get_text()
                self.assertIn("≠ 1 point(s) where two backends disagree by > 10 %", footer)
            texts = texts_of(p.figures["m-strategies"])
            self.assertTrue(any("analytic vs sim/flow -20.0 %" in t for t in texts), texts)
        with tempfile.TemporaryDirectory() as d:
            # Files written before cross_check: the plots compare analytic with sim themselves.
            make_points(d, "old", [
                ("strategy.name=owner", "analytic", "owner", 8, 0.010, None),
                ("strategy.name=owner", "sim", "owner", 8, 0.0125, None),
                ("strategy.name=all_to_all", "analytic", "all_to_all", 8, 0.010, None),
                ("strategy.name=all_to_all", "sim", "all_to_all", 8, 0.0104, None)])
            p, _ = self.drawn(d)
            labels = [t.get_text() for t in p.figures["old-strategies"].axes[0].get_yticklabels()]
            self.assertEqual(labels, ["owner ≠", "all_to_all"])

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_training_step_in_percent_of_adamw(self):
        """Issue 24's figure: each point's training step in % of its AdamW step, split into
        compute, exposed communication and the exposed optimizer, which add up to the step; a
        point without a training section is not a bar there."""
        def training(step, adamw, forward, backward, exposed):
            def edit(doc):
                doc["training"] = {
                    "tokens_per_step": 4194304, "seq_len": 4096, "micro_batches": 8,
                    "micro_batch_groups": 8, "overlap": "none", "step_s": step,
                    "forward_s": forward, "backward_s": backward, "parameter_gather_s": 0.1,
                    "activation_comm_s": 0.1, "gradient_sync_s": 0.1, "optimizer_s": 0.2,
                    "exposed_optimizer_s": exposed, "model_tflops": 1000.0, "mfu": 0.4,
                    "adamw_step_s": adamw, "muon_overhead": step / adamw - 1}
            return edit
        points = [("mesh.dp_shard=8", "analytic", "owner", 8, 10.0,
                   training(10.0, 9.0, 3.0, 6.0, 0.5)),
                  ("mesh.dp_shard=16", "analytic", "owner", 16, 5.0,
                   training(5.0, 4.0, 1.0, 2.0, 1.0)),
                  ("mesh.dp_shard=32", "analytic", "owner", 32, 2.0, None)]
        with tempfile.TemporaryDirectory() as d:
            make_points(d, "tr", points)
            p, _ = self.drawn(d)
            self.assertIn("tr-training", p.figures)
            ax = p.figures["tr-training"].axes[0]
            labels = [t.get_text() for t in ax.get_yticklabels()]
            self.assertEqual(len(labels), 2)  # the point without training is left out
            for i, (step, adamw, parts) in enumerate(((10.0, 9.0, (9.0, 0.5, 0.5)),
                                                      (5.0, 4.0, (3.0, 1.0, 1.0)))):
                bars = sorted((b for b in ax.patches
                               if abs(b.get_y() + b.get_height() / 2 - i) < 0.3),
                              key=lambda b: b.get_x())
                widths = [b.get_width() for b in bars]
                # compute = forward + backward (capped by the step before the exposed tail),
                # communication = the rest of it, then the exposed optimizer; in % of AdamW.
                expected = [100 * v / adamw for v in (min(parts[0], step - parts[2]),
                                                      step - parts[2] - min(parts[0],
                                                                            step - parts[2]),
                                                      parts[2])]
                for got, want in zip(widths, expected):
                    self.assertAlmostEqual(got, want, places=6)
                self.assertAlmostEqual(sum(widths), 100 * step / adamw, places=6)
            texts = [t.get_text() for t in ax.texts]
            self.assertTrue(any("Muon +11.1 %" in t for t in texts), texts)
            self.assertTrue(any("Muon +25.0 %" in t for t in texts), texts)

    def test_infeasible_points_are_marked_or_skipped(self):
        from muonbed_plots import marks
        limit = 80e9

        def memory(peak):
            return lambda doc: doc.update(memory=memory_block(peak, limit, doc["setup"][
                "world_size"]))
        points = [(f"mesh.dp_shard={w}", "analytic", "owner", w, 0.08 / w, memory(peak))
                  for w, peak in ((8, 120e9), (16, 70e9), (32, 45e9))]
        grey = matplotlib.colors.to_rgba(marks.INFEASIBLE_COLOR)
        with tempfile.TemporaryDirectory() as d:
            make_points(d, "mem", points)
            p, _ = self.drawn(d)
            strat = p.figures["mem-strategies"].axes[0]
            self.assertEqual([t.get_text() for t in strat.get_yticklabels()],
                             ["dp_shard=8 (8 GPUs) ⊘", "dp_shard=16 (16 GPUs)",
                              "dp_shard=32 (32 GPUs)"])
            for fig in ("mem-strategies", "mem-throughput"):
                ax = p.figures[fig].axes[0]
                for i in range(3):
                    bars = [b for b in ax.patches if abs(b.get_y() + b.get_height() / 2 - i)
                            < 0.41]
                    self.assertTrue(bars)
                    is_grey = [tuple(b.get_facecolor()) == grey for b in bars]
                    self.assertEqual(set(is_grey), {i == 0}, f"{fig} point {i}")
            # The memory panel: the limit as one line at 80 GB, the peaks as stacked parts.
            ax_m = p.figures["mem-traffic"].axes[1]
            limits = [l for l in ax_m.get_lines() if list(l.get_xdata()) == [80.0, 80.0]]
            self.assertEqual(len(limits), 1)
            for i, peak in enumerate((120, 70, 45)):
                parts = [b.get_width() for b in ax_m.patches  # the red outline is no part
                         if abs(b.get_y() + b.get_height() / 2 - i) < 1e-9 and
                         b.get_facecolor()[3] > 0]
                self.assertAlmostEqual(sum(parts), peak, delta=1e-6)
            # The scaling plot breaks the line at the infeasible point and draws a cross there.
            sc = p.figures["mem-scaling"].axes[0]
            line = next(l for l in sc.get_lines() if len(l.get_xdata()) == 3)
            self.assertTrue(math.isnan(line.get_ydata()[0]))
            (cross,) = [l for l in sc.get_lines() if l.get_marker() == "X"]
            self.assertEqual(list(cross.get_xdata()), [8])
            footer = p.figures["mem-strategies"]._supxlabel.get_text()
            self.assertIn("⊘ 1 point(s) exceed GPU memory", footer)
            # --skip-infeasible: left out everywhere, and counted.
            p, _ = self.drawn(d, skip_infeasible=True)
            strat = p.figures["mem-strategies"].axes[0]
            self.assertEqual([t.get_text() for t in strat.get_yticklabels()],
                             ["dp_shard=16 (16 GPUs)", "dp_shard=32 (32 GPUs)"])
            for name, fig in p.figures.items():
                self.assertIn("1 point(s) exceeding GPU memory left out (--skip-infeasible)",
                              fig._supxlabel.get_text(), name)
            res = self.run_cli(d, "--formats", "png", "--skip-infeasible")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("1 point(s) exceeding GPU memory left out", res.stdout)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_throughput_counts_useful_flops(self):
        def useful(v):
            return lambda doc: doc["throughput"]["computation"].update(
                useful_tflops_per_gpu={"average": v, "worst": v})
        with tempfile.TemporaryDirectory() as d:
            make_points(d, "u", [("strategy.name=replicated", "analytic", "replicated", 8, 0.03,
                                  useful(1.5)),
                                 ("strategy.name=owner", "analytic", "owner", 8, 0.01,
                                  useful(4.5))])
            p, loaded = self.drawn(d)
            ax = p.figures["u-throughput"].axes[1]
            self.assertEqual(sorted(round(b.get_width(), 9) for b in ax.patches), [1.5, 4.5])
            self.assertIn("useful", ax.get_title())
            self.assertIn("each matrix once", ax.get_title())
        with tempfile.TemporaryDirectory() as d:  # older records: the executed rate, said so
            make_points(d, "e", [("strategy.name=owner", "analytic", "owner", 8, 0.01, None)])
            p, loaded = self.drawn(d)
            ax = p.figures["e-throughput"].axes[1]
            executed = loaded.records[0].doc["throughput"]["computation"]["tflops_per_gpu"]
            self.assertAlmostEqual(ax.patches[0].get_width(), executed["average"])
            self.assertIn("as executed", ax.get_title())

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_cpu_ranks_are_called_ranks(self):
        def cpu(doc):
            doc["setup"]["cluster"] = "local-cpu"  # experiments/clusters: gpu name cpu-rank
            if doc["backend"] == "mpi":
                doc["fidelity"] = ""
            doc["memory"] = memory_block(2e9, 11.7 * 2**30, 8)
        for backends in (("mpi", "analytic"), ("analytic",)):
            with tempfile.TemporaryDirectory() as d:
                make_points(d, "cpu", [(f"mesh.dp_shard={w}", b, "owner", w, 0.2 / w, cpu)
                                       for w in (2, 4, 8) for b in backends])
                p, loaded = self.drawn(d)
                self.assertEqual({r.device for r in loaded.records}, {"rank"})
                self.assertIn("cpu-scaling", p.figures)
                for name, fig in p.figures.items():
                    for text in texts_of(fig):
                        self.assertNotIn("GPU", text, f"{backends} {name}: {text!r}")
        with tempfile.TemporaryDirectory() as d:  # a GPU cluster says GPU
            make_points(d, "gpu", [("strategy.name=owner", "analytic", "owner", 8, 0.05, None)])
            p, loaded = self.drawn(d)
            self.assertEqual(loaded.records[0].device, "GPU")
            self.assertIn("per GPU", p.figures["gpu-throughput"].axes[0].get_xlabel())

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_footer_names_each_points_fidelity(self):
        def flow(doc):
            doc["fidelity"] = "flow"
        with tempfile.TemporaryDirectory() as d:
            make_points(d, "f", [(f"strategy.name={s}", b, s, 8, 0.01 * (i + 1),
                                  flow if (b == "sim" and s != "owner") else None)
                                 for i, s in enumerate(("owner", "replicated", "all_to_all"))
                                 for b in ("analytic", "sim")])
            p, _ = self.drawn(d)
            footer = p.figures["f-strategies"]._supxlabel.get_text()
            self.assertIn("fidelity: analytic closed_form; sim flow (2 points), step: owner",
                          footer)
            # The strategies bars say which fidelity each mixed-backend point is.
            texts = texts_of(p.figures["f-strategies"])
            self.assertEqual(len([t for t in texts if t.endswith("[step]")]), 1)
            self.assertEqual(len([t for t in texts if t.endswith("[flow]")]), 2)

    # ---- issue 23: the loader as an API ---------------------------------------------------------

    def test_load_results_rows(self):
        with tempfile.TemporaryDirectory() as d:
            def extra(doc):
                doc["memory"] = memory_block(90e9, 80e9, 8, over=3)
                doc["cross_check"] = cross_check("sim", 0.01, 0.0125)
            make_points(d, "api", [("strategy.name=owner,ns_steps=5", "analytic", "owner", 8,
                                    0.01, extra),
                                   ("strategy.name=owner,ns_steps=5", "sim", "owner", 8, 0.0125,
                                    None),
                                   ("strategy.name=sequential,ns_steps=5", "analytic",
                                    "sequential", 8, 0.08, None)])
            rows = loader.load_results(d, warn=False)
            self.assertEqual(len(rows), 3)
            names = [n for n, _ in loader.COLUMNS]
            for row in rows:
                self.assertEqual([k for k in row if not k.startswith("sweep.")], names)
                with open(row["path"], encoding="utf-8") as f:
                    doc = json.load(f)  # the file itself, read independently
                self.assertEqual(row["step_s"], doc["step"]["average_s"])
                self.assertEqual(row["world_size"], doc["setup"]["world_size"])
                self.assertEqual(row["exposed_comm_s"], doc["throughput"]["communication"][
                    "exposed_time_s"]["average"])
                self.assertEqual(row["optimizer_peak_bytes"],
                                 max(x["memory"]["peak_bytes"] for x in doc["ranks"]))
                self.assertEqual(row["sweep.ns_steps"], "5")
                self.assertEqual(row["device"], "GPU")
            first = next(r for r in rows if r["backend"] == "analytic" and
                         r["sweep.strategy.name"] == "owner")
            self.assertEqual((first["feasible"], first["over_ranks"], first["disagrees"]),
                             (False, 3, True))
            self.assertAlmostEqual(first["cross_check_pct"], -20.0)
            self.assertEqual(first["memory_limit_bytes"], 80e9)
            other = next(r for r in rows if r["backend"] == "sim")
            self.assertEqual((other["feasible"], other["disagrees"], other["peak_memory_bytes"]),
                             (None, None, None))
            ranks = loader.load_rank_rows(d, warn=False)
            self.assertEqual(len(ranks), 24)
            with open(rows[0]["path"], encoding="utf-8") as f:
                doc = json.load(f)
            mine = [x for x in ranks if (x["point"], x["backend"]) ==
                    (rows[0]["point"], rows[0]["backend"])]
            self.assertEqual([x["compute_s"] for x in mine],
                             [x["average"]["compute_s"] for x in doc["ranks"]])
            # An edited file is not returned, and the reason is on stderr when warn is on.
            with open(rows[0]["path"], "ab") as f:
                f.write(b" ")
            import contextlib
            import io
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(len(loader.load_results(d)), 2)
            self.assertIn("checksum does not match", err.getvalue())
            with self.assertRaises(loader.FolderError):
                loader.load_results(os.path.join(d, "missing"))
            try:
                import pandas  # noqa: F401
            except ImportError:
                with self.assertRaisesRegex(ImportError, "python3-pandas"):
                    loader.load_frame(d, warn=False)
            else:
                frame = loader.load_frame(d, warn=False)
                self.assertEqual(len(frame), 2)
                self.assertIn("step_s", frame.columns)

    def test_readme_example_runs(self):
        # analysis/README.md's "Results from Python" example, run as written on a results
        # folder laid out as the quickstart's.
        with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("## Results from Python"):]
        code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
        with tempfile.TemporaryDirectory() as d:
            make_strategies(os.path.join(d, "results", "quickstart"), claims=False)
            os.symlink(HERE, os.path.join(d, "analysis"))
            res = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("all_to_all", res.stdout)  # the fastest point of the synthetic sweep

    def test_claims_ranges(self):
        self.assertEqual(claims_mod.claimed_range("16-24x", 0.2), (16.0, 24.0))
        self.assertEqual(claims_mod.claimed_range([2, 3], 0.2), (2.0, 3.0))
        lo, hi = claims_mod.claimed_range(8, 0.25)
        self.assertAlmostEqual(lo, 6.4)
        self.assertAlmostEqual(hi, 10.0)
        for bad in ("nan", [3, 2], [0, 1], True, {"a": 1}, "inf", [1, float("inf")]):
            with self.assertRaises((ValueError, TypeError), msg=repr(bad)):
                claims_mod.claimed_range(bad, 0.2)
        with self.assertRaises(ValueError):
            claims_mod.claimed_range(8, -1)

    def test_errors(self):
        with tempfile.TemporaryDirectory() as d:
            res = self.run_cli(os.path.join(d, "missing"))
            self.assertEqual(res.returncode, 2)
            self.assertIn("not a folder", res.stderr)
            res = self.run_cli(d, "--formats", "gif")
            self.assertEqual(res.returncode, 2)
            with open(os.path.join(d, "file"), "w") as f:
                f.write("x")
            res = self.run_cli(d, "--out", os.path.join(d, "file"))
            self.assertEqual(res.returncode, 2)
            self.assertIn("is a file, not a folder", res.stderr)
            res = self.run_cli(d, "--out", os.path.join(d, "file", "sub"))
            self.assertEqual(res.returncode, 2)
            self.assertIn("cannot create the output folder", res.stderr)
            if HAVE_MPL:
                res = self.run_cli(d)
                self.assertEqual(res.returncode, 1)
                self.assertIn("no verified results", res.stderr)
                make_strategies(d, only={"owner"})
                with open(os.path.join(d, "bin.claims"), "wb") as f:
                    f.write(bytes(range(256)) * 4)
                res = self.run_cli(d, "--claims", os.path.join(d, "bin.claims"))
                self.assertEqual(res.returncode, 2)
                self.assertIn("not UTF-8", res.stderr)
                with open(os.path.join(d, "bad.yaml"), "w") as f:
                    f.write("claims: [{name: x, speedup: [1, 2}\n")
                res = self.run_cli(d, "--claims", os.path.join(d, "bad.yaml"))
                self.assertEqual(res.returncode, 2)
                self.assertIn("not valid YAML", res.stderr)
                self.assertNotIn("Traceback", res.stderr)

    def test_without_matplotlib(self):
        # A Python that cannot import matplotlib: a clear message and exit 0.
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d)
            block = os.path.join(d, "block")
            os.makedirs(os.path.join(block, "matplotlib"))
            with open(os.path.join(block, "matplotlib", "__init__.py"), "w") as f:
                f.write("raise ImportError('matplotlib blocked for the test')\n")
            env = dict(os.environ, PYTHONPATH=block)
            res = subprocess.run([sys.executable, PLOT, d], capture_output=True, text=True,
                                 env=env, timeout=120)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("matplotlib is not available", res.stdout)
            self.assertFalse(any(f.endswith(".png") for f in os.listdir(d)))

    def test_file_names_stay_in_the_output_folder(self):
        # An experiment name with '/' or '..' must not write outside --out, and distinct names
        # stay distinct (as core's point_slug).
        for name in ("../../etc/x", "a/b", "..", "."):
            part = common.file_part(name)
            self.assertNotIn("/", part)
            self.assertNotIn(part, ("..", "."))
        self.assertNotEqual(common.file_part("a/b"), common.file_part("a_b"))
        self.assertEqual(common.file_part("strategy.name=owner"), "strategy.name=owner")
        self.assertLessEqual(len(common.file_part("x" * 5000)), 200)

    def test_checksum_matches_core(self):
        # The same rule as core/results/src/result_json.cpp verify_checksum: any byte changed
        # breaks it.
        raw = result_bytes({"a": 1, "b": [1.5, "x"]})
        self.assertTrue(loader.verify_checksum(raw))
        for i in range(0, len(raw) - 70):
            changed = raw[:i] + bytes([raw[i] ^ 1]) + raw[i + 1:]
            self.assertFalse(loader.verify_checksum(changed), i)
        self.assertFalse(loader.verify_checksum(raw + b"{}"))

    def test_helpers(self):
        self.assertEqual(common.split_label(
            "strategy.name=owner,mesh.dims=[{name: dp_shard, size: 4}, {name: tp, size: 8}]"),
            [("strategy.name", "owner"),
             ("mesh.dims", "[{name: dp_shard, size: 4}, {name: tp, size: 8}]")])
        self.assertEqual(sweep_mod.short_value(
            "[{name: dp_shard, size: 4}, {name: tp, size: 8}]"), "dp_shard4×tp8")
        self.assertEqual(sweep_mod.short_value("{name: owner, prefetch_count: 2}"),
                         "owner, prefetch_count=2")
        self.assertEqual(sweep_mod.short_value("{preset: seeds, comm_lanes: 128}"),
                         "seeds, comm_lanes=128")
        self.assertEqual(sweep_mod.short_value("{dims: {dp_shard: 128, ep: 8}}"),
                         "dp_shard128×ep8")
        self.assertEqual(sweep_mod.short_value(
            "{dims: [{name: dp_shard, size: 4}, {name: tp, size: 8}]}"), "dp_shard4×tp8")
        self.assertEqual(sweep_mod.short_value(
            "{hf_config: models/Qwen3-30B-A3B/config.json}"), "Qwen3-30B-A3B")
        self.assertEqual(sweep_mod.short_value("{hf_config: my/mixtral.json}"), "mixtral")
        self.assertEqual(sweep_mod.short_value("{preset: llama-7b}"), "llama-7b")
        self.assertEqual(common.time_unit(0.002), (1e3, "ms"))


def common_plotter(plt, out, excluded):
    from muonbed_plots.style import Plotter, setup_style
    import matplotlib
    setup_style(matplotlib)
    return Plotter(plt, out, ["png"], 16, excluded=excluded, keep_figures=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make":
        make_strategies(os.path.join(sys.argv[2], "quickstart"))
        make_scaling(os.path.join(sys.argv[2], "scaling"))
        make_marks(os.path.join(sys.argv[2], "marks"))
        print(f"synthetic results in {sys.argv[2]}/quickstart, {sys.argv[2]}/scaling and "
              f"{sys.argv[2]}/marks")
    else:
        unittest.main()
