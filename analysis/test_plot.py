#!/usr/bin/python3
"""Tests of analysis/plot.py on synthetic results folders laid out as `muonbed run` writes them
(<output>/<point slug>/<backend>.json per core/results.hpp, schema 1, plus a trace JSON of one
step): the expected plots are written, non-empty, deterministic, and the CLI's error paths exit
as documented. Run: /usr/bin/python3 -m unittest analysis/test_plot.py (from the repo root), or
/usr/bin/python3 analysis/test_plot.py. `--make DIR` writes the synthetic folders to DIR instead
(for looking at the plots by hand)."""

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

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except Exception:
    HAVE_MPL = False


def slug(label):
    return re.sub(r"[^A-Za-z0-9._=-]", "_", label) if label else "default"


def record(experiment, label, backend, strategy, world, step_s, worst_s=None, gpn=8,
           compute_frac=0.6, exposed_frac=0.25, claims=None):
    """A results record of schema 1 with plausible, self-consistent numbers."""
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
        "schema_version": 1, "backend": backend,
        "fidelity": "step" if backend == "sim" else "closed_form",
        "timestamp": "2025-01-31T12:34:56Z",
        "provenance": {"muonbed_version": "0.1.0", "git_hash": "0123456789abcdef" * 2 + "01234567",
                       "simgrid_version": "3.35" if backend == "sim" else "",
                       "host_name": "test", "experiment": experiment,
                       "experiment_file": "experiments/" + experiment + ".yaml",
                       "point": label,
                       "resolved_config": "name: %s\nstrategy: {name: %s}\n" % (experiment,
                                                                                strategy)},
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


