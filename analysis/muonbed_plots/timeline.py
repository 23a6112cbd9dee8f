"""<exp>-timeline-<backend>-<point>: one step as a Gantt chart per rank and stream, from the
simulator's Chrome trace."""

import math
import os
import re
import sys

from .common import (COMM_KINDS, COMPUTE_KINDS, KIND_COLORS, differ, get, num, slug,
                     time_unit)
from .loader import LoadError, read_json
from .sweep import natural_key


def op_kind(event):
    """The plan op kind of a trace event: "wait" for waiting spans (cat "wait", the simulator's
    time between a member's arrival at a collective and its start), else args.kind or cat when
    they name a kind, else the first kind named in the event's name."""
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    cat = event.get("cat")
    # The form muonbed's own traces take (core/engine/src/timeline.cpp): decided without
    # looking at the name (a 405B trace has ~240,000 events).
    if cat == "wait":
        return "wait"
    if cat in ("compute", "collective") and args.get("kind") in KIND_COLORS:
        return args["kind"]
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
        doc, _ = read_json(path)  # LoadError: unreadable, too big, not JSON
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
            # Rows are keyed by (pid, tid): anything but numbers and names is no row.
            if not (type(key[0]) is int and type(key[1]) is int) and any(
                    isinstance(k, bool) or not isinstance(k, (int, float, str)) for k in key):
                continue
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
        # A span must be a finite, non-negative interval (JSON readers accept NaN and Infinity).
        self.spans = [sp for sp in self.spans
                      if math.isfinite(sp[1]) and math.isfinite(sp[2]) and sp[2] >= 0]

    def rank_of(self, key):
        for text in (self.tname.get(key), self.pname.get(key[0])):
            m = re.search(r"rank\s*(\d+)", text or "")
            if m:
                return int(m.group(1))
        return key[0]

    def stream_name(self, key):
        """The stream part of a row's name ("comm.17" of "rank 3 comm.17")."""
        t = self.tname.get(key)
        if t:
            return re.sub(r"^.*?rank\s*\d+\s*", "", t) or t
        return f"stream {key[1]}"

    def row_label(self, key):
        t = self.tname.get(key)
        if t and re.search(r"rank\s*\d+", t):
            return re.sub(r"(rank\s*\d+)\s+", r"\1 · ", t, count=1)
        p = self.pname.get(key[0], f"rank {key[0]}")
        return f"{p} · {t if t else 'stream ' + str(key[1])}"


FOLD_STREAMS = 4  # a rank with more streams than this has them folded per stream class
# Spans of one kind in one row closer than this share of the step are drawn as one: at the
# figure's ~1,900 pixels of time axis they would touch anyway, and a 405B step holds ~7,000 spans
# per row (issue 23: drawing each took minutes per figure).
JOIN_FRACTION = 1 / 4000


def stream_class(stream):
    """A stream's class: its name without the lane number ("comm.17" and "comm" -> "comm",
    "comm_scatter.3" -> "comm_scatter"), so the 128 lanes of a class fold into one row."""
    return re.sub(r"[._ -]?\d+$", "", stream.strip()) or stream


def merge(intervals, gap=0.0):
    """The union of (start, duration) intervals, as sorted, disjoint (start, duration) pairs;
    intervals less than `gap` apart join too."""
    out = []
    for start, dur in sorted(intervals):
        end = start + dur
        if out and start <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b - a) for a, b in out]


