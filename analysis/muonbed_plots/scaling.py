"""<exp>-scaling: step time, per-GPU throughput and computation vs exposed communication
against GPU count, one line per strategy (when the sweep changes the world size). A point that
exceeds GPU memory is no point of the line (the line breaks there) but a grey ⊘ cross; a point
whose backends disagree by more than 10 % is ringed."""

import math

from .common import BACKEND_COLORS, aw, count_unit, differ, num, time_unit
from .marks import DISAGREE_MARK, INFEASIBLE_COLOR, INFEASIBLE_EDGE
from .sweep import short_value


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
    dev = sweep.device
    off_line = []   # (axis, x, y, record): infeasible points, drawn apart
    ringed = []     # (axis, x, y): points whose backends disagree

    def feasible_only(xs, ys, pts, ax):
        """ys with NaN at infeasible points (the line breaks there); those go to off_line."""
        out = []
        for x, y, (_, r) in zip(xs, ys, pts):
            if r.label in sweep.infeasible:
                off_line.append((ax, x, y))
                out.append(math.nan)
            else:
                out.append(y)
                if r.label in sweep.disagree:
                    ringed.append((ax, x, y))
        return out
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
            ax_t.plot(xs, feasible_only(xs, avg, pts, ax_t), ls,
                      marker=markers[b % len(markers)], color=color, label=lab)
            if any(differ(a, w) for a, w in zip(avg, worst)):
                any_worst = True
                ax_t.plot(xs, feasible_only(xs, worst, pts, ax_t), ls,
                          marker=markers[b % len(markers)], color=color,
                          alpha=0.45, mfc="white", label=lab + " (worst step)")
            pa = [tuple(x / pscale for x in aw(r.doc, "throughput.params_per_s_per_gpu"))
                  for _, r in pts]
            ax_p.plot(xs, feasible_only(xs, [a for a, _ in pa], pts, ax_p), ls,
                      marker=markers[b % len(markers)], color=color, label=lab + " avg")
            if any(differ(a, w) for a, w in pa):
                ax_p.plot(xs, feasible_only(xs, [w for _, w in pa], pts, ax_p), ls,
                          marker=markers[b % len(markers)],
                          color=color, alpha=0.45, mfc="white", label=lab + " worst")
            comp = [aw(r.doc, "throughput.computation.time_s")[0] * scale for _, r in pts]
            expo = [aw(r.doc, "throughput.communication.exposed_time_s")[0] * scale
                    for _, r in pts]
            # Here backends differ by marker; computation solid, exposed communication dashed.
            ax_c.plot(xs, feasible_only(xs, comp, pts, ax_c), "-",
                      marker=markers[b % len(markers)], color=color,
                      label=lab + ": computation")
            ax_c.plot(xs, feasible_only(xs, expo, pts, ax_c), "--",
                      marker=markers[b % len(markers)], color=color,
                      mfc="white", label=lab + ": exposed communication")
    for ax in (ax_t, ax_p, ax_c):
        here = [(x, y) for a, x, y in off_line if a is ax]
        if here:
            ax.plot([x for x, _ in here], [y for _, y in here], linestyle="none", marker="X",
                    markersize=9, color=INFEASIBLE_COLOR, markeredgecolor=INFEASIBLE_EDGE,
                    label=f"⊘ exceeds {dev} memory (not run)")
        here = [(x, y) for a, x, y in ringed if a is ax]
        if here:
            ax.plot([x for x, _ in here], [y for _, y in here], linestyle="none", marker="o",
                    markersize=13, mfc="none", color="#ff7f0e",
                    label=f"{DISAGREE_MARK} backends disagree > 10 %")
    # T_bound (core/engine/bound.hpp) as a line: it depends on the model, mesh and cluster, not on the
    # schedule, so one line over the world sizes (the lowest bound recorded at each, a bound
    # every series must stay above).
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
        ax.set_xlabel(f"{dev}s (world size, log₂ scale)")
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
    ax_p.set_ylabel(f"{pprefix or ''}params updated per second per {dev} (log scale)".replace(
        "Gparams", "billion params").replace("Mparams", "million params"))
    ax_p.set_title(f"per-{dev} throughput (average and worst step)" if any_worst else
                   f"per-{dev} throughput", fontsize=10)
    ax_c.set_ylabel(f"time per {dev} per average step ({unit}, log scale)")
    ax_c.set_title(f"computation (solid) vs exposed communication (dashed),\nmeans over {dev}s",
                   fontsize=10)
    fig.suptitle(f"{name}: scaling with {dev} count, one line per strategy", fontsize=11.5)
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
