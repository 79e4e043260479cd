"""Where a result came from: the commit, the versions and the device, computed here once for the run records
(:mod:`experiments.engine.train`), the report's provenance table (:mod:`experiments.publishing.report`) and the benchmarks' CSV rows.

Importing this module loads nothing heavy; torch is imported when a function needs it.
"""

from __future__ import annotations

import ast
import platform
import subprocess
from pathlib import Path

from experiments.paths import PROJECT_ROOT

#: The columns :func:`stamp` adds to every benchmark CSV row.
STAMP_FIELDS = ["device", "device_name", "commit", "python", "torch", "triton", "topk"]
#: The columns :func:`record_stamp` adds to a probe's CSV row (read by :func:`experiments.publishing.readme._probe`).
RECORD_STAMP_FIELDS = ["key", "device", "commit", "torch"]


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


#: Tracked paths that ``make paper-figures`` and the benchmarks themselves rewrite (the committed outputs, the
#: calibrated knobs and learning rates, which every run's config carries, the generated blocks of the README and of
#: ``docs/*.md``, which ``make readme`` rewrites, and the benchmarks' CSVs): a change there says nothing of the code
#: that made a result, so it does not mark the commit dirty (a second benchmark run after a first one is not).
WRITTEN_BY_THE_PIPELINE = ("figures", "README.md", "docs", "experiments/calibrated", "benchmarks/results")


def git_commit() -> str:
    """The checked-out commit, suffixed ``-dirty`` when tracked files other than :data:`WRITTEN_BY_THE_PIPELINE`
    differ from it (as ``git describe --dirty``), or ``unknown`` outside a git checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return "unknown"
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                   *(f":(exclude){path}" for path in WRITTEN_BY_THE_PIPELINE))
    return commit + ("-dirty" if changed else "")


def changed_since(commit: str, files: tuple[str, ...], *, uncommitted: bool = True) -> bool | None:
    """Whether ``files`` (git pathspecs, relative to the project's root) differ now from their contents at ``commit``
    (a :func:`git_commit`; its ``-dirty`` mark is ignored: what was uncommitted then is not known), uncommitted
    changes included, or with ``uncommitted=False`` as committed (HEAD); a Python file whose code is the same, only
    its docstrings or comments changed (:func:`same_code`), does not count. None where git cannot tell (no checkout,
    or a commit it does not hold)."""
    sha = commit.partition("-dirty")[0]
    if not sha or _git("cat-file", "-e", f"{sha}^{{commit}}") is None:
        return None
    now = () if uncommitted else ("HEAD",)
    changed = _git("diff", "--name-only", sha, *now, "--", *files)  # the files that differ; None where git failed
    if changed is None:
        return None
    return any(not _same_code_since(sha, name, uncommitted) for name in changed.splitlines())


def _same_code_since(sha: str, name: str, uncommitted: bool) -> bool:
    """Whether the Python file ``name`` holds the same code now (or at HEAD) as at ``sha`` (:func:`same_code`)."""
    if not name.endswith(".py"):
        return False
    before = _git("show", f"{sha}:{name}")
    if uncommitted:
        path = PROJECT_ROOT / name
        after = path.read_text() if path.exists() else None
    else:
        after = _git("show", f"HEAD:{name}")
    return before is not None and after is not None and same_code(before, after)


def same_code(before: str, after: str) -> bool:
    """Whether two Python sources hold the same code: the same syntax tree once each module's, class's and function's
    docstring is set aside (comments and layout are not in the tree). False where either does not parse. (Code that
    computed with ``__doc__`` would be missed; none in this project does.)"""
    try:
        return _code(before) == _code(after)
    except SyntaxError:
        return False


def _code(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def full_history() -> bool:
    """Whether this checkout holds the whole history, which the staleness checks need to see the commits results name:
    false in a shallow clone (``git clone --depth 1``) and outside a checkout."""
    return _git("rev-parse", "--is-shallow-repository") == "false"


def short_commit(commit: str) -> str:
    """A commit of :func:`git_commit` in 10 hex digits, its ``-dirty`` mark kept."""
    sha, dirty, _ = commit.partition("-dirty")
    return sha[:10] + dirty


def processor() -> str:
    """The CPU as it decides a CPU run's bits: its model name (as the kernel reports it) and the instruction set
    PyTorch's kernels were chosen for (``torch.backends.cpu.get_cpu_capability``: AVX2, AVX512, ...). Two machines
    that differ in either may round differently (docs/reproducing.md#bit-for-bit)."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({torch.backends.cpu.get_cpu_capability()})"


def device_name(device) -> str:
    """The GPU's name, or the CPU's :func:`processor`."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else processor()


def versions() -> dict[str, str]:
    """Python's and the stack's versions; ``none`` for an optional package that is not installed."""
    import torch

    import topk

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("torchvision", "triton"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = "none"
    return {**found, "topk": topk.__version__}


def stamp(device) -> dict[str, str]:
    """The :data:`STAMP_FIELDS` of a benchmark row measured on ``device``."""
    import torch

    device = torch.device(device)
    known = {"device": device.type, "device_name": device_name(device), "commit": git_commit(), **versions()}
    return {field: known[field] for field in STAMP_FIELDS}


def record_stamp(record: dict) -> dict[str, str]:
    """The :data:`RECORD_STAMP_FIELDS` of the training run behind a results-store ``record``: where and from what it
    was trained, not where it is read back."""
    provenance = record["provenance"]
    return {"key": record["key"], "device": provenance["device"], "commit": provenance["git_commit"],
            "torch": provenance["torch"]}
