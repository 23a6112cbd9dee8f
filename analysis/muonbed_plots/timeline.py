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
            if any(isinstance(k, bool) or not isinstance(k, (int, float, str)) for k in key):
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
    except LoadError as e:
        print(f"plot: warning: skipped trace {r.trace}: {e}", file=sys.stderr)
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
