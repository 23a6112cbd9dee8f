#!/usr/bin/python3
"""Plots of one muonbed experiment's results: reads every results JSON (schema of
core/results.hpp) and step trace under a folder and draws what the sweep makes meaningful.

  /usr/bin/python3 analysis/plot.py results/quickstart [--out DIR] [--formats png,pdf]

Plots (each as PNG and PDF, chosen from what varies in the sweep):
  <exp>-strategies     step time per sweep point, split into computation only, overlapped
                       communication, exposed communication and idle; average and worst step apart
  <exp>-throughput     seed 002's per-GPU reporting: parameters updated/s, computation TFLOP/s and
                       communication GB/s per GPU, each average and worst step
  <exp>-traffic        bytes per step by link class (NVLink/PCIe vs network) and peak memory
  <exp>-scaling        step time and per-GPU throughput against GPU count (world size varies)
  <exp>-ranks-<be>     per-rank breakdown of each point (min/median/max ranks for big meshes)
  <exp>-timeline-<be>-<point>   one step's Gantt chart per rank and stream from the trace JSON
  <exp>-claims         claimed vs predicted speedups, when the experiment states claims

Uses only the standard library, numpy and matplotlib (Debian's python3-matplotlib, importable by
/usr/bin/python3), PyYAML when present. Output is deterministic: fixed sizes and fonts, no dates
in the files' metadata, and only provenance (version, git hash) in the footer.
"""

import argparse
import json
import math
import os
import re
import sys

try:  # optional: sweep order from the experiment file, claims in YAML
    import yaml  # type: ignore
except Exception:  # pragma: no cover - depends on the interpreter
    yaml = None

SCHEMA_VERSION = 1
DEFAULT_MAX_RANKS = 16       # ranks drawn in a timeline
RANKS_SHOWN_IN_FULL = 32     # above this, rank breakdowns show min/median/max ranks
CLAIM_TOLERANCE = 0.2        # a single-number claim holds within +-20 % unless it says otherwise

# The four parts a rank's step time splits into (they add up to the step time):
#   computation only        compute busy time not overlapped by communication
#   overlapped communication communication hidden under compute (compute and comm both busy)
#   exposed communication   communication time with no compute running
#   idle                    nothing running: waiting for peers or for the slowest rank
COMPONENTS = [
    ("compute_only", "computation only", "#4C72B0"),
    ("overlapped", "computation ∥ communication (overlapped)", "#8FB8DE"),
    ("exposed", "exposed communication", "#DD8452"),
    ("idle", "idle / waiting", "#C8C8C8"),
]
BACKEND_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]
COMPUTE_KINDS = ["momentum", "newton_schulz", "apply_update", "adamw", "pack", "unpack"]
COMM_KINDS = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "gather", "scatter",
              "broadcast", "send", "recv", "barrier"]
KIND_COLORS = {
    "momentum": "#9ECAE1", "newton_schulz": "#2171B5", "apply_update": "#6BAED6",
    "adamw": "#31A354", "pack": "#BCBDDC", "unpack": "#9E9AC8",
    "all_gather": "#E6550D", "reduce_scatter": "#FD8D3C", "all_reduce": "#A63603",
    "all_to_all": "#D62728", "gather": "#FDAE6B", "scatter": "#F16913", "broadcast": "#8C564B",
    "send": "#E377C2", "recv": "#F7B6D2", "barrier": "#7F7F7F", "other": "#C7C7C7",
}


# ---- Reading -------------------------------------------------------------------------------------

def short_hash(git_hash):
    """The commit's first 12 hex digits, marked when the build had uncommitted changes."""
    return git_hash[:12] + ("+dirty" if "-dirty" in git_hash else "")


def get(d, path, default=None):
    """d["a"]["b"]["c"] for path "a.b.c", or default when any part is missing."""
    cur = d
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def num(d, path, default=0.0):
    v = get(d, path, default)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def aw(d, path):
    """An {average, worst} pair as (average, worst); a bare number counts as both."""
    v = get(d, path)
    if isinstance(v, dict):
        a = num(v, "average")
        return a, num(v, "worst", a)
    a = num(d, path)
    return a, a


def is_result(doc):
    return isinstance(doc, dict) and "step" in doc and ("schema_version" in doc or
                                                        "setup" in doc)


def is_trace(doc):
    """Chrome trace-event JSON: {"traceEvents": [...]} or a bare list of events with "ph"."""
    if isinstance(doc, dict):
        return isinstance(doc.get("traceEvents"), list)
    return isinstance(doc, list) and any(isinstance(e, dict) and "ph" in e for e in doc[:200])


def split_label(label):
    """'a.b=x,c=[{n: 1, s: 2}]' -> [('a.b', 'x'), ('c', '[{n: 1, s: 2}]')]; commas inside
    brackets or braces belong to the value."""
    parts, depth, cur = [], 0, ""
    for ch in label or "":
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        if "=" in p:
            k, v = p.split("=", 1)
            out.append((k.strip(), v.strip()))
        elif out:  # a stray comma in an unbracketed value
            out[-1] = (out[-1][0], out[-1][1] + "," + p)
        else:
            out.append(("point", p.strip()))
    return out


class Record:
    """One results JSON (one sweep point, one backend)."""

    def __init__(self, path, doc):
        self.path = path
        self.doc = doc
        self.backend = str(doc.get("backend") or "unknown")
        self.fidelity = str(doc.get("fidelity") or "")
        self.experiment = str(get(doc, "provenance.experiment") or "") or \
            os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(path)))) or "results"
        self.label = str(get(doc, "provenance.point") or "")
        self.params = split_label(self.label)
        self.trace = None  # path of this point's trace JSON, when found
        self.world = int(num(doc, "setup.world_size", 0)) or len(doc.get("ranks") or []) or 1
        self.strategy = str(get(doc, "setup.strategy") or "")

    def value(self, key):
        for k, v in self.params:
            if k == key:
                return v
        return None


MANIFEST = "muonbed-run.json"


def manifest_files(root):
    """The files `muonbed run` lists in root/muonbed-run.json: the current sweep's results and
    traces. Files of points an edited experiment no longer has stay in the folder but are not
    plotted. None without a manifest (every JSON under root is read)."""
    path = os.path.join(root, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        listed = doc["results"] + doc.get("traces", [])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot: ignoring unreadable {path} ({e}); reading every JSON file", file=sys.stderr)
        return None
    return {os.path.normpath(os.path.join(root, rel)) for rel in listed}


def load_dir(root):
    """Result records and traces under root (recursively), in a stable order; only those the
    manifest lists when there is one."""
    records, traces, skipped = [], [], []
    only = manifest_files(root)
    ignored = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".json") or name == MANIFEST:
                continue
            path = os.path.join(dirpath, name)
            if only is not None and os.path.normpath(path) not in only:
                ignored += 1
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError) as e:
                skipped.append(f"{path}: {e}")
                continue
            if is_result(doc):
                v = doc.get("schema_version", SCHEMA_VERSION)
                if v != SCHEMA_VERSION:
                    print(f"plot: note: {path} has schema_version {v}, this script reads "
                          f"{SCHEMA_VERSION}; reading what it can", file=sys.stderr)
                records.append(Record(path, doc))
            elif is_trace(doc):
                traces.append(path)
    attach_traces(records, traces)
    for s in skipped:
        print(f"plot: skipped unreadable {s}", file=sys.stderr)
    if ignored:
        print(f"plot: note: {ignored} JSON file(s) under {root} are not in {MANIFEST} (points "
              f"the last `muonbed run` of this folder did not have); not plotted")
    return records


