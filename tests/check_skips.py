#!/usr/bin/env python3
"""Fails the test command when a test skipped that this machine should have run.

A test that skips for its environment (no root, no network namespaces, no netem) still counts as
passed in ctest's summary, so a green run could hide that whole areas never ran. This reads the
JUnit files ctest wrote (--output-junit) and allows a skip only when tests/allowed_skips.txt
names the test and the skip's own message says the expected reason; any other skip is an
error, printed with the message the test gave.

  tests/check_skips.py [--skip-log FILE] RESULTS.xml [RESULTS.xml ...]   check ctest's results
  tests/check_skips.py --self-test                                       check this checker

A bundle that runs several gtest tests in one process (CHUNK in tests/CMakeLists.txt) is one
ctest entry, which cannot say which of its tests skipped; so every gtest process appends its skips
to the file $DTRAIN_SKIP_LOG names (tests/test_main.cc), one "<test>\t<message>" line each, and
--skip-log reads that file; the JUnit files then add only the skips that are not gtest's.

DTRAIN_ALLOW_SKIPS=1 reports unexpected skips without failing (a developer's machine without
root; CI never sets it). The Python tests do the same inside pytest (tests/python/conftest.py:
a skip fails there when DTRAIN_FAIL_ON_SKIP=1, which tests/run.sh sets).
"""

import fnmatch
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

ALLOWLIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed_skips.txt")
# <test name or fnmatch pattern> "<text the skip message contains>"  # why CI cannot run it
ENTRY = re.compile(r'^(\S+)\s+"([^"]+)"\s+#\s*(\S.*)$')


def read_allowlist(path):
    """[(pattern, expected text, reason)]; raises ValueError naming a malformed line."""
    entries = []
    with open(path, newline="\n", errors="replace") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            match = ENTRY.match(line)
            if match is None:
                raise ValueError(f'{path}:{number}: expected \'TEST "message text"  # why CI '
                                 f"cannot run it', got: {line}")
            entries.append(match.groups())
    return entries


def skip_message(output):
    """The message gtest printed after its "Skipped" line, up to the first blank line (the
    processes a test tears down log after it, before gtest's "[  SKIPPED ]")."""
    match = re.search(r": Skipped\n(.*?)\[  SKIPPED \]", output, re.S)
    if match:
        return match.group(1).strip().split("\n\n")[0].strip()
    return output.strip()[-500:]


def skipped_tests(junit_files, outputs=None):
    """[(test name, skip message)] of every test the files record as skipped; their outputs go
    into `outputs` (name -> text) when it is given."""
    skipped = []
    for path in junit_files:
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            if case.find("skipped") is None:
                continue
            output = case.findtext("system-out") or ""
            if outputs is not None:
                outputs[case.get("name")] = output
            skipped.append((case.get("name"), skip_message(output)))
    return skipped


def logged_skips(path):
    """[(test name, skip message)] from tests/test_main.cc's record; a missing file is none."""
    if not os.path.exists(path):
        return []
    skipped = []
    with open(path, newline="\n", errors="replace") as f:
        for number, line in enumerate(f, 1):
            name, tab, message = line.rstrip("\n").partition("\t")
            if not tab or not name:
                raise ValueError(f"{path}:{number}: expected '<test>\\t<message>', got: {line!r}")
            message = re.sub(r"\\(.)",
                             lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)),
                             message)
            skipped.append((name, message.strip()))
    return skipped


def merged(skipped_in_junit, outputs, logged, log_path):
    """The record's skips, and the JUnit files' skips that are not gtest's (the record holds every
    gtest process's, under gtest's own names, which ctest's may print differently: a parameter's
    value for its index). JUnit naming gtest skips while the record names none means the record
    was not kept: an error, not a pass."""
    gtest = [skip for skip in skipped_in_junit if "[  SKIPPED ]" in outputs.get(skip[0], "")]
    if gtest and not logged:
        raise ValueError(f"ctest's results show gtest skips ({', '.join(n for n, _ in gtest)}) "
                         f"but {log_path} records none: was DTRAIN_SKIP_LOG set for the run?")
    return [skip for skip in skipped_in_junit if skip not in gtest] + logged


def unexpected(skipped, entries):
    """The skips no allowlist entry covers: [(name, message)]."""
    out = []
    for name, message in skipped:
        if not any(fnmatch.fnmatchcase(name, pattern) and text in message
                   for pattern, text, _ in entries):
            out.append((name, message))
    return out


