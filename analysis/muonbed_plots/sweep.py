"""The sweep model: which keys a sweep varies, the order of its points, short labels for them in
plots, and the marks each point carries (marks.py: backends that disagree, memory exceeded)."""

import json
import os
import re

from .common import get, split_label, yaml
from .marks import (DISAGREE_MARK, INFEASIBLE_MARK, PREDICTED, device_word, disagreements,
                    infeasible)


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
            # Only a small regular file: the path is whatever the run was given (a FIFO or a
            # device would block or never end).
            if os.path.isfile(cand) and os.path.getsize(cand) <= (1 << 20):
                try:
                    with open(cand, encoding="utf-8") as fh:
                        doc = yaml.safe_load(fh.read(1 << 20))
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
    """The points of one experiment and what varies between them. `label_order` (the point
    labels in the experiment's sweep order, from muonbed-run.json) orders the points; without
    it, the experiment file's `sweep:` does when it can be read, else natural order.
    `skipped_infeasible` counts the points left out by --skip-infeasible (said in footers)."""

    def __init__(self, records, label_order=None, skipped_infeasible=0):
        self.records = records
        self.skipped_infeasible = skipped_infeasible
        self.device = device_word(records)  # "GPU", or "rank" for CPU processes
        self.disagree = disagreements(records)
        self.infeasible = infeasible(records)
        # Predictions (marks.PREDICTED) before measurements, each by name: analytic, sim, then
        # cuda_loopback, mpi, nccl.
        self.backends = sorted({r.backend for r in records},
                               key=lambda b: (b not in PREDICTED, b))
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
        if label_order:
            position = {lab: i for i, lab in enumerate(label_order)}
            self.labels = sorted(labels, key=lambda lab: (position.get(lab, len(position)),
                                                          rank(lab)))
        else:
            self.labels = sorted(labels, key=rank)
        self.worlds = sorted({r.world for r in records})
        self.short = {lab: self.short_label(lab) for lab in self.labels}
        if len(self.worlds) > 1:  # the GPU count, when the sweep changes it
            for lab in self.labels:
                r = next(r for r in records if r.label == lab)
                self.short[lab] += f" ({r.world} {self.device}s)"

    def display(self, label):
        """The point's short label with its marks: ⊘ exceeds memory, ≠ backends disagree."""
        marks = [m for m, on in ((INFEASIBLE_MARK, label in self.infeasible),
                                 (DISAGREE_MARK, label in self.disagree)) if on]
        return self.short[label] + (" " + " ".join(marks) if marks else "")

    def marked(self, label):
        return label in self.infeasible or label in self.disagree

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
      '{name: owner, prefetch_count: 2}' -> 'owner, prefetch_count=2' (a map with a name),
      '{preset: seeds, comm_lanes: 128}' -> 'seeds, comm_lanes=128' (a strategy preset),
      '{dims: {dp_shard: 128, ep: 8}}' -> 'dp_shard128×ep8' (a whole mesh),
      '{hf_config: models/Qwen3-30B-A3B/config.json}' -> 'Qwen3-30B-A3B' (the config's folder;
      a file of another name: its stem)."""
    value = str(value).strip()
    dims = re.findall(r"name:\s*([A-Za-z_]\w*)\s*,\s*size:\s*(\d+)", value)
    if dims:
        return "×".join(f"{n}{s}" for n, s in dims)
    if value.startswith("{") and value.endswith("}"):
        pairs = [tuple(x.strip() for x in part.split(":", 1))
                 for part in split_top(value[1:-1]) if ":" in part]
        if len(pairs) == 1 and pairs[0][0] == "dims":
            return short_value(pairs[0][1])
        if len(pairs) == 1 and pairs[0][0] == "hf_config":
            path = pairs[0][1].strip("'\"").rstrip("/")
            parts = [p for p in path.split("/") if p]
            if len(parts) >= 2 and parts[-1] == "config.json":
                return parts[-2]
            return re.sub(r"\.json$", "", parts[-1]) if parts else path
        if pairs and all(re.fullmatch(r"\d+", v) for _, v in pairs):
            return "×".join(f"{k}{v}" for k, v in pairs)
        named = [v for k, v in pairs if k in ("name", "preset")]
        rest = [f"{k}={v}" for k, v in pairs if k not in ("name", "preset")]
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
