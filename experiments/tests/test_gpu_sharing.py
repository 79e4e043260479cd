"""How processes share a GPU (:mod:`experiments.scale.gpu_sharing`), read as the kernel shows processes."""

from experiments.scale.gpu_sharing import MEASURED_IN, gpu_sharing, side_by_side_note


def test_a_gpu_is_shared_by_mps_while_its_daemon_runs(tmp_path):
    """Read from the processes' names (``/proc/PID/comm``, cut at 15 characters), as the kernel writes them."""
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "comm").write_text("bash\n")
    assert gpu_sharing("cuda", tmp_path) == "time-slicing"
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("nvidia-cuda-mps\n")
    assert gpu_sharing("cuda", tmp_path) == "mps" and gpu_sharing("cpu", tmp_path) == ""


def test_several_runs_on_a_time_sliced_gpu_get_a_note_naming_mps_and_the_measurements():
    note = side_by_side_note(4, "time-slicing")
    assert note.startswith("note: 4 runs on each GPU") and "nvidia-cuda-mps-control -d" in note and MEASURED_IN in note
    assert side_by_side_note(4, "mps") == side_by_side_note(1, "time-slicing") == side_by_side_note(None, "") == ""