def check(junit_files, allowlist=ALLOWLIST, report=print, skip_log=None):
    entries = read_allowlist(allowlist)
    outputs = {}
    skipped = skipped_tests(junit_files, outputs)
    if skip_log is not None:
        skipped = merged(skipped, outputs, logged_skips(skip_log), skip_log)
    bad = unexpected(skipped, entries)
    for name, message in skipped:
        if (name, message) not in bad:
            report(f"skipped, as tests/allowed_skips.txt allows: {name}: {message}")
    for name, message in bad:
        report(f"UNEXPECTED SKIP: {name}: {message}")
    if bad:
        report(f"{len(bad)} test(s) skipped that this machine should run; give the test what it "
               "needs (docs/CONTRIBUTING.md, What the tests need), or, if CI's machines truly "
               "cannot run it, add it to tests/allowed_skips.txt with the reason")
    return len(bad)


def self_test():
    junit = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="3">
  <testcase name="Net.DelayAndLoss" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>[ RUN      ] Net.DelayAndLoss
t.cc:9: Skipped
tc netem is not available on this machine's kernel: Error

2026-11-26T01:54:30Z INFO    dtrain-worker: stopping: no job here
[  SKIPPED ] Net.DelayAndLoss (1 ms)</system-out></testcase>
  <testcase name="Net.Partition" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>t.cc:3: Skipped
network namespaces need root; this run is not
[  SKIPPED ] Net.Partition (0 ms)</system-out></testcase>
  <testcase name="Other.Passes" status="run"><system-out>[       OK ] Other.Passes</system-out></testcase>
</testsuite>
"""
    with tempfile.TemporaryDirectory() as scratch:
        results = os.path.join(scratch, "results.xml")
        with open(results, "w") as f:
            f.write(junit)
        allow = os.path.join(scratch, "allowed.txt")
        with open(allow, "w") as f:
            f.write('# comment\nNet.DelayAndLoss "tc netem is not available"  # no netem here\n'
                    'Net.Partition "namespaces are denied"  # another reason than the one seen\n')
        lines = []
        failures = check([results], allow, lines.append)
        assert failures == 1, lines
        assert ("skipped, as tests/allowed_skips.txt allows: Net.DelayAndLoss: tc netem is not "
                "available on this machine's kernel: Error") in lines, lines
        assert "UNEXPECTED SKIP: Net.Partition: network namespaces need root; this run is not" \
            in lines, lines
        # With the skip record: gtest's skips come from it, a chunk's too (ctest counted those as
        # passed); the JUnit files add only what is not gtest's.
        with open(results, "w") as f:
            f.write(junit.replace(
                '<testcase name="Other.Passes" status="run">',
                '<testcase name="py_suite" status="notrun"><skipped message="x"/>'
                '<system-out>SKIPPED [1] test_x.py:3: needs a GPU</system-out></testcase>'
                '<testcase name="Other.Passes" status="run">'))
        log = os.path.join(scratch, "skips.txt")
        with open(log, "w") as f:
            f.write("Net.DelayAndLoss\ttc netem is not available on this machine's kernel: "
                    "Error\\n\n"
                    "Chunked.OneCore\tthis machine lets the test use one core only\n")
        lines = []
        failures = check([results], allow, lines.append, skip_log=log)
        assert failures == 2, lines
        assert len(lines) == 4, lines
        assert ("skipped, as tests/allowed_skips.txt allows: Net.DelayAndLoss: tc netem is not "
                "available on this machine's kernel: Error") in lines, lines
        assert "UNEXPECTED SKIP: Chunked.OneCore: this machine lets the test use one core only" \
            in lines, lines
        assert "UNEXPECTED SKIP: py_suite: SKIPPED [1] test_x.py:3: needs a GPU" in lines, lines
        assert not any("Net.Partition" in line for line in lines), "counted from JUnit too"
        try:
            check([results], allow, lines.append, skip_log=os.path.join(scratch, "none"))
        except ValueError as e:
            assert "records none: was DTRAIN_SKIP_LOG set" in str(e), e
        else:
            raise AssertionError("gtest skips in JUnit with an empty record were accepted")
        with open(log, "w") as f:
            f.write("no tab here\n")
        try:
            logged_skips(log)
        except ValueError as e:
            assert "skips.txt:1" in str(e), e
        else:
            raise AssertionError("a malformed skip record was accepted")
        with open(allow, "w") as f:
            f.write('Net.* "tc netem"\n')
        try:
            read_allowlist(allow)
        except ValueError as e:
            assert "why CI cannot run it" in str(e)
        else:
            raise AssertionError("an entry without a reason was accepted")
    # The real allowlist parses.
    read_allowlist(ALLOWLIST)
    print("check_skips.py self-test: ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    args = argv[1:]
    skip_log = None
    if args[:1] == ["--skip-log"]:
        if len(args) < 3:
            print(__doc__, file=sys.stderr)
            return 2
        skip_log, args = args[1], args[2:]
    try:
        failures = check(args, skip_log=skip_log)
    except ValueError as e:
        print(f"check_skips: {e}", file=sys.stderr)
        return 1
    if failures and os.environ.get("DTRAIN_ALLOW_SKIPS") == "1":
        print("DTRAIN_ALLOW_SKIPS=1: not failing for them")
        return 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