def peak_concurrency(intervals):
    """Most intervals open at one time (ends before starts at equal times)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(s + d, -1) for s, d in intervals],
                    key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, step in events:
        cur += step
        best = max(best, cur)
    return best


def timeline_rows(tr, shown):
    """The rows of the chart: [(rank, row key, label)] and {trace key: row key}. One row per
    stream; a rank with more than FOLD_STREAMS streams (128 communication lanes: ~130 streams
    per rank) gets one row per stream class instead, its lanes folded into it."""
    keys = {k for k, _, _, _ in tr.spans} | set(tr.tname)
    per_rank = {}
    for k in keys:
        if tr.rank_of(k) in shown:
            per_rank.setdefault(tr.rank_of(k), []).append(k)
    rows, row_of, lanes = [], {}, {}
    for rank in sorted(per_rank, key=id_key):
        ks = sorted(per_rank[rank], key=lambda k: (id_key(k[0]), id_key(k[1])))
        if len(ks) <= FOLD_STREAMS:
            for k in ks:
                rows.append((rank, k, tr.row_label(k)))
                row_of[k] = k
            continue
        classes = []
        for k in ks:
            c = stream_class(tr.stream_name(k))
            if c not in classes:
                classes.append(c)
            row_of[k] = (rank, "class", c)
            lanes.setdefault((rank, "class", c), []).append(k)
        for c in classes:
            rows.append((rank, (rank, "class", c), f"rank {rank} · {c}"))
    return rows, row_of, lanes


def plot_timeline(p, sweep, name, r):
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    import numpy as np
    try:
        tr = Trace(r.trace)
    except LoadError as e:
        print(f"plot: warning: skipped trace {r.trace}: {e}", file=sys.stderr)
        return
    if not tr.spans:
        return
    keys = {k for k, _, _, _ in tr.spans} | set(tr.tname)
    ranks = sorted({tr.rank_of(k) for k in keys}, key=id_key)
    shown = set(ranks[:p.max_ranks])
    rows, row_of, lanes = timeline_rows(tr, shown)
    index = {row_key: i for i, (_, row_key, _) in enumerate(rows)}
    t0 = min(0.0, min(s[1] for s in tr.spans))
    t1 = max(s[1] + s[2] for s in tr.spans)
    scale, unit = time_unit((t1 - t0) * 1e-6 or 1e-6)
    f = 1e-6 * scale  # trace microseconds -> unit
    by_kind = {}   # kind -> row index -> [(start, duration)]
    busy = {}      # folded row index -> lane -> its busy spans (for the lanes busy at once)
    for key, ts, dur, kind in tr.spans:
        row_key = row_of.get(key)
        if row_key is None:
            continue
        i = index[row_key]
        by_kind.setdefault(kind, {}).setdefault(i, []).append(((ts - t0) * f, dur * f))
        if row_key in lanes and kind != "wait":
            busy.setdefault(i, {}).setdefault(key, []).append(((ts - t0) * f, dur * f))
    labels = []
    for i, (_, row_key, label) in enumerate(rows):
        if row_key in lanes and len(lanes[row_key]) > 1:
            n = len(lanes[row_key])
            if i in busy:  # lanes busy at once (a lane's own spans may touch or overlap)
                spans = [sp for lane in busy[i].values() for sp in merge(lane)]
                label += f" ×{n} (≤{peak_concurrency(spans)} busy)"
            else:
                label += f" ×{n}"
        labels.append(label)
    height = min(18.0, max(3.8, 1.9 + 0.24 * len(rows)))
    fig = p.new_figure(14, height)
    ax = fig.subplots()
    # One collection per op kind (thousands of spans: one artist each would take minutes).
    # Waiting first, so the spans of work are drawn over it; a row draws the union of its
    # (folded: its lanes') spans of each kind, spans under a pixel apart joined.
    join = (t1 - t0) * f * JOIN_FRACTION
    for kind in sorted(by_kind, key=lambda k: (k != "wait", k)):
        boxes = []
        for i, spans in sorted(by_kind[kind].items()):
            for start, dur in merge(spans, join):
                boxes.append((start, dur, i))
        a = np.array(boxes, dtype=float).reshape(-1, 3)
        x0, x1, y = a[:, 0], a[:, 0] + a[:, 1], a[:, 2]
        verts = np.stack([np.stack([x0, y - 0.4], 1), np.stack([x0, y + 0.4], 1),
                          np.stack([x1, y + 0.4], 1), np.stack([x1, y - 0.4], 1)], 1)
        ax.add_collection(PolyCollection(verts, **kind_style(kind)))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7 if len(rows) <= 40 else 5.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, (t1 - t0) * f * 1.01)
    ax.set_xlabel(f"time since the step started ({unit})")
    ax.set_ylabel("rank · stream" + (" class (lanes folded)" if lanes else ""))
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    # Rank boundaries, so the streams of one rank read as a group.
    cuts = [i - 0.5 for i in range(1, len(rows)) if rows[i][0] != rows[i - 1][0]]
    if cuts:
        ax.hlines(cuts, 0, 1, transform=ax.get_yaxis_transform(), color="#999999",
                  linewidth=0.4)
    order = [k for k in COMPUTE_KINDS + ["compute"] + COMM_KINDS + ["collective", "wait",
                                                                     "other"] if k in by_kind]
    handles = [Patch(label=TIMELINE_LABELS.get(k, k.replace("_", " ")), **kind_style(k))
               for k in order]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7.5,
              title="op kind", title_fontsize=8, frameon=False)
    world = int(num(tr.other, "world_size", 0)) or r.world
    cap = (f"first {len(shown)} of {world} ranks" if world > len(shown)
           else f"all {len(shown)} ranks")
    if lanes:
        streams = max(len(v) for v in lanes.values())
        cap += f"; up to {streams} lanes per stream class folded into one row"
    which = ""
    if "step" in tr.other:
        k = int(num(tr.other, "step", 0))
        worst = differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
        which = f" {k}" + (" (the worst)" if worst and k == int(num(r.doc, "step.worst_step"))
                           else "")
    fig.suptitle(f"{name}: timeline of step{which}, {sweep.display(r.label)}, backend "
                 f"{r.backend} ({cap})", fontsize=11)
    p.footer(fig, sweep, "trace: " + os.path.relpath(r.trace, os.path.dirname(
        os.path.dirname(r.trace))))
    p.save(fig, timeline_name(sweep, name, r))


def timeline_name(sweep, name, r):
    return f"{name}-timeline-{r.backend}-{slug(sweep.short[r.label])}"


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
