"""Helpers shared by the benchmark scripts of this folder."""


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (recorded beside every figure)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"
