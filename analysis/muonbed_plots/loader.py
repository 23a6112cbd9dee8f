"""Reading one results folder, trusting only what proves it belongs to the run: the
muonbed-run.json manifest `muonbed run` writes (the current sweep's result files, each with its
point identity), a SHA-256 checksum over each result file's content (core/results/results.hpp,
schema 2), and every field the plots read present, of the right type and finite. A file that
fails is excluded with its reason on stderr, and the figures' footers say how many were; nothing
is drawn from a NaN, a string or a hand-edited number.

This module is also the package's public API for reading results from Python (analysis/README.md
"Results from Python"): load_results(root) gives one flat dict per verified result file, with the
columns listed in COLUMNS, ready for `pandas.DataFrame(rows)`; load_frame(root) builds that frame
when pandas is installed, and load_rank_rows(root) gives one row per rank of every record."""

import hashlib
import json
import math
import os
import re
import sys

from .common import SCHEMA_VERSION, get, num, split_label
from .marks import is_cpu_record

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
        # Optional blocks (issue 22; files written before them lack them): the memory model's
        # peak against one GPU's memory, and the cross-check against the other backend.
        self.memory = doc.get("memory")              # dict or None
        self.feasible = self.memory["feasible"] if self.memory is not None else None
        self.cross_check = doc.get("cross_check")    # list or None
        self.device = "GPU"                          # "rank" when the ranks are CPU processes

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
    SHA-256 of the file with the value left empty, as core/results/src/result_json.cpp writes
    it)."""
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
        check_whole(doc, path)
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
    validate_optional(doc)


# Blocks added to schema 2 after its first files (issue 22): absent is fine, present must be
# well formed, as every other field.
MEMORY_NUMBERS = ["limit_bytes", "peak_bytes"]
MEMORY_INTEGERS = ["peak_rank", "over_ranks"]


def validate_optional(doc):
    memory = doc.get("memory")
    if memory is not None:
        if not isinstance(memory, dict):
            raise LoadError("memory is not an object")
        if not isinstance(memory.get("model"), str):
            raise LoadError(f"memory.model is {repr(memory.get('model'))[:60]}, not a string")
        for path in MEMORY_NUMBERS:
            check_number(memory, path, "memory.")
        for path in MEMORY_INTEGERS:
            check_whole(memory, path, "memory.")
        if not isinstance(memory.get("feasible"), bool):
            raise LoadError(f"memory.feasible is {repr(memory.get('feasible'))[:60]}, not "
                            f"true or false")
        breakdown = memory.get("breakdown")
        if breakdown is not None:
            if not isinstance(breakdown, dict):
                raise LoadError("memory.breakdown is not an object")
            for part in breakdown:
                check_number(breakdown, part, "memory.breakdown.")
    checks = doc.get("cross_check")
    if checks is not None:
        if not isinstance(checks, list):
            raise LoadError("cross_check is not a list")
        for i, c in enumerate(checks):
            where = f"cross_check[{i}]."
            if not isinstance(c, dict):
                raise LoadError(f"cross_check[{i}] is not an object")
            if not isinstance(c.get("backend"), str):
                raise LoadError(f"{where}backend is {repr(c.get('backend'))[:60]}, not a string")
            if not isinstance(c.get("fidelity", ""), str):  # measured backends may omit it
                raise LoadError(f"{where}fidelity is {repr(c.get('fidelity'))[:60]}, not a "
                                f"string")
            check_number(c, "step_s", where)
            if not is_number(c.get("difference_pct")):  # signed: may be negative
                raise LoadError(f"{where}difference_pct is {repr(c.get('difference_pct'))[:60]}"
                                f", not a finite number")
            if not isinstance(c.get("agree"), bool):
                raise LoadError(f"{where}agree is {repr(c.get('agree'))[:60]}, not true or "
                                f"false")
    if get(doc, "throughput.computation.useful_tflops_per_gpu") is not None:
        for which in ("average", "worst"):
            check_number(doc, f"throughput.computation.useful_tflops_per_gpu.{which}")


def check_whole(doc, path, where=""):
    v = get(doc, path)
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        raise LoadError(f"{where}{path} is {repr(v)[:60]}, not a whole number")


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
            if manifest is not None and path in listed_traces and path not in listed:
                traces.append(path)  # read when its timeline is drawn (tens of MB each)
                continue
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
    cpu_clusters = {}

    def cluster_is_cpu(name, experiment_file):
        if name not in cpu_clusters:
            cpu_clusters[name] = cluster_file_is_cpu(name, experiment_file)
        return cpu_clusters[name]
    for r in out.records:
        experiment_file = str(get(r.doc, "provenance.experiment_file") or "")
        if is_cpu_record(r.doc, lambda name: cluster_is_cpu(name, experiment_file)):
            r.device = "rank"
    return out


REPO_CLUSTERS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "experiments", "clusters")
CPU_GPU_NAME = re.compile(r"^\s*name:\s*[\"']?cpu-rank\b", re.MULTILINE)


def cluster_file_is_cpu(name, experiment_file):
    """Whether the cluster profile a record names (setup.cluster) describes CPU ranks (its gpu
    is named cpu-rank), looked up where muonbed finds clusters by name: clusters/ beside the
    experiment file, then the repository's experiments/clusters/. False when not found."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", name or ""):
        return False
    folders = [os.path.join(os.path.dirname(experiment_file), "clusters")] \
        if experiment_file else []
    for folder in folders + [REPO_CLUSTERS]:
        path = os.path.join(folder, name + ".yaml")
        if os.path.isfile(path) and os.path.getsize(path) <= (1 << 20):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    return bool(CPU_GPU_NAME.search(f.read(1 << 20)))
            except OSError:
                return False
    return False


