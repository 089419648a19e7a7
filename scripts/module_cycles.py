"""Fails when the modules of a crate (src/, and crates/*/src/) import each
other in a circle.

Usage: python3 scripts/module_cycles.py   (from the repository root; make lint runs it)

Reads `crate::<module>` paths in code (comments, doc links included, are
left out) between top-level modules (and, in a top-level module,
`super::<module>`, which names a sibling), and `super::<module>` paths between
the submodules of a folder module (a parent's own items, which every child
may use, do not count). Prints each circle found and exits 1, or prints
"no import circle" and exits 0.
"""

import collections
import glob
import os
import re
import sys


def code(text):
    return re.sub(r"//[^\n]*", "", text)


def circles(graph):
    found = set()

    def walk(node, path):
        for dep in graph.get(node, ()):
            if dep in path:
                cycle = path[path.index(dep):]
                start = cycle.index(min(cycle))
                found.add(tuple(cycle[start:] + cycle[:start]))
            else:
                walk(dep, path + [dep])

    for node in list(graph):
        walk(node, [node])
    return found


def crate_problems(crate):
    top = collections.defaultdict(set)
    inner = collections.defaultdict(lambda: collections.defaultdict(set))
    for root, _, files in os.walk(crate):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            parts = os.path.relpath(path, crate)[:-3].split(os.sep)
            if parts[0] in ("lib", "bin"):
                continue
            text = code(open(path, encoding="utf-8").read())
            for dep in re.findall(r"crate::([a-z_]+)", text):
                if dep != parts[0]:
                    top[parts[0]].add(dep)
            # In a top-level module's own file (`x.rs` or `x/mod.rs`),
            # `super::` is the crate's root: `super::y` names a sibling.
            if len(parts) == 1 or parts[1:] == ["mod"]:
                for dep in re.findall(r"(?<!super::)super::([a-z_]+)", text):
                    if dep not in (parts[0], "super"):
                        top[parts[0]].add(dep)
            if len(parts) == 2 and parts[1] not in ("mod", "tests"):
                for dep in re.findall(r"super::([a-z_]+)", text):
                    inner[parts[0]][parts[1]].add(dep)
    problems = [(crate, c) for c in circles(top)]
    for module, graph in inner.items():
        graph = {k: {d for d in v if d in graph} for k, v in graph.items()}
        problems += [(f"{crate}/{module}", c) for c in circles(graph)]
    return problems


def main():
    problems = []
    for crate in ["src", *sorted(glob.glob("crates/*/src"))]:
        problems += crate_problems(crate)
    for where, cycle in sorted(problems):
        print(f"import circle in {where}: {' -> '.join(cycle + (cycle[0],))}")
    if problems:
        sys.exit(1)
    print("no import circle")


if __name__ == "__main__":
    main()
