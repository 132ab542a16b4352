#!/usr/bin/env python3
"""The memory accesses of the NHWC batch norm kernels (src/train/cuda/bn_nhwc.cu,
bn_nhwc_sums.cu)
have the width they were written for, checked in the PTX nvcc makes of them
(no GPU needed).

Each thread of forwardKernel, backwardDataKernel and the backward sums
(partialSumsKernel with BackwardSumsOp) owns V consecutive channels of a row
(V = 2 or 4) and should load and store them as one access of sizeof(T) * V
bytes. nvcc 13.0 split a plain vector store at p + (row * c + ch) into one
scalar store per element (st.global.f32 x4 for float, st.global.v2.u16 x2 for
bf16/fp16): a quarter of the width, 4x the store instructions, on every
output the kernels write. This test fails on that PTX.

Checked per kernel (3 kernels x float/bf16/fp16 x V = 2, 4: 18 entries):
  - every global store but the double partial sums (st.global.f64) is one
    st.global of exactly sizeof(T) * V bytes, with no cache operator or
    strength qualifier (__stwb/__stcg compile to strong stores);
  - every vector load (ld.global.vN) is sizeof(T) * V bytes, there are at
    least 4 of them (one loop step's rows), and 16-bit storage has no scalar
    16-bit loads.

Usage: ptx_vector_width_test.py FILE.ptx [FILE.ptx ...] (CMake passes the PTX
of bn_nhwc.cu and bn_nhwc_sums.cu; any non-.ptx argument is ignored).
"""
import re
import sys
import unittest

PTX_FILES = [a for a in sys.argv[1:] if a.endswith(".ptx")]

KERNELS = ("forwardKernel", "backwardDataKernel", "BackwardSumsOp")
# The Itanium-mangled first template arguments: <T, V>.
TYPE_BYTES = {"f": 4, "13__nv_bfloat16": 2, "6__half": 2}
ENTRY = re.compile(r"^\.(?:visible\s+)?\.?entry\s+(\S+?)\(", re.M)
ACCESS = re.compile(r"^\s*(?:@%p\d+\s+)?(st|ld)\.global((?:\.[a-z0-9]+)*)\s", re.M)
# Cache operators and strengths: a plain st.global has none.
STORE_QUALIFIERS = ("wb", "cg", "cs", "wt", "volatile", "relaxed", "release", "mmio")
TYPE_WIDTH = {"u8": 1, "b8": 1, "s8": 1, "u16": 2, "b16": 2, "s16": 2, "f16": 2,
              "u32": 4, "b32": 4, "s32": 4, "f32": 4,
              "u64": 8, "b64": 8, "s64": 8, "f64": 8}


def entries(text):
    """(mangled name, body) of every kernel in a PTX file."""
    marks = [(m.start(), m.group(1)) for m in ENTRY.finditer(text)]
    for i, (start, name) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(text)
        yield name, text[start:end]


def accesses(body):
    """(kind 'st'/'ld', qualifiers, vector count, element type, bytes)."""
    for m in ACCESS.finditer(body):
        quals = m.group(2).strip(".").split(".")
        vec = next((int(q[1:]) for q in quals if re.fullmatch(r"v\d", q)), 1)
        elem = next(q for q in reversed(quals) if q in TYPE_WIDTH)
        yield m.group(1), quals, vec, elem, vec * TYPE_WIDTH[elem]


def target(name):
    """(kernel, T bytes, V) for a kernel under check, else None."""
    kernel = next((k for k in KERNELS if k in name), None)
    if kernel is None or ("partialSumsKernel" in name) != (kernel == "BackwardSumsOp"):
        return None
    m = re.search(r"(?:forwardKernel|backwardDataKernel|partialSumsKernel)"
                  r"I(f|13__nv_bfloat16|6__half)Li(\d)E", name)
    if not m or int(m.group(2)) < 2:
        return None
    return kernel, TYPE_BYTES[m.group(1)], int(m.group(2))


