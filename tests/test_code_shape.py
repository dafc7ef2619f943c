"""The shape of the code in vecgpt/: no function over 40 lines, no class over 250, no cycle among its modules.

A function's length runs from its `def` line to its last line: decorators are not counted, a
nested function's lines count in the function around it too. Every import of a vecgpt module
counts, at module level or inside a function, so a cycle is not hidden by moving an import.
Only explicit imports are edges: importing `a.b.c` runs `a/b/__init__.py` first, but a
package importing its own modules in its `__init__` is not a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vecgpt"
LONGEST = 40
LONGEST_CLASS = 250


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, tuple[Path, ast.Module]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found[module_name(path)] = (path, ast.parse(path.read_text(), filename=str(path)))
    return found


def long_functions(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > LONGEST:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def imported(name: str, is_package: bool, tree: ast.Module, modules: set[str]) -> set[str]:
    """The vecgpt modules that module `name` imports anywhere in its body."""
    here = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    found = sources()
    modules = set(found)
    return {name: imported(name, path.name == "__init__.py", tree, modules) for name, (path, tree) in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def long_classes(path: Path, tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > LONGEST_CLASS:
            found.append(
                f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            )
    return found


def test_no_class_is_over_250_lines():
    offenders = [line for path, tree in sources().values() for line in long_classes(path, tree)]
    assert not offenders, "classes over 250 lines:\n" + "\n".join(offenders)
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_CLASS))
    assert long_classes(ROOT / "c.py", ast.parse(f"class C:\n{body}\n")) == ["c.py:1 C (251 lines)"]


def test_no_function_is_over_40_lines():
    offenders = [line for path, tree in sources().values() for line in long_functions(path, tree)]
    assert not offenders, "functions over 40 lines:\n" + "\n".join(offenders)


def test_the_import_graph_has_no_cycle():
    found = [" <-> ".join(group) for group in cycles(import_graph())]
    assert not found, "modules that import each other:\n" + "\n".join(found)


def test_the_checker_sees_a_long_function_and_a_cycle():
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST))
    tree = ast.parse(f"@decorator\ndef f():\n{body}\n")
    assert long_functions(ROOT / "f.py", tree) == ["f.py:2 f (41 lines)"]
    tree = ast.parse(f"def g():\n{body[: body.rindex(chr(10))]}\n")
    assert long_functions(ROOT / "g.py", tree) == []
    modules = {"vecgpt", "vecgpt.a", "vecgpt.b"}
    a = imported("vecgpt.a", False, ast.parse("def f():\n    from . import b\n"), modules)
    b = imported("vecgpt.b", False, ast.parse("import vecgpt.a\n"), modules)
    assert (a, b) == ({"vecgpt.b"}, {"vecgpt.a"})
    assert cycles({"vecgpt.a": a, "vecgpt.b": b, "vecgpt": set()}) == [["vecgpt.a", "vecgpt.b"]]
