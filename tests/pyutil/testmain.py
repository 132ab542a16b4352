"""main() for the Python test scripts that ctest runs: unittest, plus ctest's
skip convention, so that a skip shows as skipped and never as a pass.

- Exit 0: every selected test passed (some may have been skipped among
  passes; each skip is printed with its reason in the unittest output).
- Exit 1: a failure or an error.
- Exit 77 (SKIP_RETURN_CODE in tests/CMakeLists.txt): nothing ran at all,
  every selected test was skipped. The reasons are printed on one line each
  ("SKIPPED: ...") so that `ctest --output-on-failure -V` says why.

Selection, for scripts that ctest runs as several entries (a part that can be
skipped on its own, like the CUDA matrix without a GPU, gets its own entry):
  script.py                       every test
  script.py Class [Class.test]    only these (unittest's names)
  script.py --exclude Class       every test but these (repeatable)
"""
import sys
import unittest

SKIP_RETURN_CODE = 77


def _flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _flatten(t)
        else:
            yield t


def _select(module, names, excluded):
    loader = unittest.defaultTestLoader
    if names:
        suite = loader.loadTestsFromNames(names, module)
    else:
        suite = loader.loadTestsFromModule(module)
    if not excluded:
        return suite

    def keep(test):
        ident = test.id().split(".", 1)[-1]  # Class.test_name
        return not any(ident == e or ident.startswith(e + ".") for e in excluded)

    return unittest.TestSuite(t for t in _flatten(suite) if keep(t))


def main(module="__main__", argv=None, verbosity=2):
    argv = list(sys.argv[1:] if argv is None else argv)
    excluded, names = [], []
    while argv:
        a = argv.pop(0)
        if a == "--exclude":
            if not argv:
                sys.exit("--exclude needs a test class or name")
            excluded.append(argv.pop(0))
        elif a.startswith("-"):
            sys.exit("unknown option %s (use: [--exclude NAME]... [NAME]...)" % a)
        else:
            names.append(a)
    mod = sys.modules[module] if isinstance(module, str) else module
    suite = _select(mod, names, excluded)
    result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
    if not result.wasSuccessful():
        sys.exit(1)
    # A class skipped in setUpClass counts as a skip but not as a test run.
    if result.skipped and len(result.skipped) >= result.testsRun:
        for test, reason in result.skipped:
            print("SKIPPED: %s: %s" % (test.id(), reason))
        sys.exit(SKIP_RETURN_CODE)
    if result.testsRun == 0:
        print("no test was selected", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