def report(loaded, root, notes=None, who="plot"):
    """Prints what was left out (stderr) and why; the note on unlisted files goes to `notes`
    (default stdout)."""
    for w in loaded.warnings:
        print(f"{who}: warning: {w}", file=sys.stderr)
    for path, reason in loaded.excluded:
        print(f"{who}: warning: not {'plotted' if who == 'plot' else 'loaded'}: {path}: "
              f"{reason}", file=sys.stderr)
    if loaded.unlisted:
        print(f"{who}: note: {loaded.unlisted} JSON file(s) under {root} are not in {MANIFEST} "
              f"(points the last `muonbed run` of this folder did not have); not "
              f"{'plotted' if who == 'plot' else 'loaded'}", file=notes or sys.stdout)


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


# ---- The public API: results as rows -------------------------------------------------------------

# The columns of load_results' rows, in order, with what each holds. Times in seconds, sizes in
# bytes, rates per GPU (per rank on CPU clusters). None where a record has no such field (older
# files, or a field only some backends write). Each sweep key of the point adds a column
# "sweep.<key>" with its value as the point label gives it (e.g. "sweep.mesh.dp_shard": "16").
COLUMNS = [
    ("experiment", "experiment name (provenance.experiment)"),
    ("point", "the sweep point's label, e.g. 'strategy.name=owner' ('' without a sweep)"),
    ("backend", "analytic | sim (predicted), mpi | nccl | cuda_loopback (measured)"),
    ("fidelity", "sim: step | flow; analytic: closed_form; measured: ''"),
    ("strategy", "the strategy that ran (setup.strategy)"),
    ("cluster", "cluster profile name"),
    ("model", "model name"),
    ("mesh", "the device mesh, described"),
    ("world_size", "ranks (GPUs, or CPU processes on CPU clusters)"),
    ("nodes", "nodes"),
    ("gpus_per_node", "ranks per node"),
    ("device", "'GPU', or 'rank' when the ranks are CPU processes"),
    ("params", "model parameters (elements)"),
    ("muon_matrices", "matrices Muon orthogonalizes"),
    ("step_s", "average step time (over the hyper-period; measured: mean of timed steps)"),
    ("worst_step_s", "worst step time"),
    ("worst_step", "index of the first worst step"),
    ("median_step_s", "measured backends: median timed step; else None"),
    ("bound_s", "T_bound, the step's lower bound (core/engine/bound.hpp); None if absent"),
    ("bound_ratio", "step_s / bound_s; None if absent"),
    ("compute_s", "mean over ranks of compute busy time, average step"),
    ("comm_s", "mean over ranks of time inside collectives, average step"),
    ("exposed_comm_s", "of comm_s, the part not overlapped by compute"),
    ("params_per_s_per_gpu", "parameters updated per second per rank (end to end)"),
    ("tflops_per_gpu", "optimizer TFLOP/s per rank as executed (replicated work counted)"),
    ("useful_tflops_per_gpu", "TFLOP/s per rank counting each matrix's NS once; None if absent"),
    ("utilization", "tflops_per_gpu over the device's peak"),
    ("GBps_per_gpu", "GB/s sent per rank"),
    ("intra_node_bytes", "bytes moved per average step inside nodes (NVLink / PCIe)"),
    ("network_bytes", "bytes moved per average step over the network (NICs)"),
    ("optimizer_peak_bytes", "fullest rank's optimizer memory (ranks[].memory.peak_bytes)"),
    ("memory_model", "what peak_memory_bytes counts (memory.model); None if absent"),
    ("peak_memory_bytes", "fullest rank's peak under memory_model; None if absent"),
    ("memory_limit_bytes", "one GPU's (or CPU rank's) memory; None if absent"),
    ("over_ranks", "ranks whose peak exceeds the limit; None if absent"),
    ("feasible", "True: fits in memory; False: exceeds it; None: unknown"),
    ("cross_check_pct", "the largest |difference| to another backend, signed, in %; None if "
                        "absent"),
    ("disagrees", "True when a cross-check differs by > 10 %; None without cross-checks"),
    ("point_id", "the point's identity (experiment, point, backend, configuration)"),
    ("muonbed_version", "muonbed version that wrote the file"),
    ("git_hash", "git commit of that muonbed"),
    ("path", "the result file"),
    ("trace", "its Chrome trace of one step, or None"),
]

