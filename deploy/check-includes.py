#!/usr/bin/env python3
"""Checks that every product folder's includes obey its README.

    python3 deploy/check-includes.py [--verbose]

Each folder of the product (under common/, router/, gpu_worker/,
kernels/, daemon/, tools/, profiles/) that holds C, CUDA or header files is
a room, and its README.md says what the room may include in a paragraph
that begins "May include" and ends at its first full stop, e.g.

    May include: `gpu_worker/model/`, `common/` and `kernels/tg_ops.h`.

Every backquoted path in that sentence (a folder ending in "/", or one
file) is allowed, and so is the room's own folder; nothing else of the
project is. Only "#include "..."" lines are checked: angle-bracket
includes are the system's and the libraries'. A quoted include resolves as
the compiler resolves it (the including file's folder, then the repository
root); a header the build generates from proto/ (*.pb-c.h, the API's
descriptors) belongs to proto/, and a rule naming proto/NAME.proto allows
its NAME.pb-c.h. A rule's path is read from the repository root, or else
as a sibling of the room (router/app's `net/` is router/net/).
Besides, a room never includes another room's *_internal.h (a module's
private part shared by its own files).

A room may also name its public headers, in a paragraph of its README
that begins "Public headers" and ends at its first full stop:

    Public headers: `rt_server.h`, `rt_request.h` and `rt_reqmem.h`.

Then another room includes only those of its headers, and a public
header includes only public headers of its own room, so what the other
rooms see never reaches the room's private ones, directly or through a
public header.

The libraries a room uses are held to the same sentence: an
angle-bracket include of one of the project's libraries (LIBRARIES below:
jansson, libuv, ZeroMQ, SQLite, ...) needs the library's name in the room's
"May include" sentence, so that, e.g., a core that must not speak JSON
says so by not naming jansson. The C and system headers are not checked.

Fails (exit 1), naming the file, the include and the rule, when a room
has no rule, a rule names a path that does not exist, an include cannot be
resolved, or an include breaks its room's rule. Registered with ctest as
check_includes (label unit); needs Python 3 only.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PRODUCT = ["common", "router", "gpu_worker", "kernels", "daemon", "tools", "profiles"]
SOURCES = (".c", ".h", ".cu", ".cuh", ".cpp", ".hpp")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# Headers the build generates from proto/ into the build tree (protobuf-c
# code, the API's embedded descriptors), included with or without "proto/".
GENERATED = re.compile(r"^(?:proto/)?([A-Za-z0-9_]+\.pb-c\.h|tg_api_descriptors\.h)$")
RULE = re.compile(r"^May include\b[^:]*:")
PUBLIC = re.compile(r"^Public headers\b[^:]*:")
TICKS = re.compile(r"`([^`]+)`")

# The project's libraries: an angle-bracket header (or a prefix ending in
# "/") and the name its users' README names it by (case-insensitive, a
# whole word of the "May include" sentence).
LIBRARIES = [
    ("jansson.h", "jansson"),
    ("uv.h", "libuv"),
    ("zmq.h", "ZeroMQ"),
    ("sqlite3.h", "SQLite"),
    ("pcre2.h", "PCRE2"),
    ("utf8proc.h", "utf8proc"),
    ("nghttp2/", "nghttp2"),
    ("http_parser.h", "http-parser"),
    ("systemd/", "libsystemd"),
    ("protobuf-c/", "protobuf-c"),
    ("cblas.h", "OpenBLAS"),
    ("omp.h", "OpenMP"),
    ("cuda", "CUDA"),
    ("cublas", "cuBLASLt"),
    ("nccl.h", "NCCL"),
    ("jemalloc/", "jemalloc"),
]
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>')


def library_of(header):
    """The library name a system include belongs to, or None."""
    for prefix, name in LIBRARIES:
        if header == prefix or (prefix.endswith("/") and header.startswith(prefix)) \
                or (prefix in ("cuda", "cublas") and header.startswith(prefix)):
            return name
    return None


def rule_sentence(readme):
    """The whole "May include" sentence of readme, or ""."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if RULE.match(line):
            para = []
            for more in lines[i:]:
                if not more.strip():
                    break
                para.append(more.strip())
            return first_sentence(" ".join(para))
    return ""


# Known breaks of the internal-header rule that other work is removing: a
# pair listed here is reported but does not fail. Remove the line with the
# fix; a listed pair that no longer occurs is reported as stale.
KNOWN = set()


def rel(path):
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def first_sentence(text):
    """The text up to the first full stop outside backquotes."""
    out, inside = [], False
    for i, ch in enumerate(text):
        if ch == "`":
            inside = not inside
        elif ch == "." and not inside and (i + 1 == len(text) or text[i + 1].isspace()):
            return "".join(out)
        out.append(ch)
    return "".join(out)


