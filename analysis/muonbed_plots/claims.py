"""<exp>-claims: claimed vs predicted speedups. User claims come from a claims file (or the
results folder); seed 000's claims are classified by muonbed itself (core/results/src/results_report.cpp
seed_claims(), one classifier for the CLI table and the plots) and listed in muonbed-run.json;
here their ratios are taken from the verified records only."""

import json
import math
import os
import re
import sys

from .common import CLAIM_TOLERANCE, get, num, split_label, yaml
from .sweep import norm_text, norm_value


class ClaimsError(Exception):
    """A claims file that cannot be read (the message says which and why)."""


def load_claims(sweep, root, claims_file):
    """Claims about this experiment, from (first found): --claims FILE, a "claims" list in the
    results JSON, a "claims" key in the resolved configuration, or claims.{yaml,json} /
    seed_claims.yaml in the results folder or next to the experiment file. Each claim is a map:
      {name, baseline: <point selector>, target: <point selector>, speedup: 8 | [16, 24] |
       "16-24", metric: average|worst, backend: optional, source: text, tolerance: 0.2,
       experiment: optional name filter}
    A point selector is a label fragment ("strategy.name=owner") or a map of sweep keys."""
    def from_doc(doc):
        if isinstance(doc, dict):
            for key in ("claims", "seed_claims"):
                if isinstance(doc.get(key), list):
                    return doc[key]
            exp = sweep.records[0].experiment
            if isinstance(doc.get(exp), (list, dict)):  # {experiment: [claims]} layout
                sub = doc[exp]
                return sub if isinstance(sub, list) else from_doc(sub)
            if isinstance(doc.get("experiments"), dict) and exp in doc["experiments"]:
                return from_doc({"claims": doc["experiments"][exp]}) or \
                    from_doc(doc["experiments"][exp])
        if isinstance(doc, list):
            return doc
        return None

    def read(path):
        """The parsed claims file; ClaimsError saying why it cannot be read."""
        try:
            if os.path.getsize(path) > (1 << 20):
                raise ClaimsError(f"{path} is larger than 1 MiB; a claims file is a short list")
            with open(path, "rb") as f:
                text = f.read(1 << 20).decode("utf-8")
        except OSError as e:
            raise ClaimsError(f"cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ClaimsError(f"{path} is not UTF-8 text (binary data?)") from None
        try:
            if path.endswith(".json"):
                return json.loads(text)
            if yaml is None:
                raise ClaimsError(f"PyYAML is missing; cannot read claims in {path} "
                                  f"(apt-get install python3-yaml, or write them as JSON)")
            return yaml.safe_load(text)
        except ClaimsError:
            raise
        except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
            raise ClaimsError(f"{path} is not valid JSON: {str(e)[:120]}") from None
        except Exception as e:  # yaml.YAMLError and its kin
            raise ClaimsError(f"{path} is not valid YAML: {str(e)[:160]}") from None

    if claims_file:
        claims = from_doc(read(claims_file))
        if not claims:
            raise ClaimsError(f"{claims_file} holds no list of claims (a list, or a map with a "
                              f"'claims' list)")
        return claims, claims_file
    for r in sweep.records:
        c = from_doc({"claims": r.doc["claims"]}) if isinstance(r.doc.get("claims"), list) \
            else None
        if c:
            return c, os.path.basename(r.path)
    if yaml is not None:
        for r in sweep.records:
            text = get(r.doc, "provenance.resolved_config")
            if isinstance(text, str) and "claims" in text:
                try:
                    c = from_doc(yaml.safe_load(text))
                except Exception:
                    c = None
                if c and c is not None and isinstance(c, list):
                    return c, "resolved config"
    dirs = [root]
    f = get(sweep.records[0].doc, "provenance.experiment_file")
    if f:
        dirs.append(os.path.dirname(f) or ".")
    for d in dirs:
        for n in ("claims.json", "claims.yaml", "seed_claims.yaml", "seed_claims.json"):
            path = os.path.join(d, n)
            if os.path.isfile(path):
                try:
                    c = from_doc(read(path))
                except ClaimsError as e:
                    print(f"plot: warning: claims not read: {e}", file=sys.stderr)
                    c = None
                if c:
                    return c, path
    return [], None


def select(sweep, selector, backend):
    """Records of `backend` matching a point selector (label fragment or map)."""
    if isinstance(selector, dict):
        want = [(str(k), norm_value(v)) for k, v in selector.items()]
    else:
        want = [(k, norm_text(v)) for k, v in split_label(str(selector))]
    out = []
    for label in sweep.labels:
        r = sweep.record(label, backend)
        if r is None:
            continue
        params = {k: norm_text(v) for k, v in r.params}
        ok = True
        for k, v in want:
            if k in params:
                ok = ok and params[k] == v
            elif k in ("strategy", "strategy.name"):
                ok = ok and norm_text(r.strategy) == v
            else:
                ok = False
        if ok:
            out.append(r)
    return out


def claimed_range(value, tolerance):
    """(low, high) of a claimed speedup: a pair, a "16-24" text, or one number within
    +-tolerance. ValueError for anything else, or a range that is not 0 < low <= high finite."""
    if isinstance(value, bool):
        raise ValueError("a claim is a number, not true/false")
    tolerance = float(tolerance)
    if not (math.isfinite(tolerance) and 0 <= tolerance < 10):
        raise ValueError(f"tolerance {tolerance} is outside 0..10")
    if isinstance(value, (list, tuple)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        if isinstance(value, str):
            m = re.match(r"^\s*~?\s*([\d.]+)\s*(?:x|×)?\s*(?:-|–|to)\s*([\d.]+)", value)
            if m:
                value = (float(m.group(1)), float(m.group(2)))
            else:
                m = re.match(r"^\s*~?\s*([\d.]+)", value)
                if m:
                    value = float(m.group(1))
        if isinstance(value, tuple):
            lo, hi = value
        else:
            v = float(value)
            lo, hi = v / (1 + tolerance), v * (1 + tolerance)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"claimed range {lo}..{hi} is not 0 < low <= high")
    return lo, hi


def evaluate_claims(sweep, claims):
    rows = []
    for i, c in enumerate(claims):
        if not isinstance(c, dict):
            continue
        exp = c.get("experiment")
        if exp and exp != sweep.records[0].experiment:
            continue
        name = str(c.get("name") or c.get("claim") or c.get("id") or f"claim {i + 1}")
        source = str(c.get("source") or "")
        metric = str(c.get("metric") or "average")
        claimed = c.get("speedup", c.get("claimed", c.get("claimed_speedup")))
        base_sel = c.get("baseline")
        target_sel = c.get("target", c.get("candidate", c.get("point")))
        if claimed is None or base_sel is None or target_sel is None:
            rows.append((name, source, "-", "-", str(claimed), "-", "incomplete claim"))
            continue
        try:
            lo, hi = claimed_range(claimed, c.get("tolerance", CLAIM_TOLERANCE))
        except (TypeError, ValueError):
            rows.append((name, source, "-", "-", str(claimed), "-", "unreadable claim"))
            continue
        backends = [c["backend"]] if c.get("backend") else sweep.backends
        for backend in backends:
            base = select(sweep, base_sel, backend)
            target = select(sweep, target_sel, backend)
            if len(base) != 1 or len(target) != 1:
                rows.append((name, source, backend, "-", fmt_claim(claimed), "-",
                             f"selector matched {len(base)} baseline / {len(target)} target "
                             f"points"))
                continue
            key = "step.worst_s" if metric == "worst" else "step.average_s"
            tb, tt = num(base[0].doc, key), num(target[0].doc, key)
            pred = tb / tt if tt > 0 else float("nan")
            verdict = ("holds" if lo <= pred <= hi else
                       ("predicted below claim" if pred < lo else "predicted above claim"))
            rows.append((name, source, backend,
                         f"{sweep.short[base[0].label]} → {sweep.short[target[0].label]}",
                         fmt_claim(claimed), f"{pred:.3g}×", verdict))
    return rows


def fmt_claim(v, tolerance=CLAIM_TOLERANCE):
    """A claimed value as shown: a range as is, a single number with the tolerance it is
    checked with."""
    if isinstance(v, (list, tuple)):
        return f"{v[0]}–{v[1]}×"
    if isinstance(v, (int, float)):
        return f"{v:g}× ±{tolerance * 100:g} %"
    return str(v)


def seed000_rows(sweep, manifest):
    """Rows of seed 000's claims as `muonbed run` classified them (manifest["seed_claims"]):
    each names its baseline and target by point identity; the ratio comes from the records
    verified here, and a row whose records are not among them is left out."""
    rows = []
    entries = manifest.get("seed_claims") if isinstance(manifest, dict) else None
    if not isinstance(entries, list):
        return rows
    by_id = {(r.point_id, r.backend): r for r in sweep.records}
    for e in entries:
        if not isinstance(e, dict):
            continue
        base = by_id.get((e.get("baseline_point_id"), e.get("backend")))
        target = by_id.get((e.get("target_point_id"), e.get("backend")))
        try:
            lo, hi = float(e["low"]), float(e["high"])
        except (KeyError, TypeError, ValueError):
            continue
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            continue
        what, claimed = str(e.get("claim", "?")), str(e.get("claimed", "?"))
        backend = base.backend + (f" ({base.fidelity})" if base and base.fidelity else "") \
            if base else str(e.get("backend", "?"))
        if base is None or target is None:
            rows.append((what, "seed 000", backend, "-", claimed, "-", "point missing"))
            continue
        tb, tt = num(base.doc, "step.average_s"), num(target.doc, "step.average_s")
        if not tt > 0:
            rows.append((what, "seed 000", backend, "-", claimed, "-", "zero step time"))
            continue
        pred = tb / tt
        verdict = ("holds" if lo <= pred <= hi else
                   ("predicted below claim" if pred < lo else "predicted above claim"))
        rows.append((what, "seed 000", backend,
                     f"{sweep.short[base.label]} → {sweep.short[target.label]}", claimed,
                     f"{pred:.3g}×", verdict))
    return rows


def plot_claims(p, sweep, name, rows, source):
    header = ("claim", "source", "backend", "baseline → target", "claimed", "predicted",
              "verdict")
    widths = [max(len(str(x[i])) for x in rows + [header]) for i in range(len(header))]
    print(f"\nclaims vs predicted ({name}, claims from {source}):")
    for row in [header] + rows:
        print("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
    print()
    import textwrap

    def wrap(text, n):
        # At word boundaries; "A → B" breaks before the arrow.
        return "\n".join(textwrap.fill(part, n, break_long_words=False)
                         for part in text.replace(" → ", "\n→ ").split("\n"))
    cells = [[wrap(str(x), 44) for x in row] for row in rows]
    lines = [max(c.count("\n") + 1 for c in row) for row in cells]
    height = min(14.0, 1.3 + 0.3 * (sum(lines) + 1))
    fig = p.new_figure(12, height)
    ax = fig.subplots()
    ax.axis("off")
    # Column widths from the longest line of each column (in characters).
    chars = [max(len(line) for c in [header[j]] + [row[j] for row in cells]
                 for line in str(c).split("\n")) + 2 for j in range(len(header))]
    table = ax.table(cellText=cells, colLabels=header, cellLoc="left", colLoc="left",
                     colWidths=[c / sum(chars) for c in chars], bbox=[0, 0, 1, 1])
    table.auto_set_font_size(False)
    table.set_fontsize(8.5)
    colors = {"holds": "#D9F0D3", "predicted below claim": "#F8D3D3",
              "predicted above claim": "#FFF2CC"}
    total = sum(lines) + 1
    for (i, j), cell in table.get_celld().items():
        cell.set_height((lines[i - 1] if i > 0 else 1) / total)
        if i == 0:
            cell.set_text_props(weight="bold")
            cell.set_facecolor("#EEEEEE")
        elif j == len(header) - 1:
            cell.set_facecolor(colors.get(rows[i - 1][-1], "white"))
    fig.suptitle(f"{name}: claimed vs predicted speedups (step-time ratio baseline / target)",
                 fontsize=11.5)
    p.footer(fig, sweep, "claims: " + os.path.basename(str(source)))
    p.save(fig, f"{name}-claims")
