"""The experiments' imports go one way. Every module sits on a floor, where files are and where a result came from at
the bottom and the notebooks' entry and the command line at the top, and imports only from its own floor or lower
ones; no module imports one that imports it back, directly or through others. The imports are read from the source
with :mod:`ast`, not imported, so that an import inside a function counts as much as one at the top of a module.

An import of ``experiments.a.b`` is an edge to the module ``experiments.a.b`` (its parent packages, which Python runs
first, are not counted); ``from experiments.a import b`` is an edge to ``experiments.a.b`` when ``b`` is a module, to
``experiments.a`` otherwise; relative imports are resolved against the importing module's package, and
``importlib.import_module("experiments.a.b")`` is an edge as well (an f-string: to the module its literal start names).

The notebooks import nothing of ``experiments`` but :mod:`experiments.harness`, their one entry.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

import experiments
from experiments.paths import NOTEBOOKS
from topk.tests.import_walk import find_cycle, imports_of, package_modules

FLOOR_NAMES = ("where files are and where a result came from", "the training engine", "the paper's specification",
               "the steps run once per profile (tuning)", "from records to results (analysis)",
               "runs beside the notebooks' (probes; a whole profile's runs: scale)",
               "what the reader sees (publishing)", "the notebooks' entry and the command line")

#: Each module's floor: a package's name stands for the package and every module in it.
FLOORS = {
    "experiments": 0,  # the package itself: its __init__ imports nothing
    "experiments.paths": 0,
    "experiments.provenance": 0,
    "experiments.engine": 1,
    "experiments.spec": 2,
    "experiments.tuning": 3,
    "experiments.analysis": 4,
    "experiments.probes": 5,
    "experiments.scale": 5,
    "experiments.publishing": 6,
    "experiments.harness": 7,
    "experiments.__main__": 7,
}

#: What a notebook may import of the package.
NOTEBOOK_ENTRY = "experiments.harness"


def floor_of(name: str) -> int | None:
    """The floor of the module ``name``: that of the longest declared name it is, or is inside; None if undeclared."""
    owners = [owner for owner in FLOORS if name == owner or (owner != "experiments" and name.startswith(owner + "."))]
    return FLOORS[max(owners, key=len)] if owners else None


def import_graph() -> dict[str, dict[str, int]]:
    """Each module's imports of the package's modules (itself left out), with the line of the first."""
    modules = package_modules(experiments)
    graph = {}
    for name, path in modules.items():
        edges = {}
        for target, line, _ in imports_of(name, path.read_text(), modules, "experiments"):
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def test_every_module_has_a_floor():
    unplaced = [name for name in package_modules(experiments) if floor_of(name) is None]
    assert not unplaced, f"modules on no floor (place them in FLOORS of {__file__}): {unplaced}"


def test_every_import_names_a_module_of_the_package():
    modules = package_modules(experiments)
    unknown = [f"{name} (line {line}) imports {target}" for name, edges in import_graph().items()
               for target, line in edges.items() if target not in modules]
    assert not unknown, unknown


def test_no_module_imports_a_higher_floor():
    upward = [f"{name} (floor {floor_of(name)}, {FLOOR_NAMES[floor_of(name)]}) imports {target} (floor "
              f"{floor_of(target)}, {FLOOR_NAMES[floor_of(target)]}) at line {line}"
              for name, edges in import_graph().items() for target, line in edges.items()
              if floor_of(name) is not None and floor_of(target) is not None and floor_of(target) > floor_of(name)]
    assert not upward, "\n".join(upward)


def test_no_two_modules_import_each_other_directly_or_through_others():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_checks_see_upward_imports_cycles_and_every_form_of_import():
    modules = {name: Path(f"{name.replace('.', '/')}.py") for name in
               ("experiments.engine.train", "experiments.spec.grids", "experiments.probes.crowding")}
    modules["experiments.probes"] = Path("experiments/probes/__init__.py")
    source = ("import experiments.spec.grids\nfrom experiments.spec.grids import Cell\n"
              "def f():\n    from experiments.probes import crowding\n"
              "    importlib.import_module('experiments.engine.train')\n"
              "    import_module(f'experiments.probes.{name}')\n")
    assert [found[:2] for found in imports_of("experiments.engine.train", source, modules, "experiments")] == [
        ("experiments.spec.grids", 1), ("experiments.spec.grids", 2), ("experiments.probes.crowding", 4),
        ("experiments.engine.train", 5), ("experiments.probes", 6)]
    assert [found[:2] for found in imports_of("experiments.probes", "from . import crowding\nfrom .crowding import run\n",
                                              modules, "experiments")] == [
        ("experiments.probes.crowding", 1), ("experiments.probes.crowding", 2)]
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 3}, "d": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 2}}) is None
    assert floor_of("experiments.tuning.new_step") == 3 and floor_of("experiments.new_module") is None


def notebook_imports(path: Path) -> list[tuple[str, int, str]]:
    """The package's modules each code cell of the notebook ``path`` imports: (module, line, cell id)."""
    modules = package_modules(experiments)
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        found += [(target, line, cell.get("id", "")) for target, line, _ in imports_of("", source, modules, "experiments")]
    return found


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda path: path.stem)
def test_a_notebook_imports_nothing_of_the_package_but_the_harness(path):
    found = notebook_imports(path)
    assert any(target == NOTEBOOK_ENTRY for target, _, _ in found), f"{path.name} does not import the harness"
    other = [f"cell {cell}, line {line}: {target}" for target, line, cell in found if target != NOTEBOOK_ENTRY]
    assert not other, f"{path.name} imports more of experiments than {NOTEBOOK_ENTRY}: {other}"


def test_what_a_notebook_imports_from_the_harness_is_what_the_harness_presents_to_notebooks():
    from experiments import harness

    asked = {alias.name for path in NOTEBOOKS.glob("*.ipynb") for cell in nbformat.read(path, as_version=4).cells
             if cell.cell_type == "code"
             for node in ast.walk(ast.parse("\n".join(line for line in cell.source.splitlines()
                                                     if not line.lstrip().startswith(("%", "!")))))
             if isinstance(node, ast.ImportFrom) and node.module == NOTEBOOK_ENTRY for alias in node.names}
    assert asked <= set(harness.NOTEBOOK_IMPORTS), sorted(asked - set(harness.NOTEBOOK_IMPORTS))
    assert all(hasattr(harness, name) for name in harness.NOTEBOOK_IMPORTS)
