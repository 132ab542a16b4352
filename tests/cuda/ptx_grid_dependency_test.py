#!/usr/bin/env python3
"""Our batch norm kernels may run under programmatic dependent launch (PDL,
DDPRUN_CUDA_PDL=1; src/train/cuda/launch_stream.h): such a kernel can be
scheduled while the kernel before it on the stream is still running, so it
must wait for it (griddepcontrol.wait, kernel_support.cuh's
gridDependencyStart) before it touches global memory. Checked in the PTX nvcc
makes for sm_90 of bn_nhwc.cu and bn_nhwc_sums.cu (no GPU needed):

  - every kernel of those files but the max pool (launchBnActPoolForward
    launches it without PDL) executes griddepcontrol.wait before its first
    load, store or atomic that may reach global memory (the global state
    space or a generic address), and griddepcontrol.launch_dependents after
    the wait;
  - the kernels of pool_kernels.cu, never launched with PDL, are not checked.

A kernel added to those files without the wait fails here, before a GPU run
could show a race.

Usage: ptx_grid_dependency_test.py FILE.ptx [FILE.ptx ...] (CMake passes the
PTX objects of the ddprun_bn_nhwc_ptx target; other files are ignored).
"""
import os
import re
import sys
import unittest

PTX_FILES = [a for a in sys.argv[1:] if a.endswith(".ptx")]
CHECKED_SOURCES = ("bn_nhwc", "bn_nhwc_sums")  # the PTX files' stems
EXEMPT = ("maxPoolVecKernel",)
EXPECTED = ("forwardKernel", "backwardDataKernel", "invStdKernel", "partialSumsKernel",
            "chunkSumsKernel", "finishKernel", "foldedSumsKernel")
ENTRY = re.compile(r"^\.(?:visible\s+)?\.?entry\s+(\S+?)\(", re.M)
# A memory access that may reach global memory: ld/st/atom/red in the global
# state space or through a generic address (no state space named); the
# kernel's parameters, shared, local and constant memory do not count.
MEMORY_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st|atom|red)(?:\.[a-z0-9]+)*)\s", re.M)
NOT_GLOBAL = {"param", "shared", "local", "const"}
WAIT = re.compile(r"^\s*griddepcontrol\.wait\s*;", re.M)
TRIGGER = re.compile(r"^\s*griddepcontrol\.launch_dependents\s*;", re.M)


def first_memory_access(body):
    """The first ld/st/atom/red that may touch global memory, or None."""
    for m in MEMORY_OP.finditer(body):
        if not NOT_GLOBAL & set(m.group(1).split(".")[1:]):
            return m
    return None


def entries(text):
    marks = [(m.start(), m.group(1)) for m in ENTRY.finditer(text)]
    for i, (start, name) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(text)
        yield name, text[start:end]


def checked_files():
    return [p for p in PTX_FILES
            if os.path.splitext(os.path.basename(p))[0] in CHECKED_SOURCES]


class GridDependencyWait(unittest.TestCase):
    def test_files_given(self):
        names = sorted(os.path.basename(p) for p in checked_files())
        self.assertEqual(len(names), len(CHECKED_SOURCES),
                         "expected the PTX of %s, got %s" % (CHECKED_SOURCES, PTX_FILES))

    def test_every_kernel_waits_before_global_memory(self):
        seen = set()
        for path in checked_files():
            with open(path) as f:
                text = f.read()
            for name, body in entries(text):
                if any(e in name for e in EXEMPT):
                    continue
                for k in EXPECTED:
                    if k in name:
                        seen.add(k)
                wait = WAIT.search(body)
                self.assertIsNotNone(wait, "%s: %s never executes griddepcontrol.wait"
                                     % (os.path.basename(path), name))
                trigger = TRIGGER.search(body)
                self.assertIsNotNone(trigger, "%s: %s never lets its dependents launch"
                                     % (os.path.basename(path), name))
                self.assertLess(wait.start(), trigger.start(),
                                "%s: %s lets its dependents launch before it waits"
                                % (os.path.basename(path), name))
                first = first_memory_access(body)
                if first:
                    self.assertLess(wait.start(), first.start(),
                                    "%s: %s touches global memory before its "
                                    "griddepcontrol.wait:\n%s"
                                    % (os.path.basename(path), name,
                                       body[first.start():first.start() + 120]))
        self.assertEqual(sorted(seen), sorted(EXPECTED),
                         "kernels missing from the PTX: %s" % sorted(set(EXPECTED) - seen))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
