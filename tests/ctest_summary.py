#!/usr/bin/python3
"""ctest_summary.py BUILD_DIR JUNIT_XML — what a ctest run did, in one line
per kind, and whether its skips were honest.

Reads the JUnit report that `ctest --output-junit` wrote and the test list
with labels (`ctest --show-only=json-v1` in BUILD_DIR). Prints how many tests
ran, passed, failed and were skipped, by label, and names every skipped
test. Only tests labelled `gpu` may skip (they do so without an NVIDIA
device); any other skip is a failure of this script (exit 1), so a missing
input can never pass as green.
"""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET


def labels_by_test(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build,
                         capture_output=True, text=True, check=True).stdout
    res = {}
    for t in json.loads(out).get("tests", []):
        labels = []
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels = list(p.get("value") or [])
        res[t["name"]] = labels
    return res


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    build, junit = sys.argv[1], sys.argv[2]
    labels = labels_by_test(build)
    root = ET.parse(junit).getroot()
    cases = root.iter("testcase")
    ran = passed = failed = 0
    skipped, bad_skips = [], []
    for c in cases:
        name = c.get("name")
        status = c.get("status", "")
        if c.find("skipped") is not None or status in ("notrun", "disabled"):
            skipped.append(name)
            if "gpu" not in labels.get(name, []):
                bad_skips.append(name)
            continue
        ran += 1
        if c.find("failure") is not None or c.find("error") is not None or \
                status == "fail":
            failed += 1
        else:
            passed += 1
    total = ran + len(skipped)
    print("ctest summary: %d tests: %d ran (%d passed, %d failed), %d skipped"
          % (total, ran, passed, failed, len(skipped)))
    for name in skipped:
        why = "no GPU" if name not in bad_skips else "NOT A GPU TEST"
        print("  skipped: %s (%s)" % (name, why))
    if bad_skips:
        print("FAIL: only gpu-labelled tests may skip; these did: %s"
              % ", ".join(bad_skips))
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
