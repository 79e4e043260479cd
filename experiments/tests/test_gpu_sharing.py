"""How processes share a GPU (:mod:`experiments.scale.gpu_sharing`), read as CUDA and the kernel show them."""

import pytest

from experiments.scale.gpu_sharing import MEASURED_IN, gpu_sharing, mps_pipe, replays_cuda_graphs, side_by_side_note


def test_a_gpu_is_shared_by_mps_while_its_daemon_runs_or_its_control_pipe_exists(tmp_path):
    """Read from the processes' names (``/proc/PID/comm``, cut at 15 characters), as the kernel writes them, or from
    the pipe clients connect through (a daemon in another PID namespace shows no process here)."""
    proc, pipe = tmp_path / "proc", tmp_path / "mps" / "control"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "comm").write_text("bash\n")
    assert gpu_sharing("cuda", proc, pipe) == "time-slicing"
    (proc / "4242").mkdir()
    (proc / "4242" / "comm").write_text("nvidia-cuda-mps\n")
    assert gpu_sharing("cuda", proc, pipe) == "mps" and gpu_sharing("cpu", proc, pipe) == ""
    (proc / "4242" / "comm").unlink()
    pipe.parent.mkdir()
    pipe.touch()
    assert gpu_sharing("cuda", proc, pipe) == "mps"


def test_the_control_pipe_is_where_cuda_looks_for_it():
    assert str(mps_pipe({})) == str(mps_pipe({"CUDA_MPS_PIPE_DIRECTORY": ""})) == "/tmp/nvidia-mps/control"
    assert str(mps_pipe({"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"})) == "/run/mps/control"


@pytest.mark.parametrize("mode, graphs", [("reduce-overhead", True), ("max-autotune", True),
                                          ("max-autotune-no-cudagraphs", False), ("default", False), (None, False),
                                          ("no-such-mode", False)])
def test_the_modes_that_replay_cuda_graphs_are_inductors(mode, graphs):
    assert replays_cuda_graphs(mode) == graphs


def test_several_cuda_graph_runs_on_a_time_sliced_gpu_get_a_note_naming_mps_and_the_measurements():
    four_each = ["cuda:0", "cuda:1"] * 4
    note = side_by_side_note(four_each, "reduce-overhead", "time-slicing")
    assert note.startswith("note: 4 runs on one GPU") and "nvidia-cuda-mps-control -d" in note and MEASURED_IN in note
    assert "--per-gpu 1" in note
    assert side_by_side_note(["cuda:0"] * 3, "max-autotune", "time-slicing").startswith("note: 3 runs")  # --jobs 3
    # under MPS, one run per GPU, steps that are no CUDA graphs (they gain side by side), or a CPU: nothing to say
    assert side_by_side_note(four_each, "reduce-overhead", "mps") == ""
    assert side_by_side_note(["cuda:0", "cuda:1"], "reduce-overhead", "time-slicing") == ""
    assert side_by_side_note(four_each, "default", "time-slicing") == side_by_side_note(four_each, None, "") == ""
    assert side_by_side_note(["cpu", "cpu"], "reduce-overhead", "") == ""


def test_workers_on_gpus_take_the_gpus_in_turn(monkeypatch):
    """The first groups, and fewer groups than workers, spread over every GPU."""
    import torch

    from experiments.scale.executors import slots

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert slots(1, 3, "cuda") == ["cuda:0", "cuda:1"] * 3
    assert slots(1, 2, "cuda:1") == ["cuda:1"] * 2  # one GPU named: that one alone
    for device, refusal in (("cpu", "the device is 'cpu': give --device cuda"), ("cuda:2", "sees 2 CUDA device")):
        with pytest.raises(ValueError, match=refusal):
            slots(1, 2, device)
