"""<exp>-traffic: bytes per step by link class (intra-node vs network) and the peak memory of
the fullest rank against the memory one GPU (or CPU rank) has.

The memory panel draws the record's memory block when it has one (issue 22: the fullest rank's
peak under a named model, split into parameters, master weights, gradients, optimizer state,
transients and activations, with the cluster's limit): the limit as a red line, and the points
over it marked ⊘. Older records have only the optimizer's own memory per rank (static state +
transient buffers), drawn as before with the emptiest rank as a black tick."""

from .common import aw, bytes_unit, differ, fmt_bytes, get, num
from .marks import INFEASIBLE_EDGE, label_points

MEMORY_PARTS = [("parameters", "parameters", "#4C72B0"),
                ("master_weights", "master weights", "#8172B3"),
                ("gradients", "gradients", "#64B5CD"),
                ("optimizer_state", "optimizer state", "#CCB974"),
                ("transients", "transient buffers", "#CCB9E8"),
                ("activations", "activations", "#DD8452")]
LIMIT_COLOR = "#C44E52"


def plot_traffic(p, sweep, name):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    labels = sweep.labels
    nb = len(sweep.backends)
    dev = sweep.device
    hatches = [None, "...", "xxx", "\\\\\\", "+++"]
    height = min(14.0, max(3.8, 2.0 + 0.3 * len(labels) * max(1, nb)))
    fig = p.new_figure(15, height)
    ax_t, ax_m = fig.subplots(1, 2, sharey=True)

    def total(r, i):
        return aw(r.doc, "traffic.intra_node_bytes")[i] + aw(r.doc, "traffic.network_bytes")[i]
    bmax = max([max(total(r, 0), total(r, 1)) for r in sweep.records] + [1])
    bscale, bunit = bytes_unit(bmax)
    modelled = [r for r in sweep.records if r.memory is not None]
    mems = [num(x, "memory.peak_bytes") for r in sweep.records for x in r.doc.get("ranks") or []]
    mems += [r.memory["peak_bytes"] for r in modelled]
    limits = sorted({r.memory["limit_bytes"] for r in modelled if r.memory["limit_bytes"] > 0})
    mscale, munit = bytes_unit(max(mems + limits + [1]))
    h = 0.8 / max(1, nb)
    any_worst = False
    parts_used = set()
    old_style = False
    for i, label in enumerate(labels):
        for b, backend in enumerate(sweep.backends):
            r = sweep.record(label, backend)
            if r is None:
                continue
            y = i - 0.4 + h * b + h / 2
            hatch = hatches[b % len(hatches)]
            intra = aw(r.doc, "traffic.intra_node_bytes")[0] / bscale
            net = aw(r.doc, "traffic.network_bytes")[0] / bscale
            ax_t.barh(y, intra, height=h, color="#55A868", hatch=hatch, edgecolor="#1E4D2B",
                      linewidth=0)
            ax_t.barh(y, net, left=intra, height=h, color="#C44E52", hatch=hatch,
                      edgecolor="#5A1A1C", linewidth=0)
            if differ(total(r, 1), total(r, 0)):
                any_worst = True
                ax_t.plot([total(r, 1) / bscale], [y], marker="D", color="black", markersize=4)
            if r.memory is not None:
                draw_memory_model(ax_m, r, y, h, hatch, mscale, parts_used,
                                  say_over=b == first_backend(sweep, label))
                if len(limits) > 1:  # limits differ between points: one tick per bar
                    lim = r.memory["limit_bytes"] / mscale
                    ax_m.plot([lim, lim], [y - h / 2, y + h / 2], color=LIMIT_COLOR,
                              linewidth=1.6)
            elif r.doc.get("ranks"):
                old_style = True
                ranks = r.doc["ranks"]
                top = max(ranks, key=lambda x: num(x, "memory.peak_bytes"))
                low = min(num(x, "memory.peak_bytes") for x in ranks) / mscale
                static = num(top, "memory.static_bytes") / mscale
                peak = num(top, "memory.peak_bytes") / mscale
                ax_m.barh(y, static, height=h, color="#8172B3", hatch=hatch, edgecolor="#3B3161",
                          linewidth=0)
                ax_m.barh(y, max(0.0, peak - static), left=static, height=h, color="#CCB9E8",
                          hatch=hatch, edgecolor="#3B3161", linewidth=0)
                ax_m.plot([low, low], [y - h / 2, y + h / 2], color="black", linewidth=1.2)
    if len(limits) == 1:
        ax_m.axvline(limits[0] / mscale, color=LIMIT_COLOR, linewidth=1.4, linestyle="--")
    ax_t.set_xlabel(f"bytes moved per average step, all {dev}s ({bunit})")
    ax_t.set_title("traffic by link class", fontsize=10)
    models = sorted({r.memory["model"] for r in modelled})
    ax_m.set_xlabel(f"peak memory of a rank ({munit})")
    if modelled:
        ax_m.set_title(f"peak memory of the fullest rank ({'/'.join(models)}) against one "
                       f"{dev}'s memory", fontsize=10)
    else:
        ax_m.set_title("optimizer memory of the fullest rank (black line: emptiest rank)",
                       fontsize=10)
    for ax in (ax_t, ax_m):
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        # Room on the right of the memory panel for the "ranks over" notes.
        room = 1.3 if ax is ax_m and sweep.infeasible else 1.04
        ax.set_xlim(0, ax.get_xlim()[1] * room)
    label_points(ax_t, sweep, labels)
    handles = [Patch(facecolor="#55A868", label="intra-node (NVLink / PCIe)"),
               Patch(facecolor="#C44E52", label="network (NICs)")]
    if any_worst:
        handles.append(Line2D([], [], marker="D", color="black", linestyle="none",
                              markersize=4, label="worst step, total"))
    handles += [Patch(facecolor=c, label=t) for k, t, c in MEMORY_PARTS if k in parts_used]
    if "unsplit" in parts_used:
        handles.append(Patch(facecolor="#BBBBBB", label="peak, not split into parts"))
    if old_style:
        handles += [Patch(facecolor="#8172B3", label="static: params, grads, optimizer state"),
                    Patch(facecolor="#CCB9E8", label="transient buffers at the peak")]
    if limits:
        shown = fmt_bytes(limits[0]) if len(limits) == 1 else "per point"
        handles.append(Line2D([], [], color=LIMIT_COLOR, linewidth=1.4,
                              linestyle="--" if len(limits) == 1 else "-",
                              label=f"memory of one {dev} ({shown})"))
    if sweep.infeasible:
        handles.append(Patch(facecolor="white", edgecolor=INFEASIBLE_EDGE, linewidth=1.5,
                             label=f"⊘ over it: exceeds {dev} memory"))
    if nb > 1:
        for b, backend in enumerate(sweep.backends):
            handles.append(Patch(facecolor="#DDDDDD", hatch=hatches[b % len(hatches)],
                                 edgecolor="#444444", linewidth=0, label=f"backend {backend}"))
    ax_m.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                frameon=False)
    traffic_models = sorted({str(get(r.doc, "traffic.model") or "?") for r in sweep.records})
    fig.suptitle(f"{name}: traffic per step by link class and peak memory per rank",
                 fontsize=11.5)
    p.footer(fig, sweep, "traffic model: " + "/".join(traffic_models) +
             (" · memory model: " + "/".join(models) if models else ""))
    p.save(fig, f"{name}-traffic")


