"""<exp>-throughput: seed 002's per-GPU reporting (parameters updated/s, computation TFLOP/s and
communication GB/s per GPU), each for the average and the worst step. The FLOP rate counts
useful work, each matrix's Newton-Schulz once (throughput.computation.useful_tflops_per_gpu),
when the records carry it: replicated strategies repeat NS on every GPU, and counting the
repeats would reward the waste. Older records have only the executed rate, and say so."""

from .common import BACKEND_COLORS, aw, count_unit, differ, get, num
from .marks import INFEASIBLE_COLOR, INFEASIBLE_EDGE, INFEASIBLE_HATCH, label_points

USEFUL = "throughput.computation.useful_tflops_per_gpu"
EXECUTED = "throughput.computation.tflops_per_gpu"


def plot_throughput(p, sweep, name):
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter
    labels = sweep.labels
    dev = sweep.device
    useful = all(get(r.doc, USEFUL) is not None for r in sweep.records)
    flops_title = ("computation: useful FLOP rate per " + dev + "\n(each matrix once)"
                   if useful else "computation: optimizer FLOP rate per " + dev +
                   "\n(as executed: replicated work counted)")
    metrics = [
        ("throughput.params_per_s_per_gpu",
         f"end to end: parameters updated\nper second per {dev}", f"params/s per {dev}"),
        (USEFUL if useful else EXECUTED, flops_title,
         f"{'useful ' if useful else ''}TFLOP/s per {dev}"),
        ("throughput.communication.GBps_per_gpu",
         f"communication: bytes sent\nper second per {dev}", f"GB/s per {dev}"),
    ]
    nb = len(sweep.backends)
    # Worst-step bars only when some point's worst step differs from its average one.
    show_worst = any(differ(num(r.doc, "step.worst_s"), num(r.doc, "step.average_s"))
                     for r in sweep.records)
    per = 2 if show_worst else 1
    bars = per * nb
    height = min(14.0, max(3.8, 2.0 + 0.16 * len(labels) * bars + 0.2 * len(labels)))
    fig = p.new_figure(16, height)
    axes = fig.subplots(1, 3, sharey=True, squeeze=False)[0]
    h = 0.8 / bars
    for ax, (path, title, xlabel) in zip(axes, metrics):
        vmax = max([max(aw(r.doc, path)) for r in sweep.records] + [0])
        scale, prefix = count_unit(vmax) if "params" in path else (1.0, "")
        for i, label in enumerate(labels):
            bad = label in sweep.infeasible
            for b, backend in enumerate(sweep.backends):
                r = sweep.record(label, backend)
                if r is None:
                    continue
                avg, worst = aw(r.doc, path)
                color = BACKEND_COLORS[b % len(BACKEND_COLORS)]
                y0 = i - 0.4 + h * (per * b) + h / 2
                if bad:  # exceeds memory: a rate it could never reach, drawn grey
                    ax.barh(y0, avg / scale, height=h, color=INFEASIBLE_COLOR,
                            hatch=INFEASIBLE_HATCH, edgecolor=INFEASIBLE_EDGE, linewidth=0.3)
                else:
                    ax.barh(y0, avg / scale, height=h, color=color, edgecolor="white",
                            linewidth=0.3)
                if show_worst:
                    ax.barh(y0 + h, worst / scale, height=h, color="white",
                            edgecolor=INFEASIBLE_EDGE if bad else color, hatch="////",
                            linewidth=0.8)
        ax.set_title(title, fontsize=9.5)
        words = {"k": "thousand ", "M": "million ", "G": "billion ", "T": "trillion "}
        xlabel = xlabel.replace("params/s", f"{words.get(prefix, '')}params/s")
        positive = [v for r in sweep.records for v in aw(r.doc, path) if v > 0]
        # Log scale when the points span more than 50x (bars here are not stacked).
        log = bool(positive) and max(positive) / min(positive) > 50
        ax.set_xlabel(xlabel + (" (log scale)" if log else ""))
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(positive) / scale / 2, max(positive) / scale * 1.5)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        elif vmax > 0:
            ax.set_xlim(0, vmax / scale * 1.08)
    label_points(axes[0], sweep, labels)
    handles = []
    for b, backend in enumerate(sweep.backends):
        color = BACKEND_COLORS[b % len(BACKEND_COLORS)]
        if show_worst:
            handles.append(Patch(facecolor=color, label=f"{backend}: average step"))
            handles.append(Patch(facecolor="white", edgecolor=color, hatch="////",
                                 label=f"{backend}: worst step"))
        else:
            handles.append(Patch(facecolor=color, label=f"{backend}"))
    if sweep.infeasible:
        handles.append(Patch(facecolor=INFEASIBLE_COLOR, edgecolor=INFEASIBLE_EDGE,
                             hatch=INFEASIBLE_HATCH, label=f"⊘ exceeds {dev} memory"))
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                    frameon=False, title=None if show_worst else "average = worst step",
                    title_fontsize=7.5)
    fig.suptitle(f"{name}: per-{dev} throughput, "
                 f"{'average and worst step' if show_worst else 'every step alike'} "
                 f"(computation and communication apart)", fontsize=11.5)
    p.footer(fig, sweep, "FLOP rate: " + ("useful, NS of each matrix counted once" if useful
                                          else "as executed (records without a useful rate)"))
    p.save(fig, f"{name}-throughput")
