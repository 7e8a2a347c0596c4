#!/usr/bin/python3
"""data/SOURCES.tsv describes data/ exactly: every file under data/ (but the
README and SOURCES.tsv themselves) has one row with its size and sha256, and
every row names a file that exists, with a source (repository, path and
commit) or a note saying how it was made. So the project carries no file
of unknown provenance and no stale record."""
import csv
import hashlib
import os
import sys

SRC = os.environ.get("TANGRAM_SOURCE", os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SRC, "data"))


def main():
    if not os.path.isfile(os.path.join(DATA, "SOURCES.tsv")):
        print("FAIL: missing %s/SOURCES.tsv" % DATA)
        return 1
    failures = []
    with open(os.path.join(DATA, "SOURCES.tsv"), newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    listed = {}
    for r in rows:
        p = r["local_file"]
        if p in listed:
            failures.append("listed twice: " + p)
        listed[p] = r
        full = os.path.join(DATA, p)
        if not os.path.isfile(full):
            failures.append("listed but absent: " + p)
            continue
        blob = open(full, "rb").read()
        if str(len(blob)) != r["bytes"]:
            failures.append("%s: %d bytes, SOURCES says %s" %
                            (p, len(blob), r["bytes"]))
        if hashlib.sha256(blob).hexdigest() != r["sha256"]:
            failures.append("%s: sha256 differs from SOURCES" % p)
        has_source = r["repo"] not in ("", "-") and r["commit"] not in ("", "-")
        if not has_source and not r["note"].strip():
            failures.append("%s: neither a source nor a note" % p)
    for root, _, files in os.walk(DATA):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), DATA)
            if rel in ("README.md", "SOURCES.tsv"):
                continue
            if rel not in listed:
                failures.append("not in SOURCES.tsv: " + rel)
    for f in failures:
        print("FAIL " + f)
    print("%d files listed, %d failures" % (len(listed), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
