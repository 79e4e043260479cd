"""The user's compile cache (experiments.engine.compile_cache): compiled trainings in two processes compile each graph
once; a cache folder the user names wins; eager trainings leave the process's setting alone."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from experiments.engine.compile_cache import VARIABLE, share_compilations, user_compile_cache
from experiments.engine.config import RunConfig
from experiments.engine.run_claim import train_once
from experiments.engine.store import ResultsStore
from experiments.tests.test_experiments import ROOT, TINY

needs_a_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                      reason="inductor on a CPU needs a C++ compiler")


def _cache_files(folder) -> dict[str, tuple[int, int]]:
    """Each file of the cache with its inode and modification time: an entry written again (a compilation missed)
    is a new file renamed into place, with another inode."""
    return {str(path.relative_to(folder)): (path.stat().st_ino, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()}


@needs_a_compiler
def test_compiled_runs_in_two_processes_compile_each_graph_once(tmp_path):
    """Two processes, one after the other (as two Slurm tasks on two nodes sharing the home folder), train two runs of
    one model and loss compiled (``--compile default``): the first fills the user's cache, the second finds every graph
    there and writes nothing new."""
    store, cache = tmp_path / "store", tmp_path / "home-cache" / "topk" / "torchinductor"
    env = {key: value for key, value in os.environ.items() if key != VARIABLE}  # as a fresh shell has it
    env |= {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "home-cache")}
    found = []
    for seed in (1, 2):
        config = RunConfig(**{**TINY, "epochs": 1, "milestones": (), "seed": seed})
        path = tmp_path / f"run{seed}.json"
        path.write_text(json.dumps(config.to_dict()))
        done = subprocess.run([sys.executable, "-m", "experiments", str(path), "--store", str(store), "--device", "cpu",
                               "--compile", "default"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert ResultsStore(store).finished(config.key())["provenance"]["compile_mode"] == "default"
        found.append(_cache_files(cache))
    assert any(name.startswith("fxgraph/") for name in found[0]), sorted(found[0])[:10]
    assert found[1] == found[0]
    assert cache.stat().st_mode & 0o077 == 0  # the owner's alone


def test_a_cache_folder_named_by_the_user_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.setenv(VARIABLE, str(tmp_path / "mine"))
    assert share_compilations() == str(tmp_path / "mine")
    inherited = str(tmp_path / "submitting-hosts-tmp" / os.path.basename(default_cache_dir()))
    for unchosen in (None, default_cache_dir(), inherited):  # unset, or torch's default here or where sbatch ran
        if unchosen is None:
            monkeypatch.delenv(VARIABLE)
        else:
            monkeypatch.setenv(VARIABLE, unchosen)
        assert share_compilations() == os.environ[VARIABLE] == str(tmp_path / "home-cache" / "topk" / "torchinductor")
    assert user_compile_cache().is_dir()


def test_only_a_compiled_training_points_the_process_at_the_users_cache(tmp_path, monkeypatch):
    """An eager training leaves ``TORCHINDUCTOR_CACHE_DIR`` as it was (torch's default, which importing inductor sets);
    a compiled one sets it to the user's cache, before it looks for the run's record (here: already finished, so
    nothing is compiled)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.setenv(VARIABLE, default_cache_dir())
    config, store = RunConfig(**{**TINY, "epochs": 1, "milestones": ()}), ResultsStore(tmp_path / "store")
    record = train_once(config, store)
    assert os.environ[VARIABLE] == default_cache_dir()
    assert train_once(config, store, compile_mode="default") == record
    assert os.environ[VARIABLE] == str(user_compile_cache())


def test_without_a_usable_home_compilations_stay_in_torchs_default_with_a_warning(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))  # its cache folder cannot be made
    monkeypatch.delenv(VARIABLE, raising=False)
    with pytest.warns(UserWarning, match="compilations stay in torch's default folder, not shared between machines"):
        assert share_compilations() == default_cache_dir()
