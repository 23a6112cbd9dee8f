"""Plots of `muonbed compare`'s JSON (core/results/compare.hpp): measured beside predicted.

  <exp>-compare-scatter          predicted vs measured step time per point and predicting backend,
                                 log-log, with y = x and the +-10 % band; points that are not a
                                 check drawn hollow (the measured run was oversubscribed, more
                                 ranks than cores, or ran every rank on one GPU: cuda_loopback),
                                 those whose speed probe warned ringed in orange; with several
                                 runs combined, a grey bar spans each point's runs
  <exp>-compare-points           per point, measured and predicted step times side by side, the
                                 error % of each prediction above its bar (the range of the
                                 runs on the measured bar when runs are combined)
  <exp>-compare-timeline-<point> one point's measured step (mpi.trace.json, dark, narrow) drawn
                                 over the predicted one (sim.trace.json, light, wide), per rank
                                 and stream: the two traces share the simulator's format
"""

import re

from .common import KIND_COLORS, slug
from .loader import LoadError
from .timeline import Trace

PRED_COLORS = {"analytic": "#1f77b4", "sim": "#d62728"}


def not_a_check(pt):
    """Measured on shared cores (oversubscribed) or with every rank on one GPU (one_device): the
    prediction is for a different machine than the one measured."""
    return bool(pt.get("oversubscribed") or pt.get("one_device"))
PRED_MARKERS = {"analytic": "o", "sim": "s"}


def footer(fig, doc):
    text = (f"muonbed compare · {doc.get('experiment', '?')} · measured: median timed step; "
            f"predicted: average step · hollow / hatched: not a check (oversubscribed, or every rank "
            f"on one GPU)")
    fig.supxlabel(text, x=0.005, ha="left", fontsize=6.5, color="#555555")


def plot_scatter(p, doc):
    points = doc.get("points", [])
    fig = p.new_figure(7.6, 5.6)
    ax = fig.add_subplot(1, 1, 1)
    values = []
    for backend in ("analytic", "sim"):
        for over in (False, True):
            xs, ys = [], []
            for pt in points:
                if not_a_check(pt) != over:
                    continue
                for pr in pt.get("predicted", []):
                    if pr.get("backend") == backend:
                        xs.append(pt["measured"]["step_s"] * 1e3)
                        ys.append(pr["step_s"] * 1e3)
            if not xs:
                continue
            values += xs + ys
            color = PRED_COLORS.get(backend, "#333333")
            ax.scatter(xs, ys, marker=PRED_MARKERS.get(backend, "o"), s=30,
                       facecolors="none" if over else color, edgecolors=color, linewidths=1.1,
                       label=f"{backend}{' (not a check)' if over else ''}", zorder=3)
    if not values:
        return None
    # Points whose speed probe found the machine off its profile (or changing speed during the
    # point): ringed, so a miss there is read as the machine's, not the model's.
    xs, ys = [], []
    for pt in points:
        if not pt["measured"].get("warnings"):
            continue
        for pr in pt.get("predicted", []):
            xs.append(pt["measured"]["step_s"] * 1e3)
            ys.append(pr["step_s"] * 1e3)
    # Several runs combined: each point's measured range over the runs, as a horizontal bar.
    labelled = False
    for pt in points:
        runs = pt["measured"].get("runs_s") or []
        if len(runs) < 2:
            continue
        for pr in pt.get("predicted", []):
            y = pr["step_s"] * 1e3
            ax.plot([min(runs) * 1e3, max(runs) * 1e3], [y, y], color="#777777", lw=0.8,
                    zorder=2, label=None if labelled else "range of the runs")
            labelled = True
            values += [min(runs) * 1e3, max(runs) * 1e3]
    if xs:
        ax.scatter(xs, ys, marker="o", s=120, facecolors="none", edgecolors="#ff7f0e",
                   linewidths=0.9, label="speed probe off (machine ≠ profile, or drifting)",
                   zorder=4)
    lo, hi = min(values) / 1.3, max(values) * 1.3
    line = [lo, hi]
    ax.plot(line, line, color="#333333", lw=1, label="y = x", zorder=2)
    ax.fill_between(line, [v * 0.9 for v in line], [v * 1.1 for v in line], color="#999999",
                    alpha=0.25, lw=0, label="±10 %", zorder=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    summary = []
    for s in doc.get("summary", []):
        summary.append(f"{s['backend']} ({s['scope']}, {s['points']} pts): median "
                       f"{s['median_abs_error_pct']:.1f} %, max {s['max_abs_error_pct']:.1f} %")
    ax.set_title(f"{doc.get('experiment', '')}: predicted vs measured\n" + "\n".join(summary),
                 fontsize=7.5)
    ax.legend(fontsize=7, loc="upper left")
    footer(fig, doc)
    name = f"{doc.get('experiment', 'experiment')}-compare-scatter"
    p.save(fig, name)
    return name


def plot_points(p, doc):
    points = doc.get("points", [])
    if not points:
        return None
    backends = []
    for pt in points:
        for pr in pt.get("predicted", []):
            if pr["backend"] not in backends:
                backends.append(pr["backend"])
    n = len(points)
    width = 0.8 / (1 + len(backends))
    fig = p.new_figure(max(7.0, 0.42 * n + 2), 4.8)
    ax = fig.add_subplot(1, 1, 1)
    top = 0
    for i, pt in enumerate(points):
        over = not_a_check(pt)
        m = pt["measured"]["step_s"] * 1e3
        top = max(top, m)
        ax.bar(i - 0.4 + width / 2, m, width, color="#333333", hatch="//" if over else None,
               edgecolor="white" if over else "#333333",
               label="measured (median)" if i == 0 else None)
        runs = pt["measured"].get("runs_s") or []
        if len(runs) > 1:  # the runs' range: the machine's run-to-run noise
            lo_run, hi_run = min(runs) * 1e3, max(runs) * 1e3
            top = max(top, hi_run)
            ax.errorbar(i - 0.4 + width / 2, m, yerr=[[m - lo_run], [hi_run - m]], fmt="none",
                        ecolor="#ff7f0e", elinewidth=1, capsize=2,
                        label="range of runs" if i == 0 else None, zorder=4)
        for j, b in enumerate(backends):
            pr = next((x for x in pt.get("predicted", []) if x["backend"] == b), None)
            if pr is None:
                continue
            v = pr["step_s"] * 1e3
            top = max(top, v)
            x = i - 0.4 + width * (j + 1.5)
            ax.bar(x, v, width, color=PRED_COLORS.get(b, "#777777"),
                   hatch="//" if over else None, edgecolor="white" if over else None,
                   label=b if i == 0 else None)
            ax.text(x, v, f"{pr['error_pct']:+.0f}%", ha="center", va="bottom", fontsize=5.5,
                    rotation=90)
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"{pt['strategy']} · {pt.get('group') or pt['model']}" for pt in points],
                       rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(0, top * 1.25)
    ax.set_title(f"{doc.get('experiment', '')}: measured beside predicted, per point")
    ax.legend(fontsize=7, ncol=1 + len(backends), loc="upper left")
    footer(fig, doc)
    name = f"{doc.get('experiment', 'experiment')}-compare-points"
    p.save(fig, name)
    return name