def attach_traces(records, traces):
    """A trace belongs to the record of its folder whose backend its file name names (e.g.
    sim.trace.json next to sim.json); a folder's only trace goes to its records without one."""
    by_dir = {}
    for t in traces:
        by_dir.setdefault(os.path.dirname(t), []).append(t)
    def names(t, word):
        return re.search(r"(^|[._-])" + re.escape(word) + r"([._-]|$)", os.path.basename(t))

    for r in records:
        d = os.path.dirname(r.path)
        here = by_dir.get(d, [])
        stem = os.path.splitext(os.path.basename(r.path))[0]
        named = [t for t in here if names(t, stem) or names(t, r.backend)]
        others = {x.backend for x in records if os.path.dirname(x.path) == d} - {r.backend}
        unnamed = [t for t in here if not any(names(t, b) for b in others)]
        if named:
            r.trace = named[0]
        elif len(unnamed) == 1:
            r.trace = unnamed[0]


# ---- Sweep structure -----------------------------------------------------------------------------

def natural_key(text):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(text))]


def sweep_order(records):
    """Per sweep key, the order of its values in the experiment file's `sweep:` (when the file
    can be read), so plots list points as the experiment wrote them."""
    if yaml is None:
        return {}
    for r in records:
        f = get(r.doc, "provenance.experiment_file")
        if not f:
            continue
        for cand in (f, os.path.join(os.path.dirname(os.path.abspath(r.path)), f)):
            if os.path.isfile(cand):
                try:
                    with open(cand, encoding="utf-8") as fh:
                        doc = yaml.safe_load(fh)
                except Exception:
                    return {}
                sweep = doc.get("sweep") if isinstance(doc, dict) else None
                if not isinstance(sweep, dict):
                    return {}
                out = {}
                for k, values in sweep.items():
                    if isinstance(values, list):
                        out[str(k)] = [norm_value(v) for v in values]
                return out
    return {}


def norm_value(v):
    if isinstance(v, (list, dict)):
        return re.sub(r"[\s'\"]", "", json.dumps(v)).replace(":", "")
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def norm_text(text):
    return re.sub(r"[\s'\"]", "", str(text)).replace(":", "")


class Sweep:
    """The points of one experiment and what varies between them."""

    def __init__(self, records):
        self.records = records
        self.backends = sorted({r.backend for r in records},
                               key=lambda b: (["analytic", "sim", "mpi", "nccl"].index(b)
                                              if b in ["analytic", "sim", "mpi", "nccl"] else 9, b))
        keys = []
        for r in records:
            for k, _ in r.params:
                if k not in keys:
                    keys.append(k)
        values = {k: [] for k in keys}
        for r in records:
            for k, v in r.params:
                if v not in values[k]:
                    values[k].append(v)
        order = sweep_order(records)
        for k in keys:
            ref = order.get(k)
            if ref:
                values[k].sort(key=lambda v: (ref.index(norm_text(v)) if norm_text(v) in ref
                                              else len(ref), natural_key(v)))
            else:
                values[k].sort(key=natural_key)
        self.keys = keys
        self.values = values
        self.varying = [k for k in keys if len(values[k]) > 1]
        labels = []
        for r in records:
            if r.label not in labels:
                labels.append(r.label)

        def rank(label):
            params = dict(split_label(label))
            return [values[k].index(params[k]) if k in params and params[k] in values[k] else -1
                    for k in keys]
        self.labels = sorted(labels, key=rank)
        self.worlds = sorted({r.world for r in records})
        self.short = {lab: self.short_label(lab) for lab in self.labels}
        if len(self.worlds) > 1:  # the GPU count, when the sweep changes it
            for lab in self.labels:
                r = next(r for r in records if r.label == lab)
                self.short[lab] += f" ({r.world} GPUs)"

    def record(self, label, backend):
        for r in self.records:
            if r.label == label and r.backend == backend:
                return r
        return None

    def short_label(self, label):
        params = split_label(label)
        shown = [(k, v) for k, v in params if k in self.varying] or params
        if not shown:
            r = next((r for r in self.records if r.label == label), None)
            return (r.strategy if r and r.strategy else "default")
        names = [short_key(k) for k, _ in shown]
        dup = {n for n in names if names.count(n) > 1}
        parts = []
        for (k, v), n in zip(shown, names):
            n = k if n in dup else n
            v = short_value(v)
            parts.append(v if (len(shown) == 1 and n in ("name", "strategy")) else f"{n}={v}")
        return ", ".join(parts)


def short_key(key):
    if key in ("mesh", "mesh.dims"):
        return "mesh"
    if key == "strategy.name":
        return "strategy"
    return key.split(".")[-1]


def short_value(value):
    """Sweep values as shown in plots:
      '[{name: dp_shard, size: 4}, {name: tp, size: 8}]' -> 'dp_shard4×tp8' (mesh dims),
      '{dp_shard: 8, tp: 4}' -> 'dp_shard8×tp4' (a map of sizes),
      '{name: owner, prefetch_count: 2}' -> 'owner, prefetch_count=2' (a map with a name)."""
    value = str(value).strip()
    dims = re.findall(r"name:\s*([A-Za-z_]\w*)\s*,\s*size:\s*(\d+)", value)
    if dims:
        return "×".join(f"{n}{s}" for n, s in dims)
    if value.startswith("{") and value.endswith("}"):
        pairs = [tuple(x.strip() for x in part.split(":", 1))
                 for part in split_top(value[1:-1]) if ":" in part]
        if pairs and all(re.fullmatch(r"\d+", v) for _, v in pairs):
            return "×".join(f"{k}{v}" for k, v in pairs)
        named = [v for k, v in pairs if k == "name"]
        rest = [f"{k}={v}" for k, v in pairs if k != "name"]
        if pairs:
            return ", ".join(named + rest)
    return value


def split_top(text):
    """Splits at commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{("
        depth -= ch in "]})"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur] if cur.strip() else parts


# ---- Formatting ----------------------------------------------------------------------------------

def time_unit(seconds):
    """(scale, unit) that shows `seconds` with 1-3 digits before the point."""
    s = abs(seconds)
    if s >= 1:
        return 1.0, "s"
    if s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def fmt_time(seconds):
    scale, unit = time_unit(seconds)
    v = seconds * scale
    return f"{v:.3g} {unit}"


def bytes_unit(b):
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(b) >= scale:
            return scale, unit
    return 1.0, "B"


def count_unit(x):
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return scale, unit
    return 1.0, ""


def slug(text):
    s = re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")
    return s[:80] or "default"


def differ(a, b):
    return abs(a - b) > 1e-9 * max(abs(a), abs(b), 1e-30)


# ---- Plot context --------------------------------------------------------------------------------

class Plotter:
    def __init__(self, plt, out_dir, formats, max_ranks):
        self.plt = plt
        self.out_dir = out_dir
        self.formats = formats
        self.max_ranks = max_ranks
        self.written = []

    def footer(self, fig, sweep, extra=""):
        recs = sweep.records
        versions = sorted({str(get(r.doc, "provenance.muonbed_version") or "?") for r in recs})
        hashes = sorted({short_hash(str(get(r.doc, "provenance.git_hash") or "unknown"))
                         for r in recs})
        backends = ", ".join(
            f"{b} ({sorted({r.fidelity for r in recs if r.backend == b and r.fidelity})[0]})"
            if any(r.fidelity for r in recs if r.backend == b) else b for b in sweep.backends)
        setup = recs[0].doc.get("setup", {}) if recs else {}
        text = (f"muonbed {'/'.join(versions)} · git {'/'.join(hashes)} · backends: {backends}"
                f" · cluster {setup.get('cluster', '?')} · model {setup.get('model', '?')}")
        if extra:
            text += " · " + extra
        # As the figure's supxlabel, so constrained layout reserves room for it.
        fig.supxlabel(text, x=0.005, ha="left", fontsize=6.5, color="#555555")

    def new_figure(self, width, height, **kw):
        fig = self.plt.figure(figsize=(width, height))
        fig.set_layout_engine("constrained", h_pad=0.06, w_pad=0.06)
        return fig

    def save(self, fig, name):
        os.makedirs(self.out_dir, exist_ok=True)
        for ext in self.formats:
            path = os.path.join(self.out_dir, f"{name}.{ext}")
            meta = {"Software": None} if ext == "png" else {}
            if ext == "pdf":
                meta = {"CreationDate": None, "ModDate": None, "Producer": None,
                        "Creator": None}
            elif ext == "svg":
                meta = {"Date": None, "Creator": None}
            fig.savefig(path, format=ext, dpi=150, metadata=meta)
            self.written.append(path)
        self.plt.close(fig)


# ---- 1. Strategy comparison ----------------------------------------------------------------------

def parts_of(doc, which):
    """The four step-time parts (mean over GPUs) of a record's average or worst step."""
    i = 0 if which == "average" else 1
    step = aw(doc, "step.average_s")[0] if which == "average" else num(doc, "step.worst_s")
    compute = aw(doc, "throughput.computation.time_s")[i]
    comm = aw(doc, "throughput.communication.time_s")[i]
    exposed = aw(doc, "throughput.communication.exposed_time_s")[i]
    overlapped = max(0.0, min(comm - exposed, compute))
    return step, {
        "compute_only": max(0.0, compute - overlapped),
        "overlapped": overlapped,
        "exposed": max(0.0, exposed),
        "idle": max(0.0, step - compute - max(0.0, exposed)),
    }


