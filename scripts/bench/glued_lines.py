#!/usr/bin/env python3
"""Glued console lines of a launcher: N workers each print L distinct lines
(print(), so block-buffered into a pipe, as in a real job) and the launcher's
stdout+stderr is read back from one pipe. A console line is whole when it is
exactly one worker line; it is glued when it holds parts of several.

    scripts/bench/glued_lines.py build/bin/ddprun --standalone
    scripts/bench/glued_lines.py /opt/ddprun-test/venv-torch2/bin/torchrun --standalone  (PyTorch 2.x)

Prints one JSON line: lines expected, whole, glued, other (the launcher's own)."""
import json
import os
import re
import subprocess
import sys
import tempfile

NPROC, LINES = 4, 20000
# Each line names its rank and number and is padded, so that a cut or a
# merge of any two lines matches no worker line.
WORKER = ("import os\n"
          "r = os.environ['RANK']\n"
          "for i in range(%d):\n"
          "    print('r%%s line %%06d %%s' %% (r, i, 'x' * (20 + i %% 50)))\n")
WHOLE = re.compile(r"r([0-9]+) line (\d{6}) (x+)")


def count(text, nproc=NPROC, lines=LINES):
    """(whole, glued, other, per-rank lists of line numbers) of a console."""
    whole = glued = other = 0
    seen = {str(r): [] for r in range(nproc)}
    for line in text.splitlines():
        m = WHOLE.fullmatch(line)
        if m and len(m.group(3)) == 20 + int(m.group(2)) % 50:
            whole += 1
            seen[m.group(1)].append(int(m.group(2)))
        elif re.search(r"r[0-9]+ line \d", line):
            glued += 1
        else:
            other += 1
    return whole, glued, other, seen


def main():
    launcher = sys.argv[1:]
    if not launcher:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as d:
        w = os.path.join(d, "worker.py")
        with open(w, "w") as f:
            f.write(WORKER % LINES)
        p = subprocess.run(launcher + ["--nproc_per_node=%d" % NPROC, w], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    whole, glued, other, _ = count(p.stdout.decode(errors="replace"))
    print(json.dumps({"launcher": launcher[0], "rc": p.returncode, "expected": NPROC * LINES,
                      "whole": whole, "glued": glued, "other": other,
                      "glued_pct": round(100.0 * glued / max(1, whole + glued), 3)}))


if __name__ == "__main__":
    main()