RANK_COLUMNS = [
    ("experiment", "experiment name"), ("point", "the sweep point's label"),
    ("backend", "backend"), ("rank", "rank"), ("node", "its node"),
    ("compute_s", "compute busy time, average step"),
    ("communication_s", "time inside collectives, average step"),
    ("exposed_comm_s", "of that, not overlapped by compute"),
    ("idle_s", "step time minus busy time"), ("finish_s", "completion of its last op"),
    ("worst_compute_s", "compute busy time in the worst step"),
    ("worst_exposed_comm_s", "exposed communication in the worst step"),
    ("bytes_sent", "bytes sent per average step"),
    ("bytes_received", "bytes received per average step"),
    ("static_bytes", "optimizer state held all step"),
    ("peak_transient_bytes", "largest transient buffers"),
    ("peak_bytes", "static + transient at the peak"),
]


def result_row(r):
    """One verified Record as a flat dict of COLUMNS plus its sweep keys."""
    d = r.doc
    mem = r.memory or {}
    checks = r.cross_check
    worst_check = max(checks, key=lambda c: abs(c["difference_pct"])) if checks else None
    bound = num(d, "bound.step_s")
    row = {
        "experiment": r.experiment, "point": r.label, "backend": r.backend,
        "fidelity": r.fidelity, "strategy": r.strategy, "cluster": d["setup"]["cluster"],
        "model": d["setup"]["model"], "mesh": str(get(d, "setup.mesh") or ""),
        "world_size": r.world, "nodes": int(num(d, "setup.nodes")),
        "gpus_per_node": d["setup"]["gpus_per_node"], "device": r.device,
        "params": d["setup"]["params"], "muon_matrices": int(num(d, "setup.muon_matrices")),
        "step_s": d["step"]["average_s"], "worst_step_s": d["step"]["worst_s"],
        "worst_step": d["step"]["worst_step"], "median_step_s": get(d, "step.median_s"),
        "bound_s": bound if bound > 0 else None,
        "bound_ratio": num(d, "bound.ratio") if bound > 0 else None,
        "compute_s": get(d, "throughput.computation.time_s.average"),
        "comm_s": get(d, "throughput.communication.time_s.average"),
        "exposed_comm_s": get(d, "throughput.communication.exposed_time_s.average"),
        "params_per_s_per_gpu": get(d, "throughput.params_per_s_per_gpu.average"),
        "tflops_per_gpu": get(d, "throughput.computation.tflops_per_gpu.average"),
        "useful_tflops_per_gpu": get(d, "throughput.computation.useful_tflops_per_gpu.average"),
        "utilization": get(d, "throughput.computation.utilization.average"),
        "GBps_per_gpu": get(d, "throughput.communication.GBps_per_gpu.average"),
        "intra_node_bytes": get(d, "traffic.intra_node_bytes.average"),
        "network_bytes": get(d, "traffic.network_bytes.average"),
        "optimizer_peak_bytes": max((x["memory"]["peak_bytes"] for x in d["ranks"]),
                                    default=0),
        "memory_model": mem.get("model"), "peak_memory_bytes": mem.get("peak_bytes"),
        "memory_limit_bytes": mem.get("limit_bytes"), "over_ranks": mem.get("over_ranks"),
        "feasible": r.feasible,
        "cross_check_pct": worst_check["difference_pct"] if worst_check else None,
        "disagrees": (not all(c["agree"] for c in checks)) if checks else None,
        "point_id": r.point_id,
        "muonbed_version": str(get(d, "provenance.muonbed_version") or ""),
        "git_hash": str(get(d, "provenance.git_hash") or ""),
        "path": r.path, "trace": r.trace,
    }
    for key, value in r.params:
        row["sweep." + key] = value
    return row