def plot_strategies(p, sweep, name):
    from matplotlib.patches import Patch
    labels = sweep.labels
    any_worst = any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
                    for r in sweep.records)
    slot = 2 if any_worst else 1
    nb = len(sweep.backends)
    height = min(14.0, max(4.5, 1.9 + 0.42 * len(labels) * slot))
    width = 10.0 if nb == 1 else min(17.0, 7.5 + 4.2 * nb)
    fig = p.new_figure(width, height)
    axes = fig.subplots(1, nb, sharey=True, sharex=True, squeeze=False)[0]
    tmax = max(max(num(r.doc, "step.average_s"), num(r.doc, "step.worst_s"))
               for r in sweep.records)
    scale, unit = time_unit(tmax)
    for ax, backend in zip(axes, sweep.backends):
        for i, label in enumerate(labels):
            r = sweep.record(label, backend)
            if r is None:
                ax.text(tmax * scale * 0.01, i, "no result for this backend", va="center",
                        fontsize=7.5, color="#888888", style="italic")
                continue
            worst_differs = differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
            rows = [("average", -0.2), ("worst", 0.2)] if worst_differs else [("average", 0.0)]
            h = 0.38 if worst_differs else (0.5 if any_worst else 0.7)
            for which, dy in rows:
                total, parts = parts_of(r.doc, which)
                left = 0.0
                for key, _, color in COMPONENTS:
                    w = parts[key] * scale
                    ax.barh(i + dy, w, left=left, height=h, color=color,
                            hatch="///" if which == "worst" else None,
                            edgecolor="white" if which == "average" else "#333333",
                            linewidth=0.4)
                    left += w
                tag = "" if not worst_differs else ("avg " if which == "average" else "worst ")
                extra = ""
                if which == "worst":
                    extra = f" (step {int(num(r.doc, 'step.worst_step'))})"
                ax.text(max(left, total * scale) + tmax * scale * 0.01, i + dy,
                        f"{tag}{total * scale:.3g} {unit}{extra}", va="center", fontsize=7.5)
        ax.set_title(f"backend: {backend}", fontsize=10)
        ax.set_xlabel(f"step time ({unit}); parts are means over GPUs")
        ax.set_xlim(0, tmax * scale * 1.32)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels([sweep.short[l] for l in labels], fontsize=8.5)
    axes[0].invert_yaxis()
    axes[0].set_ylabel("sweep point")
    handles = [Patch(facecolor=c, label=t) for _, t, c in COMPONENTS]
    if any_worst:
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="///",
                             label="worst step (hatched)"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                    frameon=False)
    what = "average and worst step" if any_worst else "average step"
    measured = [b for b in sweep.backends if b not in ("analytic", "sim")]
    verb = ("predicted" if not measured else "measured" if len(measured) == nb
            else "predicted and measured")
    fig.suptitle(f"{name}: {verb} optimizer step time per sweep point ({what})",
                 fontsize=11.5)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-strategies")


# ---- Throughput (seed 002's per-GPU reporting) ---------------------------------------------------

