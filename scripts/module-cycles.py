#!/usr/bin/env python3
"""Reports import circles between the top-level modules of a crate.

Usage: scripts/module-cycles.py CRATE_SRC_DIR [CRATE_SRC_DIR ...]

A module is a top-level file `src/x.rs` or folder `src/x/`; a submodule counts as its
top-level module. Module `a` depends on module `b` when code in `a` (not a comment, not the
`#[cfg(test)] mod tests` at the end of a file) names `crate::b`. Every strongly connected set
of two or more modules is printed; the exit status is 1 if there is any.
"""

import re
import sys
from pathlib import Path


def code_lines(path):
    """The file's lines of code: comments dropped, the trailing test module cut off."""
    text = path.read_text()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests\b", text, re.M)
    if cut:
        text = text[: cut.start()]
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        yield line.split("//", 1)[0] if '"' not in line else line


def graph(src):
    modules = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        top = rel.parts[0].removesuffix(".rs")
        if top in ("lib", "main"):
            continue
        modules.setdefault(top, set())
        for line in code_lines(path):
            for name in re.findall(r"\bcrate::(\w+)", line):
                if name != top:
                    modules[top].add(name)
            # `use crate::{a, b::c}` names several modules at once.
            for group in re.findall(r"\bcrate::\{([^}]*)\}", line):
                for name in re.findall(r"(?:^|,)\s*(\w+)", group):
                    if name != top:
                        modules[top].add(name)
    return {m: {d for d in deps if d in modules} for m, deps in modules.items()}


def strongly_connected(graph):
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    circles = 0
    for arg in sys.argv[1:]:
        src = Path(arg)
        g = graph(src)
        for component in strongly_connected(g):
            circles += 1
            edges = [f"{a} -> {b}" for a in component for b in sorted(g[a]) if b in component]
            print(f"{src}: import circle among {', '.join(component)}:\n  " + "\n  ".join(edges))
        if not circles:
            print(f"{src}: {len(g)} modules, no import circle")
    sys.exit(1 if circles else 0)


if __name__ == "__main__":
    main()
