#!/usr/bin/env python3
"""Run MXNet 1.9.1's own unit tests against oxnet and fail if a test that passed before fails now.

The tests and their harness live outside the repository, in ``../shared/mxnet-tests`` (MXNet's
files unmodified). ``passing.txt`` beside this script lists every test known to pass with oxnet;
the list only grows. This script runs the given selections (the core and extended ones by
default, and ``beyond_selection.txt`` beside this script: tests they leave out that oxnet passes)
through the harness, prints its per-area table, and exits 1 when a listed test did not pass.
``--update`` adds the tests that pass now to the list (it never removes any).

    python tests/mxnet_compat/check.py                 # what CI runs
    python tests/mxnet_compat/check.py --update        # after making more tests pass
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PASSING = os.path.join(HERE, "passing.txt")
# MXNet tests the shared selections leave out (as contrib, sparse, ...) that oxnet passes: run
# beside the selections so that they keep passing.
BEYOND = os.path.join(HERE, "beyond_selection.txt")


def read_list(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", default=os.path.join(os.path.dirname(REPO), "shared", "mxnet-tests"),
                    help="folder of MXNet's tests and run_mxnet_tests.py (default: ../shared/mxnet-tests)")
    ap.add_argument("--selection", action="append",
                    help="selection file names in that folder (default: core and extended)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--update", action="store_true", help="add the tests that pass now to passing.txt")
    ap.add_argument("--require", action="store_true", help="fail (instead of skipping) when the tests are absent")
    args = ap.parse_args()

    harness = os.path.join(args.tests, "run_mxnet_tests.py")
    if not os.path.exists(harness):
        message = "MXNet's tests are not at %s (pass --tests)" % args.tests
        if args.require:
            sys.exit(message)
        print("skipped: " + message)
        return
    selections = args.selection or ["core_selection.txt", "extended_selection.txt", BEYOND]
    with tempfile.TemporaryDirectory() as work:
        summary = os.path.join(work, "summary.json")
        command = [sys.executable, harness, "--module", "oxnet", "--jobs", str(args.jobs),
                   "--json-out", summary, "--work-dir", os.path.join(work, "logs")]
        for selection in selections:
            command += ["--selection", os.path.join(args.tests, selection)]
        run = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        report = run.stdout
        if not os.path.exists(summary):
            print(report)
            sys.exit("the harness wrote no summary (exit status %d)" % run.returncode)
        with open(summary) as f:
            results = json.load(f)["tests"]

    # The per-area table and the closing line; the per-test list of failures is long.
    table_end = report.find("not passing")
    print(report[:table_end] if table_end >= 0 else report)
    passed = {test for test, result in results.items() if result.get("outcome") == "passed"}
    expected = read_list(PASSING)
    regressed = [test for test in expected if test in results and test not in passed]
    missing = [test for test in expected if test not in results]
    print("passing now: %d of %d run; listed as passing: %d" % (len(passed), len(results), len(expected)))

    if args.update:
        merged = sorted(set(expected) | passed)
        with open(PASSING, "w") as f:
            f.write("# MXNet 1.9.1 unit tests that pass with oxnet (tests/mxnet_compat/check.py); only grows.\n")
            f.write("\n".join(merged) + "\n")
        print("passing.txt: %d tests (%d new)" % (len(merged), len(merged) - len(expected)))
    for test in missing:
        print("NOT RUN (listed as passing): %s" % test)
    for test in regressed:
        print("REGRESSED: %s: %s" % (test, (results[test].get("message") or "")[-400:]))
    if regressed or missing:
        sys.exit("%d listed test(s) no longer pass" % (len(regressed) + len(missing)))


if __name__ == "__main__":
    main()
