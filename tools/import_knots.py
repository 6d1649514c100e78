"""Count the import knots of a package: imports inside functions, and import circles.

An import circle is a group of modules each of which reaches every other through imports — at
module level or inside functions (those run later, but still tie the modules together). An
import of ``a.b.c`` also imports the packages ``a`` and ``a.b`` (their ``__init__`` runs first),
except the packages the importing module is itself inside (already being imported) — unless
it names one of them itself (``from a import b`` inside ``a.c`` needs ``a`` run to ``b``).

    python tools/import_knots.py [rayfl] [--list]

``--list`` prints each function-local import (module, line, statement) and each circle's modules.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys


def modules(root: str) -> dict[str, str]:
    """Dotted module name -> file, for every ``.py`` file under the package ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = path[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             known: dict[str, str]) -> list[str]:
    """The modules of ``known`` that an import statement in ``module`` loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[:None if is_package else -1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known] or [base]
    out = []
    for name in names:
        parts = name.split(".")
        out += [p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                if p in known and p != module and not module.startswith(p + ".")]
        out += [name] if name in known and name != module else []
    return out


def in_function(tree: ast.Module) -> set[int]:
    """ids of the import statements inside a function (at any depth)."""
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside |= {id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return inside


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    group = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        group.append(w)
                        if w == v:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def knots(package: str) -> tuple[dict[str, str], list[tuple[str, int, str]], list[list[str]]]:
    """(modules, function-local imports as (module, line, statement), circles) of ``package``."""
    known = modules(package)
    graph: dict[str, set[str]] = {m: set() for m in known}
    local = []
    for name, path in sorted(known.items()):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        inside = in_function(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(imported(node, name, path.endswith("__init__.py"), known))
                if id(node) in inside:
                    local.append((name, node.lineno, ast.unparse(node)))
    return known, local, circles(graph)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", nargs="?", default="rayfl")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    known, local, found = knots(args.package)
    if not known:
        sys.exit(f"{args.package}: no Python files there")
    print(f"{args.package}: {len(known)} modules, {len(local)} imports inside functions, "
          f"{len(found)} import circle(s)" +
          "".join(f"; a circle of {len(k)} modules" for k in found))
    if args.list:
        for name, line, text in local:
            print(f"  {name}:{line}  {text}")
        for k in found:
            print("circle:", " ".join(k))


if __name__ == "__main__":
    main()
