"""<exp>-ranks-<backend>[-worst]: per-rank breakdown of each point's average (or worst) step;
big meshes show representative ranks."""

import math

from .common import COMPONENTS, RANKS_SHOWN_IN_FULL, differ, num, time_unit


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
        ax.set_title(f"{sweep.display(label)}\n(step {step_s * scale:.3g} {unit})", fontsize=9,
                     color="#C44E52" if label in sweep.infeasible else "black")
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
