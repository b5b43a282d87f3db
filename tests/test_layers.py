"""The Python package's layers: no import cycle under python/mixprec (imports made only for
type checking count too), and the scaler layer (``amp``) never imports the optimizer layer
(``optim``); both stand on ``flat`` and ``ops``.

``python tests/test_layers.py`` prints the module graph, one module per line with what it
imports, lowest layer first.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PKG = Path(__file__).resolve().parent.parent / "python" / "mixprec"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> Dict[str, Set[str]]:
    """module -> the mixprec modules it imports (a package is its ``__init__``; ``from .
    import x`` of a submodule ``x`` imports that submodule, not the package)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                subs = [f"{origin}.{a.name}" for a in node.names
                        if f"{origin}.{a.name}" in modules]
                # the package itself only where a name is not one of its submodules
                targets = subs if len(subs) == len(node.names) else [origin] + subs
            for t in targets:
                if t in modules and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The cycles of ``graph`` (each as a list of modules, the first repeated last)."""
    sub = graph
    found: List[List[str]] = []
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(sub[m]):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(sub):
        if m not in state:
            visit(m)
    return found


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_scaler_layer_does_not_import_the_optimizers() -> None:
    graph = import_graph()
    bad = sorted((m, t) for m in graph if m.startswith("mixprec.amp")
                 for t in graph[m] if t.startswith("mixprec.optim"))
    assert bad == []


def test_a_cycle_is_found() -> None:
    """The check itself: a planted cycle is reported."""
    graph = import_graph()
    graph["mixprec.ops._reference"].add("mixprec.amp.grad_scaler")
    assert cycles(graph)


if __name__ == "__main__":
    g = import_graph()
    for m in sorted(g, key=lambda m: (len(g[m]), m)):
        print(f"{m}: {', '.join(sorted(g[m])) or '-'}")
