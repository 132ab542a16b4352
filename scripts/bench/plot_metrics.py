#!/usr/bin/env python3
"""Loss and accuracy curves from `train --metrics` files, from a clone:

    python scripts/bench/plot_metrics.py m.jsonl [other.jsonl ...] [-o curves.png] [--labels a,b]

The same as `python -m ddprun.plot` of an installed wheel (python/ddprun/plot.py,
imported here from this source tree). Needs matplotlib; without it exits 2
saying how to get it (it never installs anything).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from ddprun import plot  # noqa: E402

if __name__ == "__main__":
    sys.exit(plot.main(prog="plot_metrics.py"))