def plot_throughput(p, sweep, name):
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter
    labels = sweep.labels
    metrics = [
        ("throughput.params_per_s_per_gpu", "end to end: parameters updated\nper second per GPU",
         "params/s per GPU", None),
        ("throughput.computation.tflops_per_gpu", "computation: optimizer FLOP rate\nper GPU",
         "TFLOP/s per GPU", None),
        ("throughput.communication.GBps_per_gpu", "communication: bytes sent\nper second per GPU",
         "GB/s per GPU", None),
    ]
    nb = len(sweep.backends)
    # Worst-step bars only when some point's worst step differs from its average one.
    show_worst = any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
                     for r in sweep.records)
    per = 2 if show_worst else 1
    bars = per * nb
    height = min(14.0, max(3.8, 2.0 + 0.16 * len(labels) * bars + 0.2 * len(labels)))
    fig = p.new_figure(16, height)
    axes = fig.subplots(1, 3, sharey=True, squeeze=False)[0]
    h = 0.8 / bars
    for ax, (path, title, xlabel, _) in zip(axes, metrics):
        vmax = max([max(aw(r.doc, path)) for r in sweep.records] + [0])
        scale, prefix = count_unit(vmax) if "params" in path else (1.0, "")
        for i, label in enumerate(labels):
            for b, backend in enumerate(sweep.backends):
                r = sweep.record(label, backend)
                if r is None:
                    continue
                avg, worst = aw(r.doc, path)
                color = BACKEND_COLORS[b % len(BACKEND_COLORS)]
                y0 = i - 0.4 + h * (per * b) + h / 2
                ax.barh(y0, avg / scale, height=h, color=color, edgecolor="white", linewidth=0.3)
                if show_worst:
                    ax.barh(y0 + h, worst / scale, height=h, color="white", edgecolor=color,
                            hatch="////", linewidth=0.8)
        ax.set_title(title, fontsize=9.5)
        words = {"k": "thousand ", "M": "million ", "G": "billion ", "T": "trillion "}
        xlabel = xlabel.replace("params/s", f"{words.get(prefix, '')}params/s")
        positive = [v for r in sweep.records for v in aw(r.doc, path) if v > 0]
        # Log scale when the points span more than 50x (bars here are not stacked).
        log = bool(positive) and max(positive) / min(positive) > 50
        ax.set_xlabel(xlabel + (" (log scale)" if log else ""))
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(positive) / scale / 2, max(positive) / scale * 1.5)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        elif vmax > 0:
            ax.set_xlim(0, vmax / scale * 1.08)
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels([sweep.short[l] for l in labels], fontsize=8.5)
    axes[0].invert_yaxis()
    axes[0].set_ylabel("sweep point")
    handles = []
    for b, backend in enumerate(sweep.backends):
        color = BACKEND_COLORS[b % len(BACKEND_COLORS)]
        if show_worst:
            handles.append(Patch(facecolor=color, label=f"{backend}: average step"))
            handles.append(Patch(facecolor="white", edgecolor=color, hatch="////",
                                 label=f"{backend}: worst step"))
        else:
            handles.append(Patch(facecolor=color, label=f"{backend}"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                    frameon=False, title=None if show_worst else "average = worst step",
                    title_fontsize=7.5)
    fig.suptitle(f"{name}: per-GPU throughput, "
                 f"{'average and worst step' if show_worst else 'every step alike'} "
                 f"(computation and communication apart)", fontsize=11.5)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-throughput")


# ---- Traffic and memory --------------------------------------------------------------------------

def plot_traffic(p, sweep, name):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    labels = sweep.labels
    nb = len(sweep.backends)
    hatches = [None, "...", "xxx", "\\\\\\", "+++"]
    height = min(14.0, max(3.8, 2.0 + 0.3 * len(labels) * max(1, nb)))
    fig = p.new_figure(15, height)
    ax_t, ax_m = fig.subplots(1, 2, sharey=True)

    def total(r, i):
        return aw(r.doc, "traffic.intra_node_bytes")[i] + aw(r.doc, "traffic.network_bytes")[i]
    bmax = max([max(total(r, 0), total(r, 1)) for r in sweep.records] + [1])
    bscale, bunit = bytes_unit(bmax)
    mems = [num(x, "memory.peak_bytes") for r in sweep.records for x in r.doc.get("ranks") or []]
    mscale, munit = bytes_unit(max(mems + [1]))
    h = 0.8 / max(1, nb)
    any_worst = False
    for i, label in enumerate(labels):
        for b, backend in enumerate(sweep.backends):
            r = sweep.record(label, backend)
            if r is None:
                continue
            y = i - 0.4 + h * b + h / 2
            hatch = hatches[b % len(hatches)]
            intra = aw(r.doc, "traffic.intra_node_bytes")[0] / bscale
            net = aw(r.doc, "traffic.network_bytes")[0] / bscale
            ax_t.barh(y, intra, height=h, color="#55A868", hatch=hatch, edgecolor="#1E4D2B",
                      linewidth=0)
            ax_t.barh(y, net, left=intra, height=h, color="#C44E52", hatch=hatch,
                      edgecolor="#5A1A1C", linewidth=0)
            if differ(total(r, 1), total(r, 0)):
                any_worst = True
                ax_t.plot([total(r, 1) / bscale], [y], marker="D", color="black", markersize=4)
            ranks = r.doc.get("ranks") or []
            if ranks:
                top = max(ranks, key=lambda x: num(x, "memory.peak_bytes"))
                low = min(num(x, "memory.peak_bytes") for x in ranks) / mscale
                static = num(top, "memory.static_bytes") / mscale
                peak = num(top, "memory.peak_bytes") / mscale
                ax_m.barh(y, static, height=h, color="#8172B3", hatch=hatch, edgecolor="#3B3161",
                          linewidth=0)
                ax_m.barh(y, max(0.0, peak - static), left=static, height=h, color="#CCB9E8",
                          hatch=hatch, edgecolor="#3B3161", linewidth=0)
                ax_m.plot([low, low], [y - h / 2, y + h / 2], color="black", linewidth=1.2)
    ax_t.set_xlabel(f"bytes moved per average step, all GPUs ({bunit})")
    ax_t.set_title("traffic by link class", fontsize=10)
    ax_m.set_xlabel(f"peak memory of a rank ({munit})")
    ax_m.set_title("peak memory of the fullest rank (black line: emptiest rank)", fontsize=10)
    for ax in (ax_t, ax_m):
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_xlim(0, ax.get_xlim()[1] * 1.04)
    ax_t.set_yticks(range(len(labels)))
    ax_t.set_yticklabels([sweep.short[l] for l in labels], fontsize=8.5)
    ax_t.invert_yaxis()
    ax_t.set_ylabel("sweep point")
    handles = [Patch(facecolor="#55A868", label="intra-node (NVLink / PCIe)"),
               Patch(facecolor="#C44E52", label="network (NICs)")]
    if any_worst:
        handles.append(Line2D([], [], marker="D", color="black", linestyle="none",
                              markersize=4, label="worst step, total"))
    handles += [Patch(facecolor="#8172B3", label="static: params, grads, optimizer state"),
                Patch(facecolor="#CCB9E8", label="transient buffers at the peak")]
    if nb > 1:
        for b, backend in enumerate(sweep.backends):
            handles.append(Patch(facecolor="#DDDDDD", hatch=hatches[b % len(hatches)],
                                 edgecolor="#444444", linewidth=0, label=f"backend {backend}"))
    ax_m.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                frameon=False)
    models = sorted({str(get(r.doc, "traffic.model") or "?") for r in sweep.records})
    fig.suptitle(f"{name}: traffic per step by link class and peak memory per rank",
                 fontsize=11.5)
    p.footer(fig, sweep, "traffic model: " + "/".join(models))
    p.save(fig, f"{name}-traffic")


# ---- 2. Scaling ----------------------------------------------------------------------------------

def size_key(key):
    return key.startswith("mesh") or key.startswith("cluster") or "nodes" in key or \
        "world" in key


def scaling_series(sweep, backend):
    """{series label: [(world, record)]} when some series has >1 distinct world size."""
    other = [k for k in sweep.varying if not size_key(k)]
    series = {}
    for label in sweep.labels:
        r = sweep.record(label, backend)
        if r is None:
            continue
        params = dict(r.params)
        key = ", ".join(short_value(params.get(k, "?")) for k in other) or r.strategy or "all"
        series.setdefault(key, []).append((r.world, r))
    good = {}
    for k, pts in series.items():
        worlds = [w for w, _ in pts]
        if len(set(worlds)) > 1 and len(set(worlds)) == len(worlds):
            good[k] = sorted(pts, key=lambda x: x[0])
    return good


