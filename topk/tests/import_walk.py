"""A package's imports read from its source with :mod:`ast` (nothing is imported), for the layering tests of ``topk``
and of ``experiments``: one walker and one cycle finder for both.

An import of ``p.a.b`` is an edge to the module ``p.a.b`` (its parent packages, which Python runs first, are not
counted); ``from p.a import b`` is an edge to ``p.a.b`` when ``b`` is a module, to ``p.a`` otherwise; relative imports
are resolved against the importing module's package; ``importlib.import_module("p.a")`` is an edge to ``p.a`` (an
f-string's constant head, ``f"p.a.{name}"``, to the package ``p.a``). A target that is not a module is resolved to the
nearest package above it that is.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple


class Import(NamedTuple):
    target: str  #: the imported module of the package
    line: int
    in_function: bool


def package_modules(package) -> dict[str, Path]:
    """Every module of ``package`` but its tests, by dotted name (a package by its own name)."""
    root = Path(package.__file__).parent
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if "tests" in parts:
            continue
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _resolve(name: str, modules) -> str:
    """``name``, or the nearest package above it that is a module of ``modules`` (an attribute imported from it)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


def _targets(node: ast.AST, package: str, modules) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parent = package.split(".")[:len(package.split(".")) - node.level + 1]
            base = ".".join([*parent, base] if base else parent)
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    if isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
        argument = node.args[0]
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            return [argument.value]
        if isinstance(argument, ast.JoinedStr) and argument.values and isinstance(argument.values[0], ast.Constant):
            return [argument.values[0].value.rpartition(".")[0]]
    return []


def imports_of(name: str, source: str, modules, root: str) -> list[Import]:
    """What ``source`` (the module ``name``; "" for a notebook) imports of the package ``root``, in source order."""
    package = name if name in modules and modules[name].name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        found.extend(Import(_resolve(target, modules), node.lineno, in_function)
                     for target in _targets(node, package, modules)
                     if target == root or target.startswith(root + "."))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def find_cycle(graph) -> list[str] | None:
    """A cycle of ``graph`` (each node's targets: a set, or a dict keyed by them) as its nodes in order, the first
    repeated at the end, or None."""
    on_path, done = [], set()

    def walk(node: str) -> list[str] | None:
        if node in on_path:
            return on_path[on_path.index(node):] + [node]
        if node in done:
            return None
        on_path.append(node)
        for target in sorted(graph.get(node, ())):
            if cycle := walk(target):
                return cycle
        on_path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if cycle := walk(start):
            return cycle
    return None
