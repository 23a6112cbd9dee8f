"""Shared pieces of the plots: constants (colours, limits), safe access to a results record's
fields, point labels, units, and file names. Every module of the package imports from here."""

import math
import re

try:  # optional: sweep order from the experiment file, claims in YAML
    import yaml  # type: ignore
except Exception:  # pragma: no cover - depends on the interpreter
    yaml = None

SCHEMA_VERSION = 2
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


# ---- Fields of a record (validated on load: see loader.py) ---------------------------------------

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



# ---- Units and names -------------------------------------------------------------------------

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


def fmt_bytes(b):
    scale, unit = bytes_unit(b)
    return f"{b / scale:.3g} {unit}"


def count_unit(x):
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return scale, unit
    return 1.0, ""


def slug(text):
    """A short, readable file name part (figure names of sweep points)."""
    s = re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_.")
    return s[:80] or "default"


def file_part(text):
    """`text` as one safe file name component, as core/experiment/src/result_paths.cpp's point_slug
    makes it: every byte outside [A-Za-z0-9._=,-] percent-encoded (so distinct names stay distinct and none
    climbs out of the folder with '/' or '..'), and names over 200 bytes cut to a prefix plus a
    64-bit FNV-1a hash of the whole."""
    data = str(text).encode("utf-8", "surrogateescape")
    if not data:
        return "default"
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=-,")
    out = "".join(chr(b) if b in safe else f"%{b:02X}" for b in data)
    if out in (".", ".."):
        out = out.replace(".", "%2E")
    if len(out) > 200:
        h = 1469598103934665603
        for b in data:
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        cut = 150
        while cut > 0 and out[cut - 1] == "%":
            cut -= 1
        if cut >= 2 and out[cut - 2] == "%":
            cut -= 2
        out = out[:cut] + f"~{h:016x}"
    return out


def differ(a, b):
    return abs(a - b) > 1e-9 * max(abs(a), abs(b), 1e-30)
