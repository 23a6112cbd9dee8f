"""<exp>-strategies: step time per sweep point, one panel per backend, split into computation
only, overlapped communication, exposed communication and idle; average and worst step apart.

When the slowest point is more than SPREAD_FOR_FACETS times the fastest, one linear axis would
flatten every fast point to a sliver (issue 23: one strategy 30-100x slower than the rest), so
each backend gets two facets instead: the step time on a log axis, and the split of each step
into its four parts in % of that step (each point's bar is then readable, whatever its size).

Points that exceed GPU memory are drawn grey and hatched with the reason beside them (marks.py);
points whose backends disagree by more than 10 % carry ≠."""

from .common import COMPONENTS, aw, differ, num, time_unit
from .marks import (DISAGREE_MARK, INFEASIBLE_COLOR, INFEASIBLE_EDGE, INFEASIBLE_HATCH,
                    label_points, mark_legend_handles, mixed_fidelity)

SPREAD_FOR_FACETS = 10.0
STEP_COLOR = "#5A5A5A"  # the log facet's bars: the whole step, none of the four parts


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


def spread(sweep):
    """Slowest over fastest step time of the sweep (average and worst steps)."""
    times = [t for r in sweep.records
             for t in (num(r.doc, "step.average_s"), num(r.doc, "step.worst_s")) if t > 0]
    return max(times) / min(times) if times else 1.0


def bar_style(color, which, infeasible):
    if infeasible:  # never drawn as a normal result
        return {"color": INFEASIBLE_COLOR, "hatch": INFEASIBLE_HATCH,
                "edgecolor": INFEASIBLE_EDGE, "linewidth": 0.4}
    return {"color": color, "hatch": "///" if which == "worst" else None,
            "edgecolor": "white" if which == "average" else "#333333", "linewidth": 0.4}


def annotation(sweep, r, which, total, scale, unit, worst_differs):
    tag = "" if not worst_differs else ("avg " if which == "average" else "worst ")
    text = f"{tag}{total * scale:.3g} {unit}"
    if which == "worst":
        text += f" (step {int(num(r.doc, 'step.worst_step'))})"
    if mixed_fidelity(sweep, r.backend) and r.fidelity:
        text += f" [{r.fidelity}]"
    if which == "average":
        if r.label in sweep.disagree:
            text += f"  {DISAGREE_MARK} {sweep.disagree[r.label]}"
        if r.label in sweep.infeasible:
            text += f"  ⊘ exceeds {sweep.device} memory"
    return text


def rows_of(r, any_worst):
    worst_differs = differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
    rows = [("average", -0.2), ("worst", 0.2)] if worst_differs else [("average", 0.0)]
    h = 0.38 if worst_differs else (0.5 if any_worst else 0.7)
    return worst_differs, rows, h


def plot_strategies(p, sweep, name):
    from matplotlib.patches import Patch
    labels = sweep.labels
    any_worst = any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
                    for r in sweep.records)
    facets = spread(sweep) > SPREAD_FOR_FACETS
    slot = 2 if any_worst else 1
    nb = len(sweep.backends)
    height = min(14.0, max(4.5, 1.9 + 0.42 * len(labels) * slot))
    if facets:
        width = min(18.0, 7.0 + 5.0 * nb)
        fig = p.new_figure(width, height)
        grid = fig.subplots(1, 2 * nb, sharey=True, squeeze=False,
                            gridspec_kw={"width_ratios": [1.15, 1.0] * nb})[0]
        panels = [(grid[2 * b], grid[2 * b + 1]) for b in range(nb)]
    else:
        width = 10.0 if nb == 1 else min(17.0, 7.5 + 4.2 * nb)
        fig = p.new_figure(width, height)
        grid = fig.subplots(1, nb, sharey=True, sharex=True, squeeze=False)[0]
        panels = [(ax, None) for ax in grid]
    times = [max(num(r.doc, "step.average_s"), num(r.doc, "step.worst_s"))
             for r in sweep.records]
    tmax = max(times)
    tmin = min([t for t in times if t > 0] or [tmax])
    scale, unit = time_unit(tmax)
    for (ax, ax_split), backend in zip(panels, sweep.backends):
        for i, label in enumerate(labels):
            r = sweep.record(label, backend)
            if r is None:
                x = tmin * scale if facets else tmax * scale * 0.01
                ax.text(x, i, "no result for this backend", va="center",
                        fontsize=7.5, color="#888888", style="italic")
                continue
            worst_differs, rows, h = rows_of(r, any_worst)
            bad = label in sweep.infeasible
            for which, dy in rows:
                total, parts = parts_of(r.doc, which)
                if facets:
                    # Log facet: one bar per step from a floor below the fastest point; the
                    # split facet: the four parts in % of this step.
                    floor = tmin * scale / 3
                    style = bar_style(STEP_COLOR if which == "average" else "white", which,
                                      bad)
                    if which == "worst" and not bad:
                        style["edgecolor"] = "#333333"
                    ax.barh(i + dy, total * scale - floor, left=floor, height=h, **style)
                    end = total * scale
                    left = 0.0
                    for key, _, color in COMPONENTS:
                        w = 100.0 * parts[key] / total if total > 0 else 0.0
                        ax_split.barh(i + dy, w, left=left, height=h,
                                      **bar_style(color, which, bad))
                        left += w
                    text_x = end * 1.06
                else:
                    left = 0.0
                    for key, _, color in COMPONENTS:
                        w = parts[key] * scale
                        ax.barh(i + dy, w, left=left, height=h, **bar_style(color, which, bad))
                        left += w
                    text_x = max(left, total * scale) + tmax * scale * 0.01
                ax.text(text_x, i + dy,
                        annotation(sweep, r, which, total, scale, unit, worst_differs),
                        va="center", fontsize=7.5,
                        color=INFEASIBLE_EDGE if bad and which == "average" else "black")
        ax.set_title(f"{backend}: step time" if facets else f"backend: {backend}", fontsize=10)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        if facets:
            from matplotlib.ticker import FuncFormatter
            ax.set_xscale("log")
            ax.set_xlim(tmin * scale / 3, tmax * scale * 12)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xlabel(f"step time ({unit}, log scale)")
            ax_split.set_title(f"{backend}: where the step goes", fontsize=10)
            ax_split.set_xlim(0, 100)
            ax_split.set_xlabel(f"% of the step (means over {sweep.device}s)")
            ax_split.grid(axis="x", color="#e0e0e0", linewidth=0.6)
            ax_split.set_axisbelow(True)
        else:
            ax.set_xlabel(f"step time ({unit}); parts are means over {sweep.device}s")
            ax.set_xlim(0, tmax * scale * 1.32)
    first = panels[0][0]
    label_points(first, sweep, labels)
    handles = [Patch(facecolor=c, label=t) for _, t, c in COMPONENTS]
    if facets:
        handles.insert(0, Patch(facecolor=STEP_COLOR, label="step time (log scale)"))
    if any_worst:
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="///",
                             label="worst step (hatched)"))
    handles += mark_legend_handles(sweep)
    last = panels[-1][1] if facets else panels[-1][0]
    last.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                frameon=False)
    what = "average and worst step" if any_worst else "average step"
    measured = [b for b in sweep.backends if b not in ("analytic", "sim")]
    verb = ("predicted" if not measured else "measured" if len(measured) == nb
            else "predicted and measured")
    spread_note = (f"; the slowest point is {spread(sweep):.0f}x the fastest: step time on a log "
                   f"scale, its parts in %" if facets else "")
    fig.suptitle(f"{name}: {verb} optimizer step time per sweep point ({what}){spread_note}",
                 fontsize=11.5)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-strategies")
