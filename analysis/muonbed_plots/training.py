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
                    label_points, mark_legend_handles)

PARTS = [
    ("compute", "forward + backward compute", "#4C72B0"),
    ("communication", "exposed communication and bubble", "#DD8452"),
    ("optimizer", "exposed optimizer step", "#C44E52"),
]
ORIGIN = {"analytic": "analytic model", "sim": "simulated", "mpi": "measured (CPU ranks)",
          "nccl": "measured (GPU)", "cuda_loopback": "measured (all ranks on one GPU)"}


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
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    labels = [lab for lab in sweep.labels
              if any(sweep.record(lab, b) is not None and
                     isinstance(sweep.record(lab, b).doc.get("training"), dict)
                     for b in sweep.backends)]
    backends = [b for b in sweep.backends
                if any(sweep.record(lab, b) is not None for lab in labels)]
    nb = len(backends)
    # One row per point, one thin bar per backend inside it (the first backend on top).
    slot = 0.8 / nb
    height = min(40.0, max(4.5, 2.6 + 0.22 * len(labels) * max(1, nb)))
    fig = p.new_figure(17.0, height)
    grid = fig.add_gridspec(2, 1, height_ratios=[height - 1.0, 1.0])
    ax = fig.add_subplot(grid[0, 0])
    legend_ax = fig.add_subplot(grid[1, 0])
    legend_ax.axis("off")
    widest = 100.0
    for i, label in enumerate(labels):
        for k, backend in enumerate(backends):
            y = i - 0.4 + slot * (k + 0.5)
            r = sweep.record(label, backend)
            adamw = num(r.doc, "training.adamw_step_s") if r is not None else 0.0
            step, parts = parts_of(r.doc) if r is not None else (0.0, {})
            if r is None or not isinstance(r.doc.get("training"), dict) or adamw <= 0 \
                    or step <= 0:
                ax.text(1, y, f"{backend}: no training result with an AdamW reference",
                        va="center", fontsize=6.5, color="#888888", style="italic")
                continue
            bad = label in sweep.infeasible
            left = 0.0
            for key, _, color in PARTS:
                w = 100.0 * parts[key] / adamw
                style = ({"color": INFEASIBLE_COLOR, "hatch": INFEASIBLE_HATCH,
                          "edgecolor": INFEASIBLE_EDGE, "linewidth": 0.3} if bad else
                         {"color": color, "edgecolor": "white", "linewidth": 0.3})
                ax.barh(y, w, left=left, height=slot * 0.9, **style)
                left += w
            widest = max(widest, left)
            overhead = 100.0 * (step / adamw - 1)
            text = (f"{ORIGIN.get(backend, backend)}: {fmt_time(step)}  (AdamW "
                    f"{fmt_time(adamw)}, Muon {overhead:+.1f} %, MFU "
                    f"{100 * num(r.doc, 'training.mfu'):.0f} %)")
            if k == 0 and label in sweep.disagree:
                text += f"  {DISAGREE_MARK} {sweep.disagree[label]}"
            if k == 0 and bad:
                text += f"  ⊘ exceeds {sweep.device} memory"
            ax.text(left + 1.0, y, text, va="center", fontsize=6.3,
                    color=INFEASIBLE_EDGE if bad else "black")
    ax.axvline(100.0, color="black", linewidth=1.0, linestyle="--")
    ax.set_xlim(0, widest * 2.4)
    ax.set_xlabel("% of the same point's AdamW step (dashed: the AdamW step)")
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    label_points(ax, sweep, labels, fontsize=7.0)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    handles = [Patch(facecolor=c, label=t) for _, t, c in PARTS]
    handles.append(Line2D([0], [0], color="black", linestyle="--",
                          label="the AdamW step (same point, AdamW for every parameter)"))
    handles += mark_legend_handles(sweep)
    legend_ax.legend(handles=handles, loc="center", ncol=2, fontsize=7.5, frameon=False)
    order = ", ".join(f"{ORIGIN.get(b, b)}" for b in backends)
    fig.suptitle(f"{name}: the training step with Muon in % of the AdamW step (compute, exposed "
                 f"communication, exposed optimizer); bars per point: {order}", fontsize=11)
    p.footer(fig, sweep)
    p.save(fig, f"{name}-training")