def pick_point(doc, wanted):
    points = doc.get("points", [])
    if wanted:
        for pt in points:
            if pt.get("point") == wanted:
                return pt
        raise LoadError(f"--timeline '{wanted}' is no point of the comparison; points: " +
                        ", ".join(pt.get("point", "?") for pt in points[:10]))
    for pt in points:
        if not not_a_check(pt) and pt["measured"].get("trace") and any(
                pr.get("trace") for pr in pt.get("predicted", [])):
            return pt
    for pt in points:
        if pt["measured"].get("trace") and any(pr.get("trace") for pr in pt.get("predicted", [])):
            return pt
    return None


def plot_overlay(p, doc, wanted=None):
    pt = pick_point(doc, wanted)
    if pt is None:
        return None
    pred = next((pr for pr in sorted(pt.get("predicted", []), key=lambda x: x["backend"] != "sim")
                 if pr.get("trace")), None)
    if pred is None:
        return None
    measured = Trace(pt["measured"]["trace"])
    predicted = Trace(pred["trace"])

    def rows(trace):
        out = {}
        for key, ts, dur, kind in trace.spans:
            label = trace.row_label(key)
            out.setdefault(label, []).append((ts, dur, kind))
        return out

    mrows, prows = rows(measured), rows(predicted)
    labels = sorted(set(mrows) | set(prows),
                    key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)])
    if not labels:
        return None
    fig = p.new_figure(9.0, max(2.6, 0.55 * len(labels) + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    end = 0.0
    for y, label in enumerate(labels):
        for ts, dur, kind in prows.get(label, []):
            ax.barh(y, dur / 1e3, left=ts / 1e3, height=0.8, color=KIND_COLORS.get(kind, "#bbbbbb"),
                    alpha=0.35, edgecolor="none")
            end = max(end, (ts + dur) / 1e3)
        for ts, dur, kind in mrows.get(label, []):
            ax.barh(y, dur / 1e3, left=ts / 1e3, height=0.36,
                    color=KIND_COLORS.get(kind, "#555555"), edgecolor="black", linewidth=0.3)
            end = max(end, (ts + dur) / 1e3)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.02 if end > 0 else 1)
    ax.set_xlabel("time from the step's start (ms)")
    m_s = pt["measured"]["step_s"] * 1e3
    ax.set_title(f"{pt['point']}\nmeasured ({pt['measured']['backend']}, narrow, dark; median step "
                 f"{m_s:.1f} ms, the trace is the slowest timed step) over predicted "
                 f"({pred['backend']}, wide, light; {pred['step_s'] * 1e3:.1f} ms, "
                 f"{pred['error_pct']:+.1f} %)", fontsize=8)
    from matplotlib.patches import Patch
    kinds = sorted({k for r in list(mrows.values()) + list(prows.values()) for _, _, k in r})
    ax.legend(handles=[Patch(color=KIND_COLORS.get(k, "#999999"), label=k) for k in kinds],
              fontsize=6.5, ncol=min(8, len(kinds)), loc="upper center",
              bbox_to_anchor=(0.5, -0.14), frameon=False)
    footer(fig, doc)
    name = f"{doc.get('experiment', 'experiment')}-compare-timeline-{slug(pt['point'])}"
    p.save(fig, name)
    return name


def plot_compare(p, doc, timeline=None):
    written = []
    for fn in (plot_scatter, plot_points):
        name = fn(p, doc)
        if name:
            written.append(name)
    name = plot_overlay(p, doc, timeline)
    if name:
        written.append(name)
    return written