class BnNhwcVectorWidth(unittest.TestCase):
    def test_ptx_given(self):
        self.assertTrue(PTX_FILES,
                        "give the PTX of bn_nhwc.cu and bn_nhwc_sums.cu (CMake's ptx_vector_width test does)")

    def test_stores_and_loads_are_one_access_per_thread_and_row(self):
        checked = set()
        for path in PTX_FILES:
            with open(path) as f:
                text = f.read()
            for name, body in entries(text):
                t = target(name)
                if t is None:
                    continue
                kernel, tbytes, v = t
                width = tbytes * v
                checked.add((kernel, tbytes, v, name))
                with self.subTest(kernel=name):
                    stores = [a for a in accesses(body) if a[0] == "st" and a[3] != "f64"]
                    self.assertTrue(stores, "no activation store found")
                    for _, quals, _, _, nbytes in stores:
                        self.assertEqual(nbytes, width, "store of %d bytes (%s), not %d: split by "
                                         "the compiler?" % (nbytes, ".".join(quals), width))
                        hints = [q for q in quals if q in STORE_QUALIFIERS]
                        self.assertEqual(hints, [], "not a plain store: %s" % ".".join(quals))
                    vloads = [a for a in accesses(body) if a[0] == "ld" and a[2] > 1]
                    self.assertGreaterEqual(len(vloads), 4, "fewer vector loads than rows a step")
                    for _, quals, _, _, nbytes in vloads:
                        self.assertEqual(nbytes, width, "vector load of %d bytes (%s), not %d"
                                         % (nbytes, ".".join(quals), width))
                    if tbytes == 2:
                        scalar16 = [a for a in accesses(body)
                                    if a[0] == "ld" and a[2] == 1 and TYPE_WIDTH[a[3]] == 2]
                        self.assertFalse(scalar16, "16-bit activations loaded one at a time")
        kinds = {(k, b, v) for k, b, v, _ in checked}
        self.assertEqual(len(kinds), 3 * 2 * 2,
                         "expected each of %s for 4- and 2-byte storage at V = 2, 4; found %s"
                         % (", ".join(KERNELS), sorted(kinds)))
        self.assertEqual(len(checked), 3 * 3 * 2, "expected 18 kernels (float, bf16, fp16)")


    def test_max_pool_moves_v_channels_per_access(self):
        # maxPoolVecKernel (max_pool.cuh), our max pool (PoolStored, pool_kernels.cu) and the
        # fused stem (PoolBnAct, bn_nhwc.cu): each tap one vector load of V elements, the
        # pooled output one vector store; the winning taps are bytes.
        pat = re.compile(r"maxPoolVecKernelI(f|13__nv_bfloat16|6__half)Li(\d)E.*?"
                         r"(PoolStored|PoolBnAct)")
        checked = set()
        for path in PTX_FILES:
            with open(path) as f:
                text = f.read()
            for name, body in entries(text):
                m = pat.search(name)
                if not m or int(m.group(2)) < 2:
                    continue
                tbytes, v = TYPE_BYTES[m.group(1)], int(m.group(2))
                checked.add((m.group(3), tbytes, v))
                with self.subTest(kernel=name):
                    stores = [a for a in accesses(body) if a[0] == "st" and a[4] > 1]
                    self.assertTrue(stores, "no pooled output store found")
                    for _, quals, _, _, nbytes in stores:
                        self.assertEqual(nbytes, tbytes * v, "store of %d bytes (%s)" % (
                            nbytes, ".".join(quals)))
                    vloads = [a for a in accesses(body) if a[0] == "ld" and a[2] > 1]
                    self.assertTrue(vloads, "no vector load of a tap")
                    for _, quals, _, _, nbytes in vloads:
                        self.assertEqual(nbytes, tbytes * v, "load of %d bytes (%s)" % (
                            nbytes, ".".join(quals)))
                    if tbytes == 2:
                        self.assertFalse([a for a in accesses(body) if a[0] == "ld" and
                                          a[2] == 1 and TYPE_WIDTH[a[3]] == 2],
                                         "16-bit activations loaded one at a time")
        self.assertEqual({k for k, _, _ in checked}, {"PoolStored", "PoolBnAct"},
                         "give the PTX of pool_kernels.cu and bn_nhwc.cu")


class Parsing(unittest.TestCase):
    """The PTX reading itself, on text written here."""

    def test_widths_and_targets(self):
        body = ("\tst.global.v2.u32 \t[%rd1], {%r1, %r2};\n"
                "\t@%p3 st.global.f32 \t[%rd2+4], %f1;\n"
                "\tld.global.v4.u16 \t{%rs1, %rs2, %rs3, %rs4}, [%rd3];\n"
                "\tst.global.f64 \t[%rd4], %fd1;\n")
        got = [(k, n) for k, _, _, _, n in accesses(body)]
        self.assertEqual(got, [("st", 8), ("st", 4), ("ld", 8), ("st", 8)])
        self.assertEqual(
            target("_ZN6ddprun5train4cuda43_GLOBAL__N_113forwardKernelI13__nv_bfloat16Li4EEEvPKv"),
            ("forwardKernel", 2, 4))
        self.assertEqual(
            target("_ZN_17partialSumsKernelIfLi2ENS2_14BackwardSumsOpIfLi2EEEEEvT1_lllPd"),
            ("BackwardSumsOp", 4, 2))
        self.assertIsNone(target("_ZN_17partialSumsKernelIfLi4ENS2_7StatsOpIfLi4EEEEEvT1_lllPd"))
        self.assertIsNone(target("_ZN_13forwardKernelIfLi1EEEvPKv"))
        text = ".visible .entry _Z1aPf(\n st.global.f32 [%rd1], %f1;\n}\n.entry _Z1bPf(\n}\n"
        self.assertEqual([n for n, _ in entries(text)], ["_Z1aPf", "_Z1bPf"])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
