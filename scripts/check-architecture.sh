#!/usr/bin/env bash
# Keeps ARCHITECTURE.md a true, short map: every name it cites in backticks exists in the tree,
# and the file stays within its length budget. `.ci/run` runs it first; it needs only bash, git
# and python3's standard library.
#
#   scripts/check-architecture.sh [FILE]     # FILE defaults to ARCHITECTURE.md at the repo root
#
# The rule, for each `backticked` span outside fenced code blocks:
#
# - A *path* is a span of path characters (letters, digits, `_ - . / * { } ,`) that ends in a
#   source extension (.rs .md .proto .sh .py .toml .lua .service .yml .json with a `/`) or whose
#   first segment is a top-level directory or a crate's directory (`crates/`, `docs/`, `server/`,
#   `core/`, …). It must name at least one file or directory of the tree (git's files, tracked or
#   not ignored), tried as given from the repo root, then under `crates/`, `crates/*/`,
#   `crates/*/src/` and `clients/*/`; `*` is a glob. A bare file name (`wal.rs`) must be the name
#   of some file in the tree. Paths starting with `/` (routes, /proc) and URLs are not checked.
# - A *name* is a span that is a Rust path (`Node`, `LockTable::apply`, `palisade_proto::error`,
#   `recover()`, `ENDPOINTS_MAX`) and is CamelCase, ALL_CAPS (three characters or more), contains
#   `::`, or ends in `()`. Each of its `::` segments must occur as a word in the tree's *.rs, *.py,
#   *.proto, *.md, *.sh, *.lua and *.toml files, ARCHITECTURE.md itself (and FILE) excepted. Plain
#   lower-case words (`kind`, `busy`) and spans with spaces or generics are not checked.
# - The file has at most BUDGET_LINES lines.
#
# Each failure is printed as FILE:LINE: what is missing; the exit status is then 1.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "${1:-ARCHITECTURE.md}" <<'PY'
import glob, os, re, subprocess, sys

BUDGET_LINES = 360
SOURCE_EXTS = (".rs", ".py", ".proto", ".md", ".sh", ".lua", ".toml")
PATH_EXTS = (".rs", ".md", ".proto", ".sh", ".py", ".toml", ".lua", ".service", ".yml")

target = sys.argv[1]
files = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
    check=True, capture_output=True, text=True,
).stdout.split()
files = [f for f in files if os.path.exists(f)]
dirs = {os.path.dirname(f) for f in files}
for d in list(dirs):
    while d:
        dirs.add(d)
        d = os.path.dirname(d)
tree = set(files) | dirs
basenames = {os.path.basename(f) for f in files}
top = {p.split("/")[0] for p in tree} | {p.split("/")[1] for p in tree if p.startswith("crates/") and "/" in p}

skip = {os.path.realpath("ARCHITECTURE.md"), os.path.realpath(target)}
words = set()
for f in files:
    if f.endswith(SOURCE_EXTS) and os.path.realpath(f) not in skip:
        with open(f, encoding="utf-8", errors="replace") as fh:
            words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read()))

with open(target, encoding="utf-8") as fh:
    lines = fh.read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
# Blank out fenced code blocks, keeping the line numbers.
text_lines, fenced = [], False
for line in lines:
    if line.lstrip().startswith("```"):
        fenced = not fenced
        text_lines.append("")
    else:
        text_lines.append("" if fenced else line)
text = "\n".join(text_lines)

def expand(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in expand(path[: m.start()] + alt + path[m.end():])]

def exists(path):
    if "{" in path:
        return all(exists(p) for p in expand(path))
    if path in basenames and "/" not in path:
        return True
    path = path.rstrip("/")
    for pattern in (path, "crates/" + path, "crates/*/" + path, "crates/*/src/" + path, "clients/*/" + path):
        if any(os.path.exists(p) and p.rstrip("/") in tree for p in glob.glob(pattern)):
            return True
    return False

PATH_RE = re.compile(r"^[\w.\-*{},/]+$")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$")
failures = []
checked_paths = checked_names = 0
for m in re.finditer(r"`([^`]+)`", text):
    span = m.group(1)
    line = text.count("\n", 0, m.start()) + 1
    first = span.split("/")[0]
    if span.startswith("/") or (span.startswith(".") and "/" not in span) or "://" in span or " " in span or "\n" in span:
        continue
    if PATH_RE.match(span) and ("/" in span or span.endswith(PATH_EXTS)) and (
        span.endswith(PATH_EXTS + (".json",) if "/" in span else PATH_EXTS) or first in top
    ) and not NAME_RE.match(span):
        checked_paths += 1
        if not exists(span):
            failures.append(f"{target}:{line}: no such path in the tree: `{span}`")
        continue
    if NAME_RE.match(span):
        bare = span[:-2] if span.endswith("()") else span
        checked = (
            "::" in bare or span.endswith("()")
            or re.match(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$", bare)
            or re.match(r"^[A-Z][A-Z0-9_]{2,}$", bare)
        )
        if checked:
            checked_names += 1
            missing = [s for s in bare.split("::") if s not in words]
            if missing:
                failures.append(f"{target}:{line}: no such name in the tree's sources: `{span}` ({', '.join(missing)})")

if len(lines) > BUDGET_LINES:
    failures.append(f"{target}: {len(lines)} lines, over the budget of {BUDGET_LINES}: move detail into module docs or docs/")
for f in failures:
    print(f)
if failures:
    print(f"check-architecture: {len(failures)} problem(s)", file=sys.stderr)
    sys.exit(1)
print(f"check-architecture: {target}: {len(lines)} lines; {checked_paths} paths and {checked_names} names cited, all in the tree")
PY
