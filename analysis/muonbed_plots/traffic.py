"""<exp>-traffic: bytes per step by link class (intra-node vs network) and the peak memory of
the fullest rank."""

from .common import aw, bytes_unit, differ, get, num


def plot_traffic(p, sweep, name):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    labels = sweep.labels
    nb = len(sweep.backends)
    hatches = [None, "...", "xxx", "\\\\\\", "+++"]
    height = min(14.0, max(3.8, 2.0 + 0.3 * len(labels) * max(1, nb)))
    fig = p.new_figure(15, height)
    ax_t, ax_m = fig.subplots(1, 2, sharey=True)

    def total(r, i):
        return aw(r.doc, "traffic.intra_node_bytes")[i] + aw(r.doc, "traffic.network_bytes")[i]
    bmax = max([max(total(r, 0), total(r, 1)) for r in sweep.records] + [1])
    bscale, bunit = bytes_unit(bmax)
    mems = [num(x, "memory.peak_bytes") for r in sweep.records for x in r.doc.get("ranks") or []]
    mscale, munit = bytes_unit(max(mems + [1]))
    h = 0.8 / max(1, nb)
    any_worst = False
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
            ranks = r.doc.get("ranks") or []
            if ranks:
                top = max(ranks, key=lambda x: num(x, "memory.peak_bytes"))
                low = min(num(x, "memory.peak_bytes") for x in ranks) / mscale
                static = num(top, "memory.static_bytes") / mscale
                peak = num(top, "memory.peak_bytes") / mscale
                ax_m.barh(y, static, height=h, color="#8172B3", hatch=hatch, edgecolor="#3B3161",
                          linewidth=0)
                ax_m.barh(y, max(0.0, peak - static), left=static, height=h, color="#CCB9E8",
                          hatch=hatch, edgecolor="#3B3161", linewidth=0)
                ax_m.plot([low, low], [y - h / 2, y + h / 2], color="black", linewidth=1.2)
    ax_t.set_xlabel(f"bytes moved per average step, all GPUs ({bunit})")
    ax_t.set_title("traffic by link class", fontsize=10)
    ax_m.set_xlabel(f"peak memory of a rank ({munit})")
    ax_m.set_title("peak memory of the fullest rank (black line: emptiest rank)", fontsize=10)
    for ax in (ax_t, ax_m):
        ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_xlim(0, ax.get_xlim()[1] * 1.04)
    ax_t.set_yticks(range(len(labels)))
    ax_t.set_yticklabels([sweep.short[l] for l in labels], fontsize=8.5)
    ax_t.invert_yaxis()
    ax_t.set_ylabel("sweep point")
    handles = [Patch(facecolor="#55A868", label="intra-node (NVLink / PCIe)"),
               Patch(facecolor="#C44E52", label="network (NICs)")]
    if any_worst:
        handles.append(Line2D([], [], marker="D", color="black", linestyle="none",
                              markersize=4, label="worst step, total"))
    handles += [Patch(facecolor="#8172B3", label="static: params, grads, optimizer state"),
                Patch(facecolor="#CCB9E8", label="transient buffers at the peak")]
    if nb > 1:
        for b, backend in enumerate(sweep.backends):
            handles.append(Patch(facecolor="#DDDDDD", hatch=hatches[b % len(hatches)],
                                 edgecolor="#444444", linewidth=0, label=f"backend {backend}"))
    ax_m.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5,
                frameon=False)
    models = sorted({str(get(r.doc, "traffic.model") or "?") for r in sweep.records})
    fig.suptitle(f"{name}: traffic per step by link class and peak memory per rank",
                 fontsize=11.5)
    p.footer(fig, sweep, "traffic model: " + "/".join(models))
    p.save(fig, f"{name}-traffic")
