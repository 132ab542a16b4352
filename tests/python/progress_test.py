"""python/ddprun/progress.py without the agent: the JSON it writes is the
format of include/ddprun/common/progress_file.h (every field, the optional
ones left out, a NaN loss left out), written atomically (no temporary file
left), a no-op outside ddprun, rate-limited unless forced, False (never an
exception) when the file cannot be written. The agent reading it is
tests/integration/progress_test.py."""
import json
import math
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from ddprun import progress  # noqa: E402


class Progress(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_progress_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.path = os.path.join(self.tmp, "progress.json")
        self.saved = os.environ.get(progress.ENV)
        os.environ[progress.ENV] = self.path
        progress._last.update(path=None, at=-math.inf)

    def tearDown(self):
        if self.saved is None:
            os.environ.pop(progress.ENV, None)
        else:
            os.environ[progress.ENV] = self.saved

    def read(self):
        with open(self.path) as f:
            return json.load(f)

    def test_every_field(self):
        self.assertTrue(progress.report(41, loss=0.53, epoch=2, samples_per_second=812.5,
                                        total_steps=1000, time=1714564800.25))
        self.assertEqual(self.read(), {"step": 41, "epoch": 2, "loss": 0.53,
                                       "samples_per_second": 812.5, "total_steps": 1000,
                                       "time": 1714564800.25})
        self.assertEqual(os.listdir(self.tmp), ["progress.json"])

    def test_only_the_step_and_the_time_now(self):
        self.assertTrue(progress.report(3))
        got = self.read()
        self.assertEqual(set(got), {"step", "time"})
        self.assertEqual(got["step"], 3)
        self.assertGreater(got["time"], 1.5e9)

    def test_a_loss_that_is_not_finite_is_left_out(self):
        progress.report(5, loss=float("nan"), samples_per_second=float("inf"))
        self.assertNotIn("loss", self.read())
        self.assertNotIn("samples_per_second", self.read())

    def test_writes_are_rate_limited_unless_forced(self):
        progress.report(1, force=True)
        progress.report(2)  # right after: skipped (the interval is 0.5 s)
        self.assertEqual(self.read()["step"], 1)
        progress.report(3, force=True)
        self.assertEqual(self.read()["step"], 3)

    def test_a_no_op_outside_ddprun(self):
        del os.environ[progress.ENV]
        self.assertTrue(progress.report(1))
        self.assertEqual(os.listdir(self.tmp), [])

    def test_an_unwritable_file_returns_false(self):
        os.environ[progress.ENV] = os.path.join(self.tmp, "missing-dir", "progress.json")
        self.assertFalse(progress.report(1, force=True))

    def test_bad_counts_are_the_callers_bug(self):
        with self.assertRaises(ValueError):
            progress.report(-1)
        with self.assertRaises(ValueError):
            progress.report(2.5)
        with self.assertRaises(ValueError):
            progress.report(1, total_steps=0)
        with self.assertRaises(TypeError):
            progress.report(True)
        self.assertTrue(progress.report(4.0, force=True))  # a whole float is fine
        self.assertEqual(self.read()["step"], 4)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