def plot_scaling(p, sweep, name):
    from matplotlib.ticker import FixedLocator, NullLocator
    fig = p.new_figure(15, 5.2)
    ax_t, ax_p, ax_c = fig.subplots(1, 3)
    markers = "osD^vP*X"
    styles = ["-", "--", ":", "-."]
    all_t = [max(num(r.doc, "step.average_s"), num(r.doc, "step.worst_s"))
             for r in sweep.records]
    scale, unit = time_unit(max(all_t))
    pscale, pprefix = count_unit(max(aw(r.doc, "throughput.params_per_s_per_gpu")[0]
                                     for r in sweep.records))
    worlds = set()
    any_worst = False
    for b, backend in enumerate(sweep.backends):
        for s, (key, pts) in enumerate(sorted(scaling_series(sweep, backend).items())):
            color = BACKEND_COLORS[s % len(BACKEND_COLORS)]
            ls = styles[b % len(styles)]
            lab = key + (f" [{backend}]" if len(sweep.backends) > 1 else "")
            xs = [w for w, _ in pts]
            worlds.update(xs)
            avg = [num(r.doc, "step.average_s") * scale for _, r in pts]
            worst = [num(r.doc, "step.worst_s") * scale for _, r in pts]
            ax_t.plot(xs, avg, ls, marker=markers[b % len(markers)], color=color, label=lab)
            if any(differ(a, w) for a, w in zip(avg, worst)):
                any_worst = True
                ax_t.plot(xs, worst, ls, marker=markers[b % len(markers)], color=color,
                          alpha=0.45, mfc="white", label=lab + " (worst step)")
            pa = [tuple(x / pscale for x in aw(r.doc, "throughput.params_per_s_per_gpu"))
                  for _, r in pts]
            ax_p.plot(xs, [a for a, _ in pa], ls, marker=markers[b % len(markers)], color=color,
                      label=lab + " avg")
            if any(differ(a, w) for a, w in pa):
                ax_p.plot(xs, [w for _, w in pa], ls, marker=markers[b % len(markers)],
                          color=color, alpha=0.45, mfc="white", label=lab + " worst")
            comp = [aw(r.doc, "throughput.computation.time_s")[0] * scale for _, r in pts]
            expo = [aw(r.doc, "throughput.communication.exposed_time_s")[0] * scale
                    for _, r in pts]
            # Here backends differ by marker; computation solid, exposed communication dashed.
            ax_c.plot(xs, comp, "-", marker=markers[b % len(markers)], color=color,
                      label=lab + ": computation")
            ax_c.plot(xs, expo, "--", marker=markers[b % len(markers)], color=color,
                      mfc="white", label=lab + ": exposed communication")
    # T_bound (core/bound.hpp) as a line: it depends on the model, mesh and cluster, not on the
    # schedule, so one line per world size (the lowest bound recorded there, a bound every
    # series must stay above).
    bounds = {}
    for r in sweep.records:
        b_s = num(r.doc, "bound.step_s")
        if b_s > 0:
            bounds[r.world] = min(bounds.get(r.world, b_s), b_s)
    if len(bounds) > 1:
        xs = sorted(bounds)
        ax_t.plot(xs, [bounds[x] * scale for x in xs], "-", color="black", linewidth=2.2,
                  alpha=0.55, label="T_bound (lower bound)")
    ticks = sorted(worlds)
    for ax in (ax_t, ax_p, ax_c):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("GPUs (world size, log₂ scale)")
        ax.set_yscale("log")
        readable_log_ticks(ax)
        ax.grid(True, which="both", color="#e6e6e6", linewidth=0.6)
        entries = len(ax.get_legend_handles_labels()[0])
        if entries <= 4:
            ax.legend(fontsize=7, framealpha=0.92)
        else:  # many lines: below the panel, where it cannot hide them
            ax.legend(fontsize=7, framealpha=0.92, loc="upper center",
                      bbox_to_anchor=(0.5, -0.16), ncol=2 if entries > 6 else 1)
            fig.set_figheight(max(fig.get_figheight(), 5.2 + 0.09 * entries))
    ax_t.set_ylabel(f"step time ({unit}, log scale)")
    ax_t.set_title("step time (solid: average, faded: worst step)" if any_worst else
                   "step time (every step alike)", fontsize=10)
    ax_p.set_ylabel(f"{pprefix or ''}params updated per second per GPU (log scale)".replace(
        "Gparams", "billion params").replace("Mparams", "million params"))
    ax_p.set_title("per-GPU throughput (average and worst step)" if any_worst else
                   "per-GPU throughput", fontsize=10)
    ax_c.set_ylabel(f"time per GPU per average step ({unit}, log scale)")
    ax_c.set_title("computation (solid) vs exposed communication (dashed),\nmeans over GPUs",
                   fontsize=10)
    fig.suptitle(f"{name}: scaling with GPU count, one line per strategy", fontsize=11.5)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-scaling")


