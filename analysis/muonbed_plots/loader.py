"""Reading one results folder, trusting only what proves it belongs to the run: the
muonbed-run.json manifest `muonbed run` writes (the current sweep's result files, each with its
point identity), a SHA-256 checksum over each result file's content (core/results/results.hpp, schema 2),
and every field the plots read present, of the right type and finite. A file that fails is
excluded with its reason on stderr, and the figures' footers say how many were; nothing is drawn
from a NaN, a string or a hand-edited number."""

import hashlib
import json
import math
import os
import re
import sys

from .common import SCHEMA_VERSION, get, split_label

MANIFEST = "muonbed-run.json"
MAX_JSON_BYTES = 256 << 20  # result and trace files are far smaller; a bigger one is no result
CHECKSUM = re.compile(rb'"checksum": "([0-9a-f]{64})"[\s}]*\Z')


class LoadError(Exception):
    """Why a file cannot be used (the message is shown after the file's path)."""


class FolderError(Exception):
    """Why the folder as a whole cannot be plotted (a damaged or foreign manifest)."""


class Record:
    """One verified results JSON (one sweep point, one backend)."""

    def __init__(self, path, doc):
        self.path = path
        self.doc = doc
        self.backend = doc["backend"]
        self.fidelity = doc["fidelity"]
        self.experiment = doc["provenance"]["experiment"] or "results"
        self.label = doc["provenance"]["point"]
        self.point_id = doc["provenance"]["point_id"]
        self.params = split_label(self.label)
        self.trace = None  # path of this point's trace JSON, when found
        self.world = int(doc["setup"]["world_size"])
        self.strategy = doc["setup"]["strategy"]

    def value(self, key):
        for k, v in self.params:
            if k == key:
                return v
        return None


class Loaded:
    """What load_dir found: the records to plot, and the files left out with their reasons."""

    def __init__(self):
        self.records = []
        self.excluded = []     # (path, reason)
        self.unlisted = 0      # JSON files the manifest does not list
        self.manifest = None   # the manifest's document, when there is one
        self.warnings = []


# ---- Files ---------------------------------------------------------------------------------------