def _load(root, warn):
    if not os.path.isdir(root):
        raise FolderError(f"'{root}' is not a folder; pass an experiment's output folder")
    loaded = load_dir(root)
    if warn:
        report(loaded, root, notes=sys.stderr, who="load_results")
    return loaded


def load_results(root, warn=True):
    """The verified results under `root` (an experiment's output folder, as `muonbed run`
    writes it) as a list of flat dicts, one per result file (sweep point x backend), in a stable
    order, with the columns of COLUMNS plus one "sweep.<key>" column per sweep key.

    Only what plot.py would draw is returned: files the manifest lists for the current sweep,
    with a matching checksum and well-formed fields; the others are left out and, with
    warn=True, named on stderr with the reason. Raises FolderError when the folder is missing or
    its manifest cannot be trusted.

        import sys; sys.path.insert(0, "analysis")
        from muonbed_plots.loader import load_results
        rows = load_results("results/quickstart")
        best = min(rows, key=lambda row: row["step_s"])
    """
    return [result_row(r) for r in _load(root, warn).records]


def load_rank_rows(root, warn=True):
    """One flat dict per rank of every verified record under `root` (RANK_COLUMNS), for
    per-rank balance: which rank idles, which sends most."""
    rows = []
    for r in _load(root, warn).records:
        for i, x in enumerate(r.doc["ranks"]):
            rows.append({
                "experiment": r.experiment, "point": r.label, "backend": r.backend,
                "rank": int(num(x, "rank", i)), "node": int(num(x, "node")),
                "compute_s": x["average"]["compute_s"],
                "communication_s": x["average"]["communication_s"],
                "exposed_comm_s": x["average"]["exposed_comm_s"],
                "idle_s": x["average"]["idle_s"], "finish_s": x["average"]["finish_s"],
                "worst_compute_s": x["worst"]["compute_s"],
                "worst_exposed_comm_s": x["worst"]["exposed_comm_s"],
                "bytes_sent": x["bytes_sent"], "bytes_received": x["bytes_received"],
                "static_bytes": x["memory"]["static_bytes"],
                "peak_transient_bytes": x["memory"]["peak_transient_bytes"],
                "peak_bytes": x["memory"]["peak_bytes"]})
    return rows


def load_frame(root, warn=True, ranks=False):
    """load_results (or, with ranks=True, load_rank_rows) as a pandas DataFrame. Needs pandas
    (apt-get install python3-pandas); without it, ImportError says so."""
    try:
        import pandas
    except ImportError:
        raise ImportError("load_frame needs pandas (apt-get install python3-pandas, or pip "
                          "install pandas); load_results(root) gives the same rows as a list "
                          "of dicts without it") from None
    rows = load_rank_rows(root, warn) if ranks else load_results(root, warn)
    return pandas.DataFrame(rows)
