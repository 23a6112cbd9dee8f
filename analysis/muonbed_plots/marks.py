"""Marks of points whose numbers need a second look, shared by every plot kind (issue 22): where
two backends of one point disagree by more than 10 %, where a point's memory exceeds one GPU's
(or CPU rank's) and so could not run, which fidelity each backend's point was computed at, and
whether a rank is a GPU or a CPU process. Every plot labels its points through Sweep.display,
which appends these marks, and every footer carries trust_text's explanation of them."""

from .common import fmt_bytes, get, num

AGREE_PCT = 10.0            # |difference| above this is a disagreement (core's cross_check)
DISAGREE_MARK = "≠"
INFEASIBLE_MARK = "⊘"
INFEASIBLE_COLOR = "#B0B0B0"
INFEASIBLE_EDGE = "#C44E52"
INFEASIBLE_HATCH = "xxxx"
PREDICTED = ("analytic", "sim")
CPU_BACKENDS = ("mpi",)     # executors that run each rank as a CPU process


def disagreements(records):
    """{point label: text} for the points two backends of which disagree by more than AGREE_PCT.
    The records' own cross_check entries decide (core writes them on predicted records); for
    points none of whose records carries the field (files written before it), the analytic and
    sim records present are compared here the same way: analytic's average step against sim's."""
    out = {}
    labels = []
    for r in records:
        if r.label not in labels:
            labels.append(r.label)
    for label in labels:
        recs = [r for r in records if r.label == label]
        checked = [r for r in recs if r.cross_check is not None]
        if checked:
            for r in checked:
                for c in r.cross_check:
                    if not c["agree"]:
                        other = c["backend"] + (f"/{c['fidelity']}" if c.get("fidelity") else "")
                        out.setdefault(label, f"{backend_text(r)} vs {other} "
                                              f"{c['difference_pct']:+.1f} %")
            continue
        by = {r.backend: r for r in recs}
        a, s = by.get("analytic"), by.get("sim")
        if a is not None and s is not None and num(s.doc, "step.average_s") > 0:
            pct = (num(a.doc, "step.average_s") / num(s.doc, "step.average_s") - 1) * 100
            if abs(pct) > AGREE_PCT:
                out[label] = f"analytic vs {backend_text(s)} {pct:+.1f} % (compared here)"
    return out


def infeasible(records):
    """{point label: text} for the points some record of which says its fullest rank exceeds
    the memory of one GPU (memory.feasible false); points without a memory block are unknown,
    never marked."""
    out = {}
    for r in records:
        if r.feasible is False and r.label not in out:
            m = r.memory
            out[r.label] = (f"peak {fmt_bytes(m['peak_bytes'])} > {fmt_bytes(m['limit_bytes'])}"
                            f" on {m['over_ranks']} of {r.world} {r.device}s")
    return out


def backend_text(r):
    return f"{r.backend}/{r.fidelity}" if r.fidelity and r.backend == "sim" else r.backend


def device_word(records):
    """'GPU' when every record's ranks are GPUs, else 'rank' (a CPU process; a rank is also
    always correct for a GPU, so a mix says rank)."""
    return "GPU" if all(r.device == "GPU" for r in records) else "rank"


def is_cpu_record(doc, cluster_is_cpu):
    """Whether a record's ranks are CPU processes: a CPU executor (mpi), or a predicted record of
    a cluster whose 'GPU' is a CPU rank (the profiles `muonbed calibrate --backend mpi` writes
    name it cpu-rank: inline in the resolved configuration, or in the named cluster file,
    which cluster_is_cpu(name) reads)."""
    if doc.get("backend") in CPU_BACKENDS:
        return True
    if "cpu-rank" in str(get(doc, "provenance.resolved_config") or ""):
        return True
    return cluster_is_cpu(str(get(doc, "setup.cluster") or ""))


def fidelity_text(sweep):
    """Each backend's fidelity, naming the points of every fidelity but the most common one
    when a backend mixes them (sim.fidelity: auto picks per point); measured backends have
    none."""
    parts = []
    for b in sweep.backends:
        recs = [r for r in sweep.records if r.backend == b]
        fids = {}
        for r in recs:
            fids.setdefault(r.fidelity or "measured", []).append(r.label)
        if len(fids) == 1:
            parts.append(f"{b} {next(iter(fids))}")
            continue
        ordered = sorted(fids.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        text = f"{b} {ordered[0][0]} ({len(ordered[0][1])} points)"
        for fid, labels in ordered[1:]:
            names = [sweep.short.get(x, x) for x in labels]
            shown = ", ".join(names[:4]) + (f" +{len(names) - 4} more" if len(names) > 4 else "")
            text += f", {fid}: {shown}"
        parts.append(text)
    return "fidelity: " + "; ".join(parts)


def mixed_fidelity(sweep, backend):
    return len({r.fidelity for r in sweep.records if r.backend == backend}) > 1


def trust_text(sweep):
    """The footer's line on fidelity and marks: what ≠ and ⊘ mean and how many points carry
    them, and how many infeasible points --skip-infeasible left out."""
    parts = [fidelity_text(sweep)]
    if sweep.disagree:
        parts.append(f"{DISAGREE_MARK} {len(sweep.disagree)} point(s) where two backends "
                     f"disagree by > {AGREE_PCT:g} % (trust neither without a look)")
    if sweep.infeasible:
        parts.append(f"{INFEASIBLE_MARK} {len(sweep.infeasible)} point(s) exceed "
                     f"{sweep.device} memory (would not run; grey where drawn)")
    if sweep.skipped_infeasible:
        parts.append(f"{sweep.skipped_infeasible} point(s) exceeding {sweep.device} memory "
                     f"left out (--skip-infeasible)")
    return " · ".join(parts)


def mark_legend_handles(sweep):
    """Legend entries of the marks a bar figure of `sweep` shows: the infeasible bars' patch and
    the disagreement mark, each only where some point has it."""
    from matplotlib.patches import Patch
    handles = []
    if sweep.infeasible:
        handles.append(Patch(facecolor=INFEASIBLE_COLOR, edgecolor=INFEASIBLE_EDGE,
                             hatch=INFEASIBLE_HATCH,
                             label=f"{INFEASIBLE_MARK} exceeds {sweep.device} memory "
                                   f"(would not run)"))
    if sweep.disagree:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"{DISAGREE_MARK} backends disagree by > {AGREE_PCT:g} %"))
    return handles


def label_points(ax, sweep, labels, fontsize=8.5):
    """The sweep points as the y axis of a horizontal-bar figure, first on top: each point's
    short label with its marks, in the infeasible colour when it exceeds memory."""
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels([sweep.display(lab) for lab in labels], fontsize=fontsize)
    for tick, label in zip(ax.get_yticklabels(), labels):
        if label in sweep.infeasible:
            tick.set_color(INFEASIBLE_EDGE)
    ax.invert_yaxis()
    ax.set_ylabel("sweep point")