def readable_log_ticks(ax):
    """Plain numbers (0.5, 2, 10) instead of powers of ten on a log axis, with labelled minor
    ticks (2, 5) when the data spans less than two decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.figure.canvas.draw_idle()
    lo, hi = ax.dataLim.intervaly
    if lo <= 0 or hi <= 0:
        return
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    if hi / lo < 100:
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(fmt)
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


# ---- 3. Per-rank breakdown -----------------------------------------------------------------------

def rank_parts(rank, which):
    b = rank.get(which) or {}
    compute = num(b, "compute_s")
    comm = num(b, "communication_s")
    exposed = num(b, "exposed_comm_s")
    overlapped = max(0.0, min(comm - exposed, compute))
    return {"compute_only": max(0.0, compute - overlapped), "overlapped": overlapped,
            "exposed": max(0.0, exposed), "idle": max(0.0, num(b, "idle_s"))}


def representative_ranks(ranks, which):
    """Ranks to show: all up to RANKS_SHOWN_IN_FULL; else those with the least, median and most
    busy time (compute + exposed communication), and the mean over all ranks."""
    if len(ranks) <= RANKS_SHOWN_IN_FULL:
        return [(str(int(num(r, "rank", i))), rank_parts(r, which)) for i, r in enumerate(ranks)]
    busy = sorted(range(len(ranks)), key=lambda i: (
        num(ranks[i].get(which) or {}, "compute_s") +
        num(ranks[i].get(which) or {}, "exposed_comm_s"), i))
    picks = [("least busy", busy[0]), ("median", busy[len(busy) // 2]), ("most busy", busy[-1])]
    out = [(f"rank {int(num(ranks[i], 'rank', i))}\n{what}", rank_parts(ranks[i], which))
           for what, i in picks]
    allp = [rank_parts(r, which) for r in ranks]
    out.append((f"mean of\n{len(ranks)} ranks",
                {k: sum(x[k] for x in allp) / len(allp) for k, _, _ in COMPONENTS}))
    return out


def plot_ranks(p, sweep, name, backend, which):
    """One panel per sweep point, each with its own time axis: the question is how balanced the
    ranks of one point are (the strategy plot compares points)."""
    from matplotlib.patches import Patch
    recs = [(l, sweep.record(l, backend)) for l in sweep.labels]
    recs = [(l, r) for l, r in recs if r is not None and r.doc.get("ranks")]
    if which == "worst":  # only the points whose worst step is not their average step
        recs = [(l, r) for l, r in recs
                if differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))]
    if not recs:
        return
    n = len(recs)
    ncols = 1 if n == 1 else (2 if n <= 4 else 3)
    maxr = max(min(len(r.doc["ranks"]), RANKS_SHOWN_IN_FULL + 1) for _, r in recs)
    if maxr > RANKS_SHOWN_IN_FULL:
        ncols = min(n, 4)
        maxr = 4
    nrows = math.ceil(n / ncols)
    spare = nrows * ncols > n  # an empty panel slot takes the legend
    width = min(17.0, (0 if spare else 3.2) + 1.0 + ncols * max(3.4, 0.17 * maxr + 1.6))
    height = min(16.0, 1.4 + 2.9 * nrows)
    fig = p.new_figure(width, height)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    big = False
    for idx, (label, r) in enumerate(recs):
        ax = axes[idx // ncols][idx % ncols]
        shown = representative_ranks(r.doc["ranks"], which)
        big = big or len(r.doc["ranks"]) > RANKS_SHOWN_IN_FULL
        step_s = num(r.doc, "step.average_s" if which == "average" else "step.worst_s")
        tmax = max([sum(parts.values()) for _, parts in shown] + [step_s])
        scale, unit = time_unit(tmax or 1e-3)
        xs = list(range(len(shown)))
        bottom = [0.0] * len(shown)
        for key, _, color in COMPONENTS:
            vals = [parts[key] * scale for _, parts in shown]
            ax.bar(xs, vals, bottom=bottom, color=color, width=0.8, edgecolor="white",
                   linewidth=0.3)
            bottom = [a + b for a, b in zip(bottom, vals)]
        ax.axhline(step_s * scale, color="black", linewidth=0.8, linestyle="--")
        ax.set_title(f"{sweep.short[label]}  (step {step_s * scale:.3g} {unit})", fontsize=9)
        ax.set_xticks(xs)
        labels = [s for s, _ in shown]
        ax.set_xticklabels(labels, fontsize=7 if len(shown) <= 16 else 6,
                           rotation=0 if len(shown) <= 16 or "\n" in labels[0] else 90)
        ax.set_xlim(-0.6, len(shown) - 0.4)
        ax.set_ylim(0, tmax * scale * 1.06 if tmax else 1)
        ax.set_ylabel(f"time per step ({unit})")
        ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_xlabel("rank" if len(r.doc["ranks"]) <= RANKS_SHOWN_IN_FULL else
                      f"representative ranks of {len(r.doc['ranks'])}")
    handles = [Patch(facecolor=c, label=t) for _, t, c in COMPONENTS]
    handles.append(self_line("step time (slowest rank)"))
    for idx in range(n, nrows * ncols):
        axes[idx // ncols][idx % ncols].axis("off")
    if spare:
        axes[-1][-1].legend(handles=handles, loc="center", fontsize=8, frameon=False)
    else:
        axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           fontsize=7.5, frameon=False)
    what = "average step" if which == "average" else \
        "worst step (points whose worst step differs from the average)"
    agg = (f"\n(meshes over {RANKS_SHOWN_IN_FULL} ranks: the least busy, median and most busy "
           f"rank by compute + exposed communication, and the mean)" if big else "")
    fig.suptitle(f"{name}: per-rank breakdown of the {what}, backend {backend}{agg}",
                 fontsize=11)
    p.footer(fig, sweep)
    suffix = "" if which == "average" else "-worst"
    p.save(fig, f"{name}-ranks-{backend}{suffix}")


def self_line(label):
    from matplotlib.lines import Line2D
    return Line2D([0], [0], color="black", linewidth=0.8, linestyle="--", label=label)


# ---- 4. Timeline ---------------------------------------------------------------------------------

def op_kind(event):
    """The plan op kind of a trace event: "wait" for waiting spans (cat "wait", the simulator's
    time between a member's arrival at a collective and its start), else args.kind or cat when
    they name a kind, else the first kind named in the event's name."""
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    name = str(event.get("name", "")).lower()
    if str(event.get("cat", "")).lower() == "wait" or name.startswith("wait"):
        return "wait"
    for cand in (args.get("kind"), event.get("cat")):
        if isinstance(cand, str) and cand in KIND_COLORS:
            return cand
    for kind in sorted(COMPUTE_KINDS + COMM_KINDS, key=len, reverse=True):
        if kind in name:
            return kind
    if re.search(r"\bns\b|newton", name):
        return "newton_schulz"
    cat = str(event.get("cat", "")).lower()
    if "collective" in cat or "comm" in cat or "nccl" in cat:
        return "collective"
    if "compute" in cat:
        return "compute"
    return "other"


class Trace:
    """A Chrome trace of one step: complete spans (ph X, or B/E pairs) per row, where a row is one
    (pid, tid) pair, i.e. one stream of one rank. A row's rank comes from its thread name
    ("rank 3 compute", the simulator's layout: pid = node, tid = rank x streams + stream), else
    its process name ("rank 3"), else its pid."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
        self.other = doc.get("otherData", {}) if isinstance(doc, dict) else {}
        if not isinstance(self.other, dict):
            self.other = {}
        self.pname, self.tname, self.spans = {}, {}, []
        open_b = {}
        for e in events:
            if not isinstance(e, dict):
                continue
            ph = e.get("ph")
            key = (e.get("pid", 0), e.get("tid", 0))
            try:
                if ph == "M":
                    nm = get(e, "args.name")
                    if e.get("name") == "process_name" and nm is not None:
                        self.pname[key[0]] = str(nm)
                    elif e.get("name") == "thread_name" and nm is not None:
                        self.tname[key] = str(nm)
                elif ph == "X":
                    self.spans.append((key, float(e.get("ts", 0)), float(e.get("dur", 0)),
                                       op_kind(e)))
                elif ph == "B":
                    open_b.setdefault(key, []).append(e)
                elif ph == "E" and open_b.get(key):
                    b = open_b[key].pop()
                    self.spans.append((key, float(b.get("ts", 0)),
                                       float(e.get("ts", 0)) - float(b.get("ts", 0)), op_kind(b)))
            except (TypeError, ValueError):
                continue

    def rank_of(self, key):
        for text in (self.tname.get(key), self.pname.get(key[0])):
            m = re.search(r"rank\s*(\d+)", text or "")
            if m:
                return int(m.group(1))
        return key[0]

    def row_label(self, key):
        t = self.tname.get(key)
        if t and re.search(r"rank\s*\d+", t):
            return re.sub(r"(rank\s*\d+)\s+", r"\1 · ", t, count=1)
        p = self.pname.get(key[0], f"rank {key[0]}")
        return f"{p} · {t if t else 'stream ' + str(key[1])}"


def plot_timeline(p, sweep, name, r):
    from matplotlib.patches import Patch
    try:
        tr = Trace(r.trace)
    except (OSError, ValueError) as e:
        print(f"plot: skipped trace {r.trace}: {e}", file=sys.stderr)
        return
    if not tr.spans:
        return
    keys = {k for k, _, _, _ in tr.spans} | set(tr.tname)
    ranks = sorted({tr.rank_of(k) for k in keys}, key=id_key)
    shown = set(ranks[:p.max_ranks])
    rows = sorted((k for k in keys if tr.rank_of(k) in shown),
                  key=lambda k: (id_key(tr.rank_of(k)), id_key(k[0]), id_key(k[1])))
    row_of = {k: i for i, k in enumerate(rows)}
    t0 = min(0.0, min(s[1] for s in tr.spans))
    t1 = max(s[1] + s[2] for s in tr.spans)
    scale, unit = time_unit((t1 - t0) * 1e-6 or 1e-6)
    f = 1e-6 * scale  # trace microseconds -> unit
    height = min(18.0, max(3.8, 1.9 + 0.24 * len(rows)))
    fig = p.new_figure(14, height)
    ax = fig.subplots()
    by_kind = {}
    for key, ts, dur, kind in tr.spans:
        if key in row_of:
            by_kind.setdefault(kind, {}).setdefault(row_of[key], []).append(((ts - t0) * f,
                                                                            dur * f))
    # Waiting first, so the spans of work are drawn over it.
    for kind in sorted(by_kind, key=lambda k: (k != "wait", k)):
        style = kind_style(kind)
        for row, bars in sorted(by_kind[kind].items()):
            ax.broken_barh(bars, (row - 0.4, 0.8), **style)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([tr.row_label(k) for k in rows], fontsize=7 if len(rows) <= 40 else 5.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, (t1 - t0) * f * 1.01)
    ax.set_xlabel(f"time since the step started ({unit})")
    ax.set_ylabel("rank · stream")
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    # Rank boundaries, so the streams of one rank read as a group.
    for i in range(1, len(rows)):
        if tr.rank_of(rows[i]) != tr.rank_of(rows[i - 1]):
            ax.axhline(i - 0.5, color="#999999", linewidth=0.4)
    order = [k for k in COMPUTE_KINDS + ["compute"] + COMM_KINDS + ["collective", "wait",
                                                                     "other"] if k in by_kind]
    handles = [Patch(label=TIMELINE_LABELS.get(k, k.replace("_", " ")), **kind_style(k))
               for k in order]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7.5,
              title="op kind", title_fontsize=8, frameon=False)
    world = int(num(tr.other, "world_size", 0)) or r.world
    cap = (f"first {len(shown)} of {world} ranks" if world > len(shown)
           else f"all {len(shown)} ranks")
    which = ""
    if "step" in tr.other:
        k = int(num(tr.other, "step", 0))
        worst = differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
        which = f" {k}" + (" (the worst)" if worst and k == int(num(r.doc, "step.worst_step"))
                           else "")
    fig.suptitle(f"{name}: timeline of step{which}, {sweep.short[r.label]}, backend "
                 f"{r.backend} ({cap})", fontsize=11)
    p.footer(fig, sweep, "trace: " + os.path.relpath(r.trace, os.path.dirname(
        os.path.dirname(r.trace))))
    p.save(fig, f"{name}-timeline-{r.backend}-{slug(sweep.short[r.label])}")


TIMELINE_LABELS = {"wait": "waiting for peers (collective)", "compute": "compute (other)",
                   "collective": "collective (other)"}


def kind_style(kind):
    if kind == "wait":
        return {"facecolor": "#F2F2F2", "edgecolor": "#AAAAAA", "hatch": "////",
                "linewidth": 0}
    color = KIND_COLORS.get(kind, {"compute": "#08519C", "collective": "#E6550D"}.get(
        kind, "#C7C7C7"))
    return {"facecolor": color, "edgecolor": "none"}


def id_key(x):
    return (0, x, "") if isinstance(x, (int, float)) else (1, 0, natural_key(str(x)))


# ---- 5. Claims -----------------------------------------------------------------------------------

def load_claims(sweep, root, claims_file):
    """Claims about this experiment, from (first found): --claims FILE, a "claims" list in the
    results JSON, a "claims" key in the resolved configuration, or claims.{yaml,json} /
    seed_claims.yaml in the results folder or next to the experiment file. Each claim is a map:
      {name, baseline: <point selector>, target: <point selector>, speedup: 8 | [16, 24] |
       "16-24", metric: average|worst, backend: optional, source: text, tolerance: 0.2,
       experiment: optional name filter}
    A point selector is a label fragment ("strategy.name=owner") or a map of sweep keys."""
    def from_doc(doc):
        if isinstance(doc, dict):
            for key in ("claims", "seed_claims"):
                if isinstance(doc.get(key), list):
                    return doc[key]
            exp = sweep.records[0].experiment
            if isinstance(doc.get(exp), (list, dict)):  # {experiment: [claims]} layout
                sub = doc[exp]
                return sub if isinstance(sub, list) else from_doc(sub)
            if isinstance(doc.get("experiments"), dict) and exp in doc["experiments"]:
                return from_doc({"claims": doc["experiments"][exp]}) or \
                    from_doc(doc["experiments"][exp])
        if isinstance(doc, list):
            return doc
        return None

    def read(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".json"):
            return json.loads(text)
        if yaml is None:
            print(f"plot: PyYAML is missing; cannot read claims in {path}", file=sys.stderr)
            return None
        return yaml.safe_load(text)

    if claims_file:
        return from_doc(read(claims_file)) or [], claims_file
    for r in sweep.records:
        c = from_doc({"claims": r.doc["claims"]}) if isinstance(r.doc.get("claims"), list) \
            else None
        if c:
            return c, os.path.basename(r.path)
    if yaml is not None:
        for r in sweep.records:
            text = get(r.doc, "provenance.resolved_config")
            if isinstance(text, str) and "claims" in text:
                try:
                    c = from_doc(yaml.safe_load(text))
                except Exception:
                    c = None
                if c and c is not None and isinstance(c, list):
                    return c, "resolved config"
    dirs = [root]
    f = get(sweep.records[0].doc, "provenance.experiment_file")
    if f:
        dirs.append(os.path.dirname(f) or ".")
    for d in dirs:
        for n in ("claims.json", "claims.yaml", "seed_claims.yaml", "seed_claims.json"):
            path = os.path.join(d, n)
            if os.path.isfile(path):
                try:
                    c = from_doc(read(path))
                except Exception as e:
                    print(f"plot: cannot read claims {path}: {e}", file=sys.stderr)
                    c = None
                if c:
                    return c, path
    return [], None


def select(sweep, selector, backend):
    """Records of `backend` matching a point selector (label fragment or map)."""
    if isinstance(selector, dict):
        want = [(str(k), norm_value(v)) for k, v in selector.items()]
    else:
        want = [(k, norm_text(v)) for k, v in split_label(str(selector))]
    out = []
    for label in sweep.labels:
        r = sweep.record(label, backend)
        if r is None:
            continue
        params = {k: norm_text(v) for k, v in r.params}
        ok = True
        for k, v in want:
            if k in params:
                ok = ok and params[k] == v
            elif k in ("strategy", "strategy.name"):
                ok = ok and norm_text(r.strategy) == v
            else:
                ok = False
        if ok:
            out.append(r)
    return out


def claimed_range(value, tolerance):
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return float(value[0]), float(value[1])
    if isinstance(value, str):
        m = re.match(r"^\s*~?\s*([\d.]+)\s*(?:x|×)?\s*(?:-|–|to)\s*([\d.]+)", value)
        if m:
            return float(m.group(1)), float(m.group(2))
        m = re.match(r"^\s*~?\s*([\d.]+)", value)
        if m:
            value = float(m.group(1))
    v = float(value)
    return v / (1 + tolerance), v * (1 + tolerance)


def evaluate_claims(sweep, claims):
    rows = []
    for i, c in enumerate(claims):
        if not isinstance(c, dict):
            continue
        exp = c.get("experiment")
        if exp and exp != sweep.records[0].experiment:
            continue
        name = str(c.get("name") or c.get("claim") or c.get("id") or f"claim {i + 1}")
        source = str(c.get("source") or "")
        metric = str(c.get("metric") or "average")
        claimed = c.get("speedup", c.get("claimed", c.get("claimed_speedup")))
        base_sel = c.get("baseline")
        target_sel = c.get("target", c.get("candidate", c.get("point")))
        if claimed is None or base_sel is None or target_sel is None:
            rows.append((name, source, "-", "-", str(claimed), "-", "incomplete claim"))
            continue
        try:
            lo, hi = claimed_range(claimed, float(c.get("tolerance", CLAIM_TOLERANCE)))
        except (TypeError, ValueError):
            rows.append((name, source, "-", "-", str(claimed), "-", "unreadable claim"))
            continue
        backends = [c["backend"]] if c.get("backend") else sweep.backends
        for backend in backends:
            base = select(sweep, base_sel, backend)
            target = select(sweep, target_sel, backend)
            if len(base) != 1 or len(target) != 1:
                rows.append((name, source, backend, "-", fmt_claim(claimed), "-",
                             f"selector matched {len(base)} baseline / {len(target)} target "
                             f"points"))
                continue
            key = "step.worst_s" if metric == "worst" else "step.average_s"
            tb, tt = num(base[0].doc, key), num(target[0].doc, key)
            pred = tb / tt if tt > 0 else float("nan")
            verdict = ("holds" if lo <= pred <= hi else
                       ("predicted below claim" if pred < lo else "predicted above claim"))
            rows.append((name, source, backend,
                         f"{sweep.short[base[0].label]} → {sweep.short[target[0].label]}",
                         fmt_claim(claimed), f"{pred:.3g}×", verdict))
    return rows


def strategy_config(record):
    """(strategy name, prefetch_count) of a record, from its resolved configuration (the point
    label's spelling is up to the experiment file); prefetch -1 when not stated."""
    name, prefetch = record.strategy, -1
    text = get(record.doc, "provenance.resolved_config")
    if not isinstance(text, str) or not text:
        return name, prefetch
    strategy = None
    if yaml is not None:
        try:
            doc = yaml.safe_load(text)
            strategy = doc.get("strategy") if isinstance(doc, dict) else None
        except Exception:
            strategy = None
    if isinstance(strategy, dict):
        name = str(strategy.get("name", name))
        try:
            prefetch = int(strategy.get("prefetch_count", -1))
        except (TypeError, ValueError):
            pass
    else:  # without PyYAML: the first prefetch_count anywhere in the text
        m = re.search(r"prefetch_count:\s*(\d+)", text)
        prefetch = int(m.group(1)) if m else -1
    return name, prefetch


def seed000_rows(sweep):
    """Seed 000's speedup claims on one node, checked as sim/run_point.cpp's seed_claims_table
    does: points are "sequential" (strategy sequential), "parallel" (owner, prefetch_count 0) and
    "prefetch" (owner, prefetch_count >= 2). Rows only when a backend has two of the three."""
    rows = []
    for backend in sweep.backends:
        found = {}
        for label in sweep.labels:
            r = sweep.record(label, backend)
            if r is None:
                continue
            name, prefetch = strategy_config(r)
            variant = ("sequential" if name == "sequential" else
                       "parallel" if name == "owner" and prefetch == 0 else
                       "prefetch" if name == "owner" and prefetch >= 2 else None)
            if variant and variant not in found:
                found[variant] = r
        if len(found) < 2:
            continue
        world = next(iter(found.values())).world
        for what, claimed, base, target in (
                (f"parallel owner vs sequential (~N×, N = {world} GPUs)", world, "sequential",
                 "parallel"),
                ("prefetch 2 on top of parallel owner", [2, 3], "parallel", "prefetch"),
                ("prefetch 2 vs sequential, total (on 8 GPUs)", [16, 24], "sequential",
                 "prefetch")):
            if base not in found or target not in found:
                rows.append((what, "seed 000", backend, f"{base} → {target}",
                             fmt_claim(claimed), "-", "point missing"))
                continue
            lo, hi = claimed_range(claimed, CLAIM_TOLERANCE)
            tb = num(found[base].doc, "step.average_s")
            tt = num(found[target].doc, "step.average_s")
            pred = tb / tt if tt > 0 else float("nan")
            verdict = ("holds" if lo <= pred <= hi else
                       ("predicted below claim" if pred < lo else "predicted above claim"))
            rows.append((what, "seed 000", backend,
                         f"{sweep.short[found[base].label]} → {sweep.short[found[target].label]}",
                         fmt_claim(claimed), f"{pred:.3g}×", verdict))
    return rows


def fmt_claim(v, tolerance=CLAIM_TOLERANCE):
    """A claimed value as shown: a range as is, a single number with the tolerance it is
    checked with."""
    if isinstance(v, (list, tuple)):
        return f"{v[0]}–{v[1]}×"
    if isinstance(v, (int, float)):
        return f"{v:g}× ±{tolerance * 100:g} %"
    return str(v)


def plot_claims(p, sweep, name, rows, source):
    header = ("claim", "source", "backend", "baseline → target", "claimed", "predicted",
              "verdict")
    widths = [max(len(str(x[i])) for x in rows + [header]) for i in range(len(header))]
    print(f"\nclaims vs predicted ({name}, claims from {source}):")
    for row in [header] + rows:
        print("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
    print()
    import textwrap

    def wrap(text, n):
        # At word boundaries; "A → B" breaks before the arrow.
        return "\n".join(textwrap.fill(part, n, break_long_words=False)
                         for part in text.replace(" → ", "\n→ ").split("\n"))
    cells = [[wrap(str(x), 44) for x in row] for row in rows]
    lines = [max(c.count("\n") + 1 for c in row) for row in cells]
    height = min(14.0, 1.3 + 0.3 * (sum(lines) + 1))
    fig = p.new_figure(12, height)
    ax = fig.subplots()
    ax.axis("off")
    # Column widths from the longest line of each column (in characters).
    chars = [max(len(line) for c in [header[j]] + [row[j] for row in cells]
                 for line in str(c).split("\n")) + 2 for j in range(len(header))]
    table = ax.table(cellText=cells, colLabels=header, cellLoc="left", colLoc="left",
                     colWidths=[c / sum(chars) for c in chars], bbox=[0, 0, 1, 1])
    table.auto_set_font_size(False)
    table.set_fontsize(8.5)
    colors = {"holds": "#D9F0D3", "predicted below claim": "#F8D3D3",
              "predicted above claim": "#FFF2CC"}
    total = sum(lines) + 1
    for (i, j), cell in table.get_celld().items():
        cell.set_height((lines[i - 1] if i > 0 else 1) / total)
        if i == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#EEEEEE")
        elif j == len(header) - 1:
            cell.set_facecolor(colors.get(rows[i - 1][-1], "white"))
    fig.suptitle(f"{name}: claimed vs predicted speedups (step-time ratio baseline / target)",
                 fontsize=11.5)
    p.footer(fig, sweep, "claims: " + os.path.basename(str(source)))
    p.save(fig, f"{name}-claims")


# ---- Driver --------------------------------------------------------------------------------------

def plot_experiment(p, records, root, claims_file):
    sweep = Sweep(records)
    name = records[0].experiment
    plot_strategies(p, sweep, name)
    plot_throughput(p, sweep, name)
    plot_traffic(p, sweep, name)
    if any(scaling_series(sweep, b) for b in sweep.backends):
        plot_scaling(p, sweep, name)
    for backend in sweep.backends:
        plot_ranks(p, sweep, name, backend, "average")
        recs = [r for r in records if r.backend == backend]
        if any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s")) for r in recs):
            plot_ranks(p, sweep, name, backend, "worst")
    for label in sweep.labels:
        for backend in sweep.backends:
            r = sweep.record(label, backend)
            if r is not None and r.trace:
                plot_timeline(p, sweep, name, r)
    claims, source = load_claims(sweep, root, claims_file)
    rows = evaluate_claims(sweep, claims) if claims else []
    sources = [os.path.basename(str(source))] if rows else []
    seed = seed000_rows(sweep)
    if seed:
        rows += seed
        sources.append("seed 000 (built in)")
    if rows:
        plot_claims(p, sweep, name, rows, " + ".join(sources))


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
    args = ap.parse_args(argv)

    formats = [f.strip().lower().lstrip(".") for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in ("png", "pdf", "svg")]
    if bad or not formats:
        print(f"plot: error: unsupported format(s) {bad or args.formats!r}; use png, pdf or svg",
              file=sys.stderr)
        return 2
    if not os.path.isdir(args.results_dir):
        print(f"plot: error: '{args.results_dir}' is not a folder; pass the experiment's "
              f"output folder (the `output:` of its YAML)", file=sys.stderr)
        return 2
    if args.claims and not os.path.isfile(args.claims):
        print(f"plot: error: claims file '{args.claims}' not found", file=sys.stderr)
        return 2
    if args.max_ranks < 1:
        print("plot: error: --max-ranks must be at least 1", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print(f"plot: matplotlib is not available to {sys.executable} ({e}); no plots written. "
              f"Fix: run with /usr/bin/python3 after `apt-get install python3-matplotlib`.")
        return 0
    setup_style(matplotlib)

    records = load_dir(args.results_dir)
    if not records:
        print(f"plot: no results JSON under '{args.results_dir}' (files with \"schema_version\" "
              f"and \"step\"); run `muonbed run EXPERIMENT.yaml` first", file=sys.stderr)
        return 1
    out = args.out or args.results_dir
    p = Plotter(plt, out, formats, args.max_ranks)
    by_exp = {}
    for r in records:
        by_exp.setdefault(r.experiment, []).append(r)
    for exp in sorted(by_exp):
        plot_experiment(p, by_exp[exp], args.results_dir, args.claims)
    print(f"plot: read {len(records)} result file(s) of {len(by_exp)} experiment(s); "
          f"wrote {len(p.written)} file(s):")
    for path in p.written:
        print(f"  {path}")
    return 0


def setup_style(matplotlib):
    rc = matplotlib.rcParams
    rc["font.family"] = "DejaVu Sans"
    rc["font.size"] = 9
    rc["axes.titlesize"] = 10
    rc["axes.labelsize"] = 9
    rc["figure.dpi"] = 100
    rc["savefig.dpi"] = 150
    rc["pdf.fonttype"] = 42  # TrueType in PDFs, editable and searchable text
    rc["svg.hashsalt"] = "muonbed"
    rc["hatch.linewidth"] = 0.6
    rc["axes.spines.top"] = False
    rc["axes.spines.right"] = False


if __name__ == "__main__":
    sys.exit(main())