def read_json(path):
    """(document, raw bytes) of a JSON file, or LoadError saying why not."""
    if not os.path.isfile(path):  # a FIFO or device would block or never end
        raise LoadError("not a regular file")
    try:
        size = os.path.getsize(path)
        if size > MAX_JSON_BYTES:
            raise LoadError(f"{size} bytes, larger than any results file ({MAX_JSON_BYTES} max)")
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise LoadError(f"cannot read it: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise LoadError("not UTF-8 text (binary data?)") from None
    try:
        return json.loads(text), raw
    except (ValueError, RecursionError) as e:
        raise LoadError(f"not valid JSON ({str(e)[:120]})") from None


def verify_checksum(raw):
    """True when the bytes end with a checksum field matching the rest of them (the value is the
    SHA-256 of the file with the value left empty, as core/results/src/results.cpp writes it)."""
    m = CHECKSUM.search(raw)
    if not m:
        return False
    blank = raw[:m.start(1)] + raw[m.end(1):]
    return hashlib.sha256(blank).hexdigest() == m.group(1).decode("ascii")


def is_result(doc):
    return isinstance(doc, dict) and "step" in doc and ("schema_version" in doc or
                                                        "setup" in doc)


def is_trace(doc):
    """Chrome trace-event JSON: {"traceEvents": [...]} or a bare list of events with "ph"."""
    if isinstance(doc, dict):
        return isinstance(doc.get("traceEvents"), list)
    return isinstance(doc, list) and any(isinstance(e, dict) and "ph" in e for e in doc[:200])


# ---- Validation of a result's fields -------------------------------------------------------------

STRINGS = ["backend", "fidelity", "timestamp", "provenance.experiment", "provenance.point",
           "provenance.point_id", "provenance.resolved_config", "setup.strategy",
           "setup.cluster", "setup.model", "traffic.model"]
NUMBERS = ["step.average_s", "step.worst_s", "setup.params"] + [
    f"{path}.{which}" for path in (
        "throughput.params_per_s_per_gpu", "throughput.computation.time_s",
        "throughput.computation.tflops_per_gpu", "throughput.computation.utilization",
        "throughput.communication.time_s", "throughput.communication.exposed_time_s",
        "throughput.communication.GBps_per_gpu", "traffic.intra_node_bytes",
        "traffic.network_bytes") for which in ("average", "worst")]
INTEGERS = ["step.worst_step", "setup.world_size", "setup.gpus_per_node", "setup.hyper_period"]
RANK_NUMBERS = ["bytes_sent", "bytes_received", "memory.static_bytes",
                "memory.peak_transient_bytes", "memory.peak_bytes"] + [
    f"{which}.{key}" for which in ("average", "worst")
    for key in ("compute_s", "communication_s", "exposed_comm_s", "idle_s", "finish_s")]


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_number(doc, path, where=""):
    v = get(doc, path)
    if not is_number(v):
        shown = "missing" if v is None else repr(v)[:60]
        raise LoadError(f"{where}{path} is {shown}, not a finite number")
    if v < 0:
        raise LoadError(f"{where}{path} is {v}, negative")


def validate(doc):
    """Raises LoadError naming the first field the plots read that is missing, mistyped,
    negative or not finite."""
    for path in STRINGS:
        if not isinstance(get(doc, path), str):
            raise LoadError(f"{path} is {repr(get(doc, path))[:60]}, not a string")
    for path in NUMBERS:
        check_number(doc, path)
    for path in INTEGERS:
        v = get(doc, path)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise LoadError(f"{path} is {repr(v)[:60]}, not a whole number")
    if doc["setup"]["world_size"] < 1:
        raise LoadError("setup.world_size is below 1")
    ranks = doc.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != doc["setup"]["world_size"]:
        raise LoadError("ranks is not a list of one entry per rank (setup.world_size)")
    for i, rank in enumerate(ranks):
        if not isinstance(rank, dict):
            raise LoadError(f"ranks[{i}] is not an object")
        for path in RANK_NUMBERS:
            check_number(rank, path, f"ranks[{i}].")
    if not isinstance(doc.get("notes"), list):
        raise LoadError("notes is not a list")


def load_result(path, raw, doc):
    """A Record from a parsed file, or LoadError: schema, checksum, then every field."""
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise LoadError(f"schema_version {version!r}, this script reads {SCHEMA_VERSION} "
                        f"(rerun the experiment with this muonbed)")
    if not verify_checksum(raw):
        raise LoadError("its checksum does not match its content: edited or damaged after "
                        "muonbed wrote it (rerun the point; never edit result files by hand)")
    validate(doc)
    return Record(path, doc)


# ---- The manifest --------------------------------------------------------------------------------

def inside(root, rel):
    """root/rel when rel is a relative path that stays inside root, else None."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or "\0" in rel:
        return None
    path = os.path.normpath(os.path.join(root, rel))
    base = os.path.normpath(root)
    return path if os.path.commonpath([base, path]) == base and path != base else None


def read_manifest(root):
    """The manifest's document with its entries checked, None without one, FolderError when it
    cannot be trusted (then nothing can be told apart: refusing beats plotting a mix)."""
    path = os.path.join(root, MANIFEST)
    if not os.path.lexists(path):
        return None
    fix = f"rerun `muonbed run EXPERIMENT.yaml` (finished points are kept) to rewrite it"
    try:
        doc, _ = read_json(path)
    except LoadError as e:
        raise FolderError(f"{path}: {e}; {fix}") from None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list):
        raise FolderError(f"{path} has no list of results; {fix}")
    if doc.get("schema_version") != SCHEMA_VERSION or \
            any(not isinstance(e, dict) for e in results):
        raise FolderError(f"{path} was written by an older muonbed (no point identities); {fix}")
    for i, e in enumerate(results):
        if inside(root, e.get("path")) is None or not isinstance(e.get("point_id"), str):
            raise FolderError(f"{path}: results[{i}] has no usable path (inside the folder) and "
                              f"point_id; {fix}")
    traces = doc.get("traces", [])
    if not isinstance(traces, list) or any(inside(root, t) is None for t in traces):
        raise FolderError(f"{path}: traces is not a list of paths inside the folder; {fix}")
    return doc


def load_dir(root):
    """The verified records under root (recursively, in a stable order): with a manifest, only
    the files it lists and only when each is the point it names; without one, every verified
    result, with a warning that they may come from different configurations."""
    out = Loaded()
    manifest = read_manifest(root)
    out.manifest = manifest
    listed, traces = {}, []
    if manifest is not None:
        for e in manifest["results"]:
            listed[inside(root, e["path"])] = e
        listed_traces = {inside(root, t) for t in manifest.get("traces", [])}
    else:
        out.warnings.append(f"{root} has no {MANIFEST} (written by `muonbed run`): plotting "
                            f"every verified result under it; results of different "
                            f"configurations of the experiment may be mixed")
    seen = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".json") or (
                    os.path.normpath(dirpath) == os.path.normpath(root) and name == MANIFEST):
                continue
            path = os.path.normpath(os.path.join(dirpath, name))
            if manifest is not None and path not in listed and path not in listed_traces:
                out.unlisted += 1
                continue
            seen.add(path)
            try:
                doc, raw = read_json(path)
            except LoadError as e:
                out.excluded.append((path, str(e)))
                continue
            if is_trace(doc):
                traces.append(path)
                continue
            if not is_result(doc):
                if path in listed:
                    out.excluded.append((path, "not a results record"))
                continue
            try:
                record = load_result(path, raw, doc)
                entry = listed.get(path)
                if entry is not None and record.point_id != entry["point_id"]:
                    raise LoadError(
                        f"it is the result of another configuration (point_id {record.point_id}, "
                        f"the sweep's is {entry['point_id']}): replaced after `muonbed run` "
                        f"listed it, by a killed or concurrent run of an edited experiment? "
                        f"Rerun `muonbed run` to bring the folder to one configuration")
                out.records.append(record)
            except LoadError as e:
                out.excluded.append((path, str(e)))
    for path in sorted(set(listed) - seen):
        out.excluded.append((path, f"listed in {MANIFEST} but missing"))
    attach_traces(out.records, traces)
    return out


def report(loaded, root):
    """Prints what was left out (stderr) and why."""
    for w in loaded.warnings:
        print(f"plot: warning: {w}", file=sys.stderr)
    for path, reason in loaded.excluded:
        print(f"plot: warning: not plotted: {path}: {reason}", file=sys.stderr)
    if loaded.unlisted:
        print(f"plot: note: {loaded.unlisted} JSON file(s) under {root} are not in {MANIFEST} "
              f"(points the last `muonbed run` of this folder did not have); not plotted")


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