def first_backend(sweep, label):
    """Index of the first backend with a record of the point (its bar carries the notes)."""
    return next(b for b, be in enumerate(sweep.backends) if sweep.record(label, be))


def draw_memory_model(ax, r, y, h, hatch, mscale, parts_used, say_over):
    """The fullest rank's peak split into its parts (the breakdown when the record has one),
    outlined red when it exceeds the limit, with how many ranks do when say_over."""
    m = r.memory
    breakdown = m.get("breakdown") or {}
    left = 0.0
    for key, _, color in MEMORY_PARTS:
        v = num(breakdown, key) / mscale
        if v <= 0:
            continue
        parts_used.add(key)
        ax.barh(y, v, left=left, height=h, color=color, hatch=hatch, edgecolor="#333333",
                linewidth=0)
        left += v
    peak = m["peak_bytes"] / mscale
    if left < peak * 0.999:  # no breakdown, or one that does not add up: the rest unsplit
        parts_used.add("unsplit")
        ax.barh(y, peak - left, left=left, height=h, color="#BBBBBB", hatch=hatch,
                edgecolor="#333333", linewidth=0)
    if not m["feasible"]:
        ax.barh(y, peak, height=h, facecolor="none", edgecolor=INFEASIBLE_EDGE, linewidth=1.5)
    if not m["feasible"] and say_over:
        ax.text(peak, y, f"  ⊘ {m['over_ranks']} of {r.world} ranks over", va="center",
                fontsize=7, color=INFEASIBLE_EDGE)
