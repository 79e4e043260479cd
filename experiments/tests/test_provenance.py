"""Provenance is computed in one module: the commit (marked when the tree differs from it), versions, device."""

import subprocess

import torch

from experiments import provenance


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_commit_is_marked_dirty_only_when_tracked_files_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "PROJECT_ROOT", tmp_path)
    assert provenance.git_commit() == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("1")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("results are not code")
    assert provenance.git_commit() == head
    (tmp_path / "figures").mkdir()
    (tmp_path / "experiments" / "calibrated").mkdir(parents=True)
    outputs = ("figures/table.md", "README.md", "experiments/calibrated/quick.json")
    for output in outputs:  # what make paper-figures rewrites does not mark it
        (tmp_path / output).write_text("before")
        _git(tmp_path, "add", output)
    _git(tmp_path, "commit", "-q", "-m", "outputs")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    for output in outputs:
        (tmp_path / output).write_text("after")
    assert provenance.git_commit() == head
    (tmp_path / "a.txt").write_text("2")
    assert provenance.git_commit() == head + "-dirty"
    assert provenance.short_commit(head + "-dirty") == head[:10] + "-dirty" and provenance.short_commit(head) == head[:10]


def test_stamp_has_every_field_of_a_benchmark_row():
    stamp = provenance.stamp("cpu")
    assert list(stamp) == provenance.STAMP_FIELDS
    assert stamp["device"] == "cpu" and stamp["torch"] == torch.__version__ and stamp["device_name"]
    assert set(provenance.versions()) == {"python", "torch", "torchvision", "triton", "topk"}


def test_files_changed_since_a_commit_are_told_and_an_entry_trained_before_is_stale(tmp_path, monkeypatch):
    """A calibration whose runs an earlier engine trained says so wherever its numbers are shown: those numbers are
    not what the same runs give today. Where git cannot tell (no checkout, an unknown commit), nothing is claimed."""
    from experiments.spec.tuned import Calibration, LearningRates
    from experiments.tuning import calibration, learning_rates

    monkeypatch.setattr(provenance, "PROJECT_ROOT", tmp_path)
    assert provenance.changed_since("0" * 40, ("engine.py",)) is None  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "engine.py").write_text("1")
    (tmp_path / "notes.md").write_text("1")
    _git(tmp_path, "add", "engine.py", "notes.md")
    _git(tmp_path, "commit", "-q", "-m", "one")
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "notes.md").write_text("2")
    assert provenance.changed_since(first, ("engine.py",)) is False  # another file changed
    assert provenance.changed_since(first + "-dirty", ("engine.py",)) is False
    (tmp_path / "engine.py").write_text("2")  # uncommitted: changed all the same
    assert provenance.changed_since(first, ("engine.py",)) is True
    assert provenance.changed_since("f" * 40, ("engine.py",)) is None and provenance.changed_since("", ()) is None

    # a calibration asks about the committed code: what uncommitted edits train is stamped HEAD-dirty, and must not
    # be stale the moment it is stored (make calibrate would search again for ever)
    monkeypatch.setattr(calibration, "TRAINING_CODE", ("engine.py",))
    assert provenance.changed_since(first, ("engine.py",), uncommitted=False) is False
    earlier, unknown = Calibration(commit=first + "-dirty"), LearningRates(commit="")
    assert learning_rates.stale_text([earlier, unknown]) is None
    _git(tmp_path, "commit", "-q", "-am", "two")
    today = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert provenance.changed_since(first, ("engine.py",), uncommitted=False) is True
    assert provenance.short_commit(first) in learning_rates.stale_text([earlier, unknown])
    assert learning_rates.stale_text([Calibration(commit=today), LearningRates(commit=today)]) is None
    (tmp_path / "engine.py").write_text("3")
    assert learning_rates.stale_text([Calibration(commit=today + "-dirty")]) is None


def test_a_change_of_docstrings_or_comments_alone_leaves_the_code_unchanged(tmp_path, monkeypatch):
    """Staleness is about what code runs: a docstring or comment edited in a file of the training's code changes no
    number, so it marks nothing stale; any change of code does, a string that is not a docstring included."""
    monkeypatch.setattr(provenance, "PROJECT_ROOT", tmp_path)
    _git(tmp_path, "init", "-q")
    source = '"""A module."""\n\n\ndef f(x):\n    """Double."""\n    return 2 * x  # twice\n\n\nclass C:\n    "C."\n'
    (tmp_path / "engine.py").write_text(source)
    _git(tmp_path, "add", "engine.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    edited = source.replace("A module.", "The engine (Eq. 8).").replace("# twice", "# two times").replace('"C."', '"The class C."')
    (tmp_path / "engine.py").write_text(edited.replace("    return", "\n    return"))
    assert provenance.changed_since(first, ("engine.py",)) is False
    _git(tmp_path, "commit", "-q", "-am", "docs")
    assert provenance.changed_since(first, ("engine.py",), uncommitted=False) is False
    for code in ("return 3 * x", "return 2 * x + 0", 'return 2 * x\n    "not a docstring"'):
        (tmp_path / "engine.py").write_text(source.replace("return 2 * x", code))
        assert provenance.changed_since(first, ("engine.py",)) is True, code
    (tmp_path / "engine.py").write_text("def f(:\n")  # does not parse: counted as changed
    assert provenance.changed_since(first, ("engine.py",)) is True
    (tmp_path / "engine.py").unlink()
    assert provenance.changed_since(first, ("engine.py",)) is True
    assert provenance.same_code("x = 1  # one\n", "x = 1\n") and not provenance.same_code("x = 1\n", "x = 2\n")
