#!/usr/bin/env python3
"""Summarises a cargo test log (scripts/test.sh writes target/test-output.log).

Prints, per crate, how many tests passed, failed and were ignored, then the
names of the ignored and failed tests, and exits 1 when any test failed, a
test binary did not report a result (it crashed or hung), or no test ran.

    python3 scripts/test-summary.py target/test-output.log
"""
import os
import re
import sys
from collections import OrderedDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNING = re.compile(r"^\s+Running (?:unittests )?(\S+) \(([^)]+)\)")
DOCTESTS = re.compile(r"^\s+Doc-tests (\S+)")
RESULT = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")
CRITERION_OK = re.compile(r"^Success$")  # a criterion benchmark run once in test mode
TEST_LINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)(?:, (.*))?$")
CRATE_DIRS = ["kernels", "engine", "scheduler", "server", "tools", "benches", "tests", "testenv"]


def crate_of(source, binary):
    """The workspace crate a test binary belongs to."""
    if source.startswith("src/"):
        stem = os.path.basename(binary).rsplit("-", 1)[0]
        if stem.startswith("spindle_") and stem.replace("spindle_", "", 1) in CRATE_DIRS:
            return stem.replace("spindle_", "", 1)
        # A binary's own unit tests: the crate whose directory holds its source.
        owners = [d for d in CRATE_DIRS if os.path.isfile(os.path.join(ROOT, d, source))]
        return owners[0] if len(owners) == 1 else stem
    name = os.path.basename(source)
    for d in CRATE_DIRS:
        if os.path.isfile(os.path.join(ROOT, d, source)) or os.path.isfile(os.path.join(ROOT, d, "tests", name)):
            return d
    return "?"


def summarise(lines):
    """(per-crate counts, ignored names, failed names, binaries without a result).

    Criterion benchmarks (run once each by `cargo test --all-targets`) print
    `Success` per benchmark and no `test result:` line: each counts as passed.
    """
    counts = OrderedDict()
    ignored, failed, unreported = [], [], []
    current = None
    benches_ok = 0

    def close(block, ok):
        if block is None:
            return
        if ok:
            counts.setdefault(block[0], [0, 0, 0])[0] += ok
        else:
            unreported.append(block[1])

    for line in lines:
        m = RUNNING.match(line)
        d = DOCTESTS.match(line)
        if m or d:
            close(current, benches_ok)
            benches_ok = 0
            current = (crate_of(m.group(1), m.group(2)), m.group(1)) if m else (d.group(1).replace("spindle_", ""), "doc-tests")
            continue
        if current is not None and CRITERION_OK.match(line):
            benches_ok += 1
            continue
        t = TEST_LINE.match(line)
        if t and current is not None:
            if t.group(2) == "ignored":
                ignored.append(f"{current[0]}: {t.group(1)} ({t.group(3) or 'no reason given'})")
            elif t.group(2) == "FAILED":
                failed.append(f"{current[0]}: {t.group(1)}")
            continue
        r = RESULT.match(line)
        if r and current is not None:
            c = counts.setdefault(current[0], [0, 0, 0])
            for i in range(3):
                c[i] += int(r.group(i + 2))
            current = None
            benches_ok = 0
    close(current, benches_ok)
    return counts, ignored, failed, unreported


def main():
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        counts, ignored, failed, unreported = summarise(f.read().splitlines())
    print("\n== Test summary (every cargo run above) ==")
    print(f"{'crate':<12}{'passed':>8}{'failed':>8}{'ignored':>9}")
    total = [0, 0, 0]
    for crate, c in counts.items():
        print(f"{crate:<12}{c[0]:>8}{c[1]:>8}{c[2]:>9}")
        total = [a + b for a, b in zip(total, c)]
    print(f"{'total':<12}{total[0]:>8}{total[1]:>8}{total[2]:>9}")
    for title, names in (("ignored", ignored), ("FAILED", failed), ("no result (crashed or hung)", unreported)):
        if names:
            print(f"\n{title}:")
            for n in names:
                print(f"  {n}")
    bad = total[1] > 0 or failed or unreported or total[0] == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
