"""Figure style and the Plotter every plot kind draws through: sizes, fonts, the provenance
footer, and deterministic, safely named output files."""

import os
import stat

from .common import file_part, get, short_hash
from .marks import trust_text


class Plotter:
    """Where and how figures are written. `excluded` (files the loader left out) is said in every
    footer, so a figure never hides that it shows part of a sweep. With keep_figures the figures
    stay open in `figures` (tests read what was drawn)."""

    def __init__(self, plt, out_dir, formats, max_ranks, excluded=0, keep_figures=False):
        self.plt = plt
        self.out_dir = out_dir
        self.formats = formats
        self.max_ranks = max_ranks
        self.excluded = excluded
        self.keep_figures = keep_figures
        self.figures = {}
        self.written = []

    def footer(self, fig, sweep, extra=""):
        recs = sweep.records
        versions = sorted({str(get(r.doc, "provenance.muonbed_version") or "?") for r in recs})
        hashes = sorted({short_hash(str(get(r.doc, "provenance.git_hash") or "unknown"))
                         for r in recs})
        setup = recs[0].doc.get("setup", {}) if recs else {}
        text = (f"muonbed {'/'.join(versions)} · git {'/'.join(hashes)} · backends: "
                f"{', '.join(sweep.backends)} · cluster {setup.get('cluster', '?')} · model "
                f"{setup.get('model', '?')}")
        if extra:
            text += " · " + extra
        if self.excluded:
            text += (f" · NOT SHOWN: {self.excluded} result file(s) that failed checks "
                     f"(see plot.py's warnings)")
        # Second line: each point's fidelity and what the marks on point labels mean.
        text += "\n" + trust_text(sweep)
        # As the figure's supxlabel, so constrained layout reserves room for it.
        fig.supxlabel(text, x=0.005, ha="left", fontsize=6.5, color="#555555")

    def new_figure(self, width, height, **kw):
        fig = self.plt.figure(figsize=(width, height))
        fig.set_layout_engine("constrained", h_pad=0.06, w_pad=0.06)
        return fig

    def save(self, fig, name):
        """Writes fig as out_dir/NAME.EXT; NAME is made one safe file name (file_part), so no
        experiment name can write outside out_dir. OSError propagates to main()."""
        name = file_part(name)
        os.makedirs(self.out_dir, exist_ok=True)
        if self.keep_figures:
            self.figures[name] = fig
        for ext in self.formats:
            path = os.path.join(self.out_dir, f"{name}.{ext}")
            meta = {"Software": None} if ext == "png" else {}
            if ext == "pdf":
                meta = {"CreationDate": None, "ModDate": None, "Producer": None,
                        "Creator": None}
            elif ext == "svg":
                meta = {"Date": None, "Creator": None}
            write_file(path, lambda f, ext=ext, meta=meta:
                       fig.savefig(f, format=ext, dpi=150, metadata=meta))
            self.written.append(path)
        if not self.keep_figures:
            self.plt.close(fig)


def write_file(path, write):
    """Writes a file as muonbed's C++ writer does (core/base/output_files.hpp): a symbolic link is
    followed (the file it points to is written, the link stays); a character device or FIFO is
    written through in place; a regular file is replaced atomically (a temporary file beside it,
    then rename), so a reader never sees half a figure; anything else is refused. `write` gets
    a binary file object."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        with open(real, "wb") as f:
            write(f)
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path}: not a regular file (a folder or device stands there); "
                      "choose another output folder")
    temp = f"{real}.muonbed-tmp-{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        if st is not None:
            os.chmod(temp, stat.S_IMODE(st.st_mode))
        os.replace(temp, real)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def setup_style(matplotlib):
    rc = matplotlib.rcParams
    rc["font.family"] = "DejaVu Sans"
    rc["font.size"] = 9
    rc["axes.titlesize"] = 10
    rc["axes.labelsize"] = 9
    rc["figure.dpi"] = 100
    rc["savefig.dpi"] = 150
    rc["pdf.fonttype"] = 42  # TrueType in PDFs, editable and searchable text
    rc["svg.hashsalt"] = "muonbed"
    rc["hatch.linewidth"] = 0.6
    rc["axes.spines.top"] = False
    rc["axes.spines.right"] = False
