#!/usr/bin/python3
"""Runs one adversarial case of cases.tsv (see its header) in a fresh temporary folder and checks
the exit code, the expected and forbidden output, and that nothing crashed: no "internal error",
traceback, std::bad_alloc, abort, sanitizer report or timeout.

  run_case.py CASES.tsv NAME MUONBED_BINARY SOURCE_DIR

Exit 0 pass, 1 fail, 77 skipped (the case needs matplotlib, which /usr/bin/python3 lacks, or its
command printed "SKIP: ..." and exited 77: it needs mpirun, or root)."""

import os
import re
import subprocess
import sys
import tempfile

TIMEOUT_S = 300
CRASH = re.compile(r"internal error|Traceback \(most recent|bad_alloc|terminate called|"
                   r"Segmentation fault|Aborted|core dumped|AddressSanitizer|LeakSanitizer|"
                   r"runtime error:|The Impossible Did Happen")


def main():
    cases, name, muonbed, src = sys.argv[1:5]
    muonbed, src = os.path.abspath(muonbed), os.path.abspath(src)
    here = os.path.dirname(os.path.abspath(cases))
    for line in open(cases, encoding="utf-8"):
        if line.startswith("#") or not line.strip():
            continue
        fields = line.rstrip("\n").split("\t")
        if fields[0] == name:
            break
    else:
        print(f"FAIL: no case {name} in {cases}")
        return 1
    _, code, expect, forbid, command = fields
    plot = f"/usr/bin/python3 {os.path.join(src, 'analysis', 'plot.py')}"
    if "$PLOT" in command and subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"],
                                              capture_output=True).returncode != 0:
        print("SKIP: matplotlib is not importable by /usr/bin/python3")
        return 77
    env = dict(os.environ, MUONBED=muonbed, PLOT=plot, SRC=src, H=here)
    with tempfile.TemporaryDirectory(prefix=f"muonbed-hostile-{name}-") as work:
        try:
            res = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True,
                                 text=True, errors="replace", timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"FAIL: {name} ran over {TIMEOUT_S} s (a hang)\n  command: {command}")
            return 1
    out = res.stdout + res.stderr
    if res.returncode == 77 and "SKIP:" in out:
        print(out.strip().splitlines()[-1])  # a case that needs what this machine lacks
        return 77
    problems = []
    if res.returncode != int(code):
        problems.append(f"exit {res.returncode}, expected {code}")
    if not re.search(expect, out, re.MULTILINE):
        problems.append(f"output lacks /{expect}/")
    if forbid != "-" and re.search(forbid, out):
        problems.append(f"output has the forbidden /{forbid}/")
    crash = CRASH.search(out)
    if crash:
        problems.append(f"a crash: '{crash.group(0)}'")
    tail = "\n".join(out.splitlines()[-30:])
    if problems:
        print(f"FAIL: {name}: " + "; ".join(problems) + f"\n  command: {command}\n--- output "
              f"(last 30 lines) ---\n{tail}")
        return 1
    print(f"PASS: {name}\n{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
