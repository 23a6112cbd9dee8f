"""<exp>-strategies: step time per sweep point, one panel per backend, split into computation
only, overlapped communication, exposed communication and idle; average and worst step apart."""

from .common import COMPONENTS, aw, differ, num, time_unit


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


def plot_strategies(p, sweep, name):
    from matplotlib.patches import Patch
    labels = sweep.labels
    any_worst = any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
                    for r in sweep.records)
    slot = 2 if any_worst else 1
    nb = len(sweep.backends)
    height = min(14.0, max(4.5, 1.9 + 0.42 * len(labels) * slot))
    width = 10.0 if nb == 1 else min(17.0, 7.5 + 4.2 * nb)
    fig = p.new_figure(width, height)
    axes = fig.subplots(1, nb, sharey=True, sharex=True, squeeze=False)[0]
    tmax = max(max(num(r.doc, "step.average_s"), num(r.doc, "step.worst_s"))
               for r in sweep.records)
    scale, unit = time_unit(tmax)
    for ax, backend in zip(axes, sweep.backends):
        for i, label in enumerate(labels):
            r = sweep.record(label, backend)
            if r is None:
                ax.text(tmax * scale * 0.01, i, "no result for this backend", va="center",
                        fontsize=7.5, color="#888888", style="italic")
                continue
            worst_differs = differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
            rows = [("average", -0.2), ("worst", 0.2)] if worst_differs else [("average", 0.0)]
            h = 0.38 if worst_differs else (0.5 if any_worst else 0.7)
            for which, dy in rows:
                total, parts = parts_of(r.doc, which)
                left = 0.0
                for key, _, color in COMPONENTS:
                    w = parts[key] * scale
                    ax.barh(i + dy, w, left=left, height=h, color=color,
                            hatch="///" if which == "worst" else None,
                            edgecolor="white" if which == "average" else "#333333",
                            linewidth=0.4)
                    left += w
                tag = "" if not worst_differs else ("avg " if which == "average" else "worst ")
                extra = ""
                if which == "worst":
                    extra = f" (step {int(num(r.doc, 'step.worst_step'))})"
                ax.text(max(left, total * scale) + tmax * scale * 0.01, i + dy,
                        f"{tag}{total * scale:.3g} {unit}{extra}", va="center", fontsize=7.5)
        ax.set_title(f"backend: {backend}", fontsize=10)
        ax.set_xlabel(f"step time ({unit}); parts are means over GPUs")
        ax.set_xlim(0, tmax * scale * 1.32)
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels([sweep.short[l] for l in labels], fontsize=8.5)
    axes[0].invert_yaxis()
    axes[0].set_ylabel("sweep point")
    handles = [Patch(facecolor=c, label=t) for _, t, c in COMPONENTS]
    if any_worst:
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch="///",
                             label="worst step (hatched)"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                    frameon=False)
    what = "average and worst step" if any_worst else "average step"
    measured = [b for b in sweep.backends if b not in ("analytic", "sim")]
    verb = ("predicted" if not measured else "measured" if len(measured) == nb
            else "predicted and measured")
    fig.suptitle(f"{name}: {verb} optimizer step time per sweep point ({what})",
                 fontsize=11.5)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-strategies")