def read_rule(readme, start=RULE):
    """The paths named by readme's sentence that `start` begins ("May
    include" by default), or None when it has none."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if not start.match(line):
            continue
        para = []
        for more in lines[i:]:
            if not more.strip():
                break
            para.append(more.strip())
        sentence = first_sentence(" ".join(para))
        ticks = TICKS.findall(sentence)
        return ticks if start is PUBLIC else [t for t in ticks if "/" in t]
    return None


def public_headers(errors):
    """{room: set of its public headers' paths} for the rooms whose README
    names them; a named header that does not exist is an error."""
    out = {}
    for d, _ in rooms():
        readme = os.path.join(d, "README.md")
        names = read_rule(readme, PUBLIC) if os.path.isfile(readme) else None
        if names is None:
            continue
        room = rel(d)
        out[room] = set()
        for n in names:
            path = f"{room}/{n}"
            if not os.path.isfile(os.path.join(ROOT, path)):
                errors.append(f"{room}/README.md: \"Public headers\" names "
                              f"`{n}`, which is not a file of {room}/")
            out[room].add(path)
    return out


def rooms():
    """Folders of the product that hold sources, with their sources."""
    for top in PRODUCT:
        for d, subdirs, files in os.walk(os.path.join(ROOT, top)):
            subdirs[:] = sorted(s for s in subdirs if not s.startswith("build"))
            srcs = sorted(f for f in files if f.endswith(SOURCES))
            if srcs:
                yield d, [os.path.join(d, f) for f in srcs]


def resolve(src, name):
    """The repository path an include names, or None."""
    for base in (os.path.dirname(src), ROOT):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(p) and p.startswith(ROOT + os.sep):
            return rel(p)
    m = GENERATED.match(name)
    return "proto/" + m.group(1) if m else None


def main():
    verbose = "--verbose" in sys.argv[1:]
    errors, seen_known = [], set()
    n_rooms = n_includes = 0
    public = public_headers(errors)
    for d, srcs in rooms():
        room = rel(d)
        readme = os.path.join(d, "README.md")
        rule = read_rule(readme) if os.path.isfile(readme) else None
        if rule is None:
            errors.append(f"{room}/: holds sources, but its README.md has no "
                          f"\"May include:\" sentence")
            continue
        n_rooms += 1
        allowed = []
        for tok in rule:
            # From the repository root, or a sibling room's short name.
            path = tok.rstrip("/")
            if not os.path.exists(os.path.join(ROOT, path)):
                path = rel(os.path.join(os.path.dirname(d), path))
            if not os.path.exists(os.path.join(ROOT, path)):
                errors.append(f"{room}/README.md: \"May include\" names `{tok}`, "
                              f"which does not exist")
            allowed.append(path + "/" if tok.endswith("/") else path)
        if verbose:
            print(f"{room}/ may include: {', '.join(allowed) or 'its own files only'}")
        words = set(w.lower() for w in re.findall(r"[A-Za-z0-9_+\-]+",
                                                  rule_sentence(readme)))
        for src in srcs:
            for no, line in enumerate(open(src, encoding="utf-8", errors="replace"), 1):
                sm = SYSTEM_INCLUDE.match(line)
                if sm:
                    lib = library_of(sm.group(1))
                    if lib is not None and lib.lower() not in words:
                        errors.append(f"{rel(src)}:{no}: includes <{sm.group(1)}> "
                                      f"of {lib}, which {room}/README.md does "
                                      f"not name in its \"May include\" sentence")
                    continue
                m = INCLUDE.match(line)
                if not m:
                    continue
                n_includes += 1
                where = f"{rel(src)}:{no}"
                target = resolve(src, m.group(1))
                if target is None:
                    errors.append(f"{where}: #include \"{m.group(1)}\" names no "
                                  f"file of the repository")
                    continue
                tdir = os.path.dirname(target)
                if tdir == room:
                    # its own room; a public header stays among the public
                    if (room in public and rel(src) in public[room]
                            and target not in public[room]):
                        errors.append(f"{where}: the public header "
                                      f"{rel(src)} includes {target}, which "
                                      f"{room}/README.md does not list among "
                                      f"its public headers")
                    continue
                if tdir in public and target not in public[tdir]:
                    errors.append(f"{where}: includes {target}, which is not "
                                  f"one of {tdir}/'s public headers (Public "
                                  f"headers: {', '.join(sorted(os.path.basename(h) for h in public[tdir]))})")
                    continue
                if target.endswith("_internal.h"):
                    if (rel(src), target) in KNOWN:
                        seen_known.add((rel(src), target))
                        print(f"note: {where}: includes {target} (known, "
                              f"being removed)")
                        continue
                    errors.append(f"{where}: includes {target}, the private "
                                  f"header of {tdir}/")
                    continue
                # A generated protobuf-c header is allowed by its .proto.
                names = [target]
                if target.endswith(".pb-c.h"):
                    names.append(target[: -len(".pb-c.h")] + ".proto")
                if not any(n == a or (a.endswith("/") and n.startswith(a))
                           for n in names for a in allowed):
                    errors.append(f"{where}: includes {target}, which "
                                  f"{room}/README.md does not allow (May "
                                  f"include: {', '.join(allowed) or 'nothing'})")
    for pair in sorted(KNOWN - seen_known):
        print(f"note: known exception {pair[0]} -> {pair[1]} no longer occurs: "
              f"remove it from KNOWN in deploy/check-includes.py")
    for e in errors:
        print(e)
    print(f"check-includes: {n_rooms} rooms, {n_includes} includes, "
          f"{len(errors)} problem{'s' if len(errors) != 1 else ''}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