def write(path, doc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


CLAIMS = [{"name": "parallel ~N x faster than sequential", "source": "seed 000",
           "baseline": "strategy.name=sequential", "target": "strategy.name=owner",
           "speedup": 8},
          {"name": "total 16-24 x on 8 GPUs", "source": "seed 000",
           "baseline": {"strategy.name": "sequential"}, "target": "strategy.name=all_to_all",
           "speedup": [16, 24]}]


def make_strategies(root, claims=True, only=None):
    """quickstart-like: five strategies x two backends on 8 GPUs, a trace per sim point; the
    replicated point has a level-sync pattern so average and worst differ."""
    times = {"sequential": 0.080, "replicated": 0.030, "owner": 0.0105, "all_to_all": 0.0062,
             "owner_allgather": 0.0081}
    for strategy, t in times.items():
        if only and strategy not in only:
            continue
        label = f"strategy.name={strategy}"
        for backend, f in (("analytic", 1.0), ("sim", 1.12)):
            worst = t * f * 1.9 if strategy == "replicated" else None
            write(os.path.join(root, slug(label), backend + ".json"),
                  record("quickstart", label, backend, strategy, 8, t * f, worst,
                         claims=CLAIMS if claims else None))
        write(os.path.join(root, slug(label), "sim.trace.json"), trace(8))


def make_scaling(root):
    """world size varies (8..128 GPUs) for two strategies; analytic only; big meshes."""
    for strategy in ("owner", "all_to_all"):
        for world in (8, 16, 32, 64, 128):
            label = f"strategy.name={strategy},mesh.dims=[{{name: dp_shard, size: {world}}}]"
            t = 0.01 * (8 / world) ** 0.7 * (1.0 if strategy == "owner" else 0.7)
            write(os.path.join(root, slug(label), "analytic.json"),
                  record("scaling", label, "analytic", strategy, world, t, t * 1.3))
            if world == 128 and strategy == "owner":
                write(os.path.join(root, slug(label), "analytic.trace.json"),
                      trace(world, ops=6))
            if world == 32 and strategy == "all_to_all":
                write(os.path.join(root, slug(label), "trace.json"), legacy_trace(world))


def make_seed_claims(root):
    """experiments/seed_claims.yaml's layout: the sweep key `strategy` takes maps, and the
    variants are told apart by the resolved configuration (no claims stated in the files)."""
    for name, prefetch, t in (("sequential", 0, 0.95), ("owner", 0, 0.136), ("owner", 2, 0.117)):
        label = f"strategy={{name: {name}, prefetch_count: {prefetch}}}"
        doc = record("seed_claims", label, "analytic", name, 8, t)
        doc["provenance"]["resolved_config"] = (
            f"name: seed_claims\nstrategy:\n  name: {name}\n  prefetch_count: {prefetch}\n")
        write(os.path.join(root, slug(label), "analytic.json"), doc)


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

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_strategy_sweep(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d)
            res = self.run_cli(d)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assert_files(d, ["quickstart-strategies", "quickstart-throughput",
                                  "quickstart-traffic", "quickstart-ranks-analytic",
                                  "quickstart-ranks-sim", "quickstart-ranks-sim-worst",
                                  "quickstart-timeline-sim-owner", "quickstart-claims"])
            self.assertFalse(os.path.exists(os.path.join(d, "quickstart-scaling.png")),
                             "no scaling plot when the world size does not vary")
            self.assertIn("wrote", res.stdout)
            self.assertIn("quickstart-strategies.png", res.stdout)
            # Every file it lists exists; the claims table is printed.
            listed = [l.strip() for l in res.stdout.splitlines() if l.startswith("  ")
                      and l.strip().endswith((".png", ".pdf"))]
            self.assertEqual(len(listed), len([f for f in os.listdir(d)
                                               if f.endswith((".png", ".pdf"))]))
            self.assertIn("claimed", res.stdout)
            self.assertIn("holds", res.stdout)

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_manifest_limits_plots_to_the_current_sweep(self):
        # An edited experiment no longer has the sequential point; its old files stay in the
        # folder, and muonbed run's manifest lists only the current points.
        with tempfile.TemporaryDirectory() as d:
            make_strategies(d, claims=False, only={"sequential", "owner"})
            owner = slug("strategy.name=owner")
            write(os.path.join(d, "muonbed-run.json"),
                  {"experiment": "quickstart",
                   "results": [f"{owner}/analytic.json", f"{owner}/sim.json"],
                   "traces": [f"{owner}/sim.trace.json"]})
            res = self.run_cli(d, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("read 2 result file(s)", res.stdout)
            self.assertIn("3 JSON file(s)", res.stdout)  # sequential's two results and trace
            timelines = [f for f in os.listdir(d) if f.startswith("quickstart-timeline-")]
            self.assertEqual(timelines, ["quickstart-timeline-sim-owner.png"])

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_scaling_and_big_mesh(self):
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "res"), os.path.join(d, "plots")
            make_scaling(src)
            res = self.run_cli(src, "--out", out, "--formats", "png")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assert_files(out, ["scaling-strategies", "scaling-scaling",
                                    "scaling-ranks-analytic", "scaling-ranks-analytic-worst"],
                              formats=("png",))
            timelines = sorted(f for f in os.listdir(out) if f.startswith("scaling-timeline-"))
            self.assertEqual(len(timelines), 2, timelines)
            self.assertFalse(any(f.endswith(".pdf") for f in os.listdir(out)))
            self.assertFalse(any(f.endswith(".png") for f in os.listdir(src)),
                             "--out keeps the results folder clean")

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_deterministic(self):
        with tempfile.TemporaryDirectory() as d:
            make_strategies(os.path.join(d, "res"), only=("replicated", "owner"))
            outs = []
            for i in range(2):
                out = os.path.join(d, f"out{i}")
                res = self.run_cli(os.path.join(d, "res"), "--out", out)
                self.assertEqual(res.returncode, 0, res.stderr)
                files = {}
                for f in sorted(os.listdir(out)):
                    with open(os.path.join(out, f), "rb") as fh:
                        files[f] = fh.read()
                outs.append(files)
            self.assertEqual(sorted(outs[0]), sorted(outs[1]))
            for f in outs[0]:
                self.assertEqual(outs[0][f], outs[1][f], f"{f} differs between two runs")

    @unittest.skipUnless(HAVE_MPL, "matplotlib is not importable by this interpreter")
    def test_seed000_claims_built_in(self):
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

    def test_errors(self):
        with tempfile.TemporaryDirectory() as d:
            res = self.run_cli(os.path.join(d, "missing"))
            self.assertEqual(res.returncode, 2)
            self.assertIn("not a folder", res.stderr)
            res = self.run_cli(d, "--formats", "gif")
            self.assertEqual(res.returncode, 2)
            if HAVE_MPL:
                res = self.run_cli(d)
                self.assertEqual(res.returncode, 1)
                self.assertIn("no results JSON", res.stderr)

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

    def test_helpers(self):
        self.assertEqual(plot.split_label(
            "strategy.name=owner,mesh.dims=[{name: dp_shard, size: 4}, {name: tp, size: 8}]"),
            [("strategy.name", "owner"),
             ("mesh.dims", "[{name: dp_shard, size: 4}, {name: tp, size: 8}]")])
        self.assertEqual(plot.short_value("[{name: dp_shard, size: 4}, {name: tp, size: 8}]"),
                         "dp_shard4×tp8")
        self.assertEqual(plot.short_value("{name: owner, prefetch_count: 2}"),
                         "owner, prefetch_count=2")
        self.assertEqual(plot.claimed_range("16-24x", 0.2), (16.0, 24.0))
        self.assertEqual(plot.claimed_range([2, 3], 0.2), (2.0, 3.0))
        lo, hi = plot.claimed_range(8, 0.25)
        self.assertAlmostEqual(lo, 6.4)
        self.assertAlmostEqual(hi, 10.0)
        self.assertEqual(plot.time_unit(0.002), (1e3, "ms"))
        # A reader tolerant of missing fields: absent numbers read as 0.
        self.assertEqual(plot.aw({}, "throughput.params_per_s_per_gpu"), (0.0, 0.0))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make":
        make_strategies(os.path.join(sys.argv[2], "quickstart"))
        make_scaling(os.path.join(sys.argv[2], "scaling"))
        print(f"synthetic results in {sys.argv[2]}/quickstart and {sys.argv[2]}/scaling")
    else:
        unittest.main()
