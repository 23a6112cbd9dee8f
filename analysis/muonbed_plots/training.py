"""<exp>-training: the training step around the optimizer (issue 24), one panel per backend, one
bar per sweep point, in % of the same point's AdamW step (the reference line at 100 %), so that
points whose steps differ by 1,000x read on one axis:

  compute        the forward and backward passes (their phases' elapsed time, the means over
                 GPUs), as far as they fit the step before the optimizer's exposed tail;
  communication  the rest of that part of the step: FSDP gathers, activation traffic, gradient
                 sync and the pipeline bubble that compute did not hide;
  optimizer      the exposed optimizer: the step after every rank's last forward, backward,
                 gather and sync (what the optimizer adds to the critical path).

The text beside each bar gives the step, the AdamW step and Muon's overhead (step / AdamW step
- 1) with where it comes from (analytic, simulated or measured). Points that exceed GPU memory are
grey and hatched; points whose backends disagree by more than 10 % carry ≠. Results without a
training section are not drawn here."""

from .common import fmt_time, get, num
from .marks import (DISAGREE_MARK, INFEASIBLE_COLOR, INFEASIBLE_EDGE, INFEASIBLE_HATCH,
                    label_points)

PARTS = [
    ("compute", "forward + backward compute", "#4C72B0"),
    ("communication", "exposed communication and bubble", "#DD8452"),
    ("optimizer", "exposed optimizer step", "#C44E52"),
]
ORIGIN = {"analytic": "analytic model", "sim": "simulated", "mpi": "measured (CPU ranks)",
          "nccl": "measured (GPU)", "loopback": "measured (one GPU)"}


def has_training(records):
    return any(isinstance(r.doc.get("training"), dict) and
               num(r.doc, "training.adamw_step_s") > 0 for r in records)


def parts_of(doc):
    """The step split into three parts that add up to it, in seconds."""
    step = num(doc, "training.step_s")
    exposed = min(step, max(0.0, num(doc, "training.exposed_optimizer_s")))
    before = step - exposed
    compute = min(before, num(doc, "training.forward_s") + num(doc, "training.backward_s"))
    return step, {"compute": compute, "communication": before - compute, "optimizer": exposed}


def plot_training(p, sweep, name):
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D
    labels = [lab for lab in sweep.labels
              if any(isinstance(get(sweep.record(lab, b).doc if sweep.record(lab, b) else {},
                                    "training"), dict) for b in sweep.backends)]
    backends = [b for b in sweep.backends
                if any(sweep.record(lab, b) is not None for lab in labels)]
    nb = len(backends)
    height = min(30.0, max(4.5, 1.9 + 0.30 * len(labels)))
    fig = p.new_figure(min(19.0, 8.5 + 6.0 * nb), height)
    # A thin row under the panels holds the legend (the text beside the bars runs to the right
    # edge, where a legend would cover it).
    grid = fig.add_gridspec(2, nb, height_ratios=[height - 0.9, 0.9])
    axes = [fig.add_subplot(grid[0, 0])]
    for b in range(1, nb):
        axes.append(fig.add_subplot(grid[0, b], sharey=axes[0]))
    legend_ax = fig.add_subplot(grid[1, :])
    legend_ax.axis("off")
    widest = 100.0
    for ax, backend in zip(axes, backends):
        for i, label in enumerate(labels):
            r = sweep.record(label, backend)
            if r is None or not isinstance(r.doc.get("training"), dict):
                ax.text(2, i, "no training result for this backend", va="center", fontsize=7,
                        color="#888888", style="italic")
                continue
            adamw = num(r.doc, "training.adamw_step_s")
            step, parts = parts_of(r.doc)
            if adamw <= 0 or step <= 0:
                ax.text(2, i, "no AdamW reference in this result", va="center", fontsize=7,
                        color="#888888", style="italic")
                continue
            bad = label in sweep.infeasible
            left = 0.0
            for key, _, color in PARTS:
                w = 100.0 * parts[key] / adamw
                style = ({"color": INFEASIBLE_COLOR, "hatch": INFEASIBLE_HATCH,
                          "edgecolor": INFEASIBLE_EDGE, "linewidth": 0.4} if bad else
                         {"color": color, "edgecolor": "white", "linewidth": 0.4})
                ax.barh(i, w, left=left, height=0.7, **style)
                left += w
            widest = max(widest, left)
            overhead = 100.0 * (step / adamw - 1)
            text = (f"{fmt_time(step)}  (AdamW {fmt_time(adamw)}, Muon {overhead:+.1f} %, "
                    f"MFU {100 * num(r.doc, 'training.mfu'):.0f} %)")
            if label in sweep.disagree:
                text += f"  {DISAGREE_MARK} {sweep.disagree[label]}"
            if bad:
                text += f"  ⊘ exceeds {sweep.device} memory"
            ax.text(left + 1.0, i, text, va="center", fontsize=6.8,
                    color=INFEASIBLE_EDGE if bad else "black")
        ax.axvline(100.0, color="black", linewidth=1.0, linestyle="--")
        ax.set_title(f"{backend}: {ORIGIN.get(backend, backend)}", fontsize=10)
        ax.set_xlabel("% of the same point's AdamW step (dashed: the AdamW step)")
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
    for ax in axes:
        ax.set_xlim(0, widest * 2.1)
    first = axes[0]
    label_points(first, sweep, labels, fontsize=7.5)
    handles = [Patch(facecolor=c, label=t) for _, t, c in PARTS]
    handles.append(Line2D([0], [0], color="black", linestyle="--",
                          label="the AdamW step (same point, AdamW for every parameter)"))
    if sweep.infeasible:
        handles.append(Patch(facecolor=INFEASIBLE_COLOR, edgecolor=INFEASIBLE_EDGE,
                             hatch=INFEASIBLE_HATCH,
                             label=f"⊘ exceeds {sweep.device} memory (would not run)"))
    if sweep.disagree:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"{DISAGREE_MARK} backends disagree by > 10 %"))
    legend_ax.legend(handles=handles, loc="center", ncol=2, fontsize=7.5, frameon=False)
    fig.suptitle(f"{name}: the training step with Muon, in % of the AdamW step "
                 f"(compute, exposed communication, exposed optimizer)", fontsize=11.5)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-training")
