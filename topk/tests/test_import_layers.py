"""The package's imports go one way. Every module sits on a floor, device code at the bottom and the public API at the
top, and imports only from its own floor or lower ones; no module imports one that imports it back, directly or
through others. The imports are read from the source with :mod:`ast`, not imported, so that an import inside a
function counts as much as one at the top of a module.

An import of ``topk.a.b`` is an edge to the module ``topk.a.b`` (its parent packages, which Python runs first, are
not counted: every module would otherwise import ``topk`` and with it the public API); ``from topk.a import b`` is an
edge to ``topk.a.b`` when ``b`` is a module, to ``topk.a`` otherwise; relative imports are resolved against the
importing module's package.
"""

from pathlib import Path

import pytest

import topk
from topk.tests.import_walk import find_cycle, imports_of, package_modules

DEVICE, LAUNCHERS, REGISTRATION, PUBLIC = range(4)
FLOOR_NAMES = ("device code", "launchers and PyTorch references", "operator registration", "public API")

#: Each module's floor.
FLOORS = {
    # the kernels themselves (Triton, Numba) and the noise they draw
    "topk._fused_kernel": DEVICE,
    "topk._esp_kernel": DEVICE,
    "topk._cpu_kernel": DEVICE,
    "topk._bounded_noise": DEVICE,
    "topk._triton_support": DEVICE,  # what the kernels need of the machine: Triton, its interpreter, the largest K
    # the kernels' launchers, and the computations in PyTorch operations the operators run or differentiate
    "topk.fused": LAUNCHERS,
    "topk._esp_launch": LAUNCHERS,
    "topk._esp_tree": LAUNCHERS,
    "topk._labels": LAUNCHERS,
    "topk._perturbed_top": LAUNCHERS,
    "topk._smooth_hinge_tree": LAUNCHERS,
    # the argument checks, shared by the public functions and the fused kernel's public launcher
    "topk._validation": LAUNCHERS,
    # the custom operators: fake implementations, autograd, batching rules, eager calls
    "topk._batching": REGISTRATION,
    "topk._ops": REGISTRATION,
    # what users import
    "topk": PUBLIC,
    "topk.operators": PUBLIC,
    "topk.elementary_symmetric": PUBLIC,
    "topk.layers": PUBLIC,
    "topk.metrics": PUBLIC,
    "topk.losses": PUBLIC,
    "topk.losses.functional": PUBLIC,
    "topk.losses.modules": PUBLIC,
    "topk.losses.registry": PUBLIC,
}

#: The modules a function may import on first use rather than at the top: those that import Triton, an optional
#: dependency that reads ``TRITON_INTERPRET`` when it is imported, so that ``import topk`` must not import it: the
#: kernels' sources, :mod:`topk._triton_support` (its ``torch.compiler.assume_constant_result`` imports
#: ``torch._dynamo``, which imports Triton) and :mod:`topk.fused`, which imports it.
LAZY = {"topk._fused_kernel", "topk._esp_kernel", "topk._triton_support", "topk.fused"}


def import_graph() -> dict[str, list[tuple[str, bool]]]:
    """Each module's imports of the package's other modules, each with whether it is inside a function."""
    modules = package_modules(topk)
    return {name: [(found.target, found.in_function) for found in imports_of(name, path.read_text(), modules, "topk")
                   if found.target in modules and found.target != name]
            for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of ``graph``, each found after cutting the last edge of the one before, until none is left."""
    graph = {node: set(targets) for node, targets in graph.items()}
    cycles = []
    while cycle := find_cycle(graph):
        cycles.append(cycle)
        graph[cycle[-2]].discard(cycle[-1])
    return cycles


def test_the_walker_sees_every_kind_of_import():
    modules = {name: Path(f"{name}.py") for name in ("topk", "topk.a", "topk.b", "topk.c", "topk.d", "topk.e")}
    modules["topk"] = Path("__init__.py")
    source = ("import topk.a\nfrom topk import b\nfrom . import c\nfrom .d import something\n"
              "def f():\n    from topk import e\n")
    assert sorted((found.target, found.in_function) for found in imports_of("topk.x", source, modules, "topk")) == [
        ("topk.a", False), ("topk.b", False), ("topk.c", False), ("topk.d", False), ("topk.e", True)]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}) == [["a", "b", "a"], ["b", "c", "b"]]


def test_every_module_has_a_floor():
    assert set(package_modules(topk)) == set(FLOORS), "declare each new module's floor in FLOORS (and drop gone ones)"


def test_no_module_imports_one_that_imports_it_back():
    graph = {name: {target for target, _ in imports} for name, imports in import_graph().items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_every_import_goes_to_the_same_floor_or_a_lower_one():
    upward = [f"{name} ({FLOOR_NAMES[FLOORS[name]]}) imports {target} ({FLOOR_NAMES[FLOORS[target]]})"
              for name, imports in import_graph().items() for target, _ in imports
              if name in FLOORS and target in FLOORS and FLOORS[target] > FLOORS[name]]
    assert not upward, "imports going up a floor:\n" + "\n".join(upward)


def test_a_function_imports_only_what_imports_triton():
    late = sorted({f"{name} imports {target} inside a function" for name, imports in import_graph().items()
                   for target, in_function in imports if in_function and target not in LAZY})
    assert not late, "import these at the top of the module (a circle is not a reason):\n" + "\n".join(late)


@pytest.mark.parametrize("module", sorted(LAZY))
def test_what_imports_triton_is_imported_only_inside_functions(module):
    """So that ``import topk`` works without Triton and leaves ``TRITON_INTERPRET`` to be read at first use. One
    exception: :mod:`topk.fused`, itself imported only inside functions, imports what it re-exports of
    :mod:`topk._triton_support` at the top."""
    at_top = [name for name, imports in import_graph().items() if (module, False) in imports
              and (name, module) != ("topk.fused", "topk._triton_support")]
    assert not at_top, f"{module} imported at the top of {at_top}"
