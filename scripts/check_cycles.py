"""Fail when gpufeed's import graph has a cycle: between two modules, or between two sibling
packages or modules at any level once each package is taken with everything inside it.

Every import counts: at module top, inside a function, and under ``if TYPE_CHECKING:`` (grimp
reads them all), since a cycle of any kind is two modules that must be read together.
``make lint`` runs it; docs/design/layers.md says how the packages are ordered.

    python scripts/check_cycles.py [PACKAGE]      # exit 0: no cycle; 1: cycles, listed
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of size > 1, each sorted; iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {n for targets in edges.values() for n in targets}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, ())))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def child_of(parent: str, module: str) -> str | None:
    """The child of ``parent`` that holds ``module`` (None: ``module`` is not inside it)."""
    if not module.startswith(parent + "."):
        return None
    return parent + "." + module[len(parent) + 1:].split(".", 1)[0]


def cycles(package: str) -> list[tuple[str, list[str]]]:
    """(scope, members) of every cycle: scope "modules" for module cycles, else the package
    whose children (each with all it contains) import each other round."""
    graph = grimp.build_graph(package, include_external_packages=False)
    modules = sorted(graph.modules)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    found = [("modules", c) for c in strongly_connected(imports)]
    parents = sorted({m for m in modules if any(o.startswith(m + ".") for o in modules)})
    for parent in parents:
        edges: dict[str, set[str]] = defaultdict(set)
        for importer, targets in imports.items():
            a = child_of(parent, importer)
            if a is None:
                continue
            for target in targets:
                b = child_of(parent, target)
                if b is not None and b != a:
                    edges[a].add(b)
        found += [(parent, c) for c in strongly_connected(edges)]
    return found


def main(argv: list[str]) -> int:
    package = argv[1] if len(argv) > 1 else "gpufeed"
    found = cycles(package)
    for scope, members in found:
        sys.stderr.write(f"import cycle among {scope}: {' <-> '.join(members)}\n")
    if found:
        sys.stderr.write(f"{len(found)} import cycle(s) in {package}; break each (docs/design/layers.md).\n")
        return 1
    sys.stdout.write(f"{package}: no import cycles (modules, and sibling packages at every level)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
