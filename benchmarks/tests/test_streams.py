"""``benchmarks.bench_streams`` on CPU with a small model: runs as threads of one process, their rows and ratios to
the same invocation's one run, and a failing thread reported instead of leaving the others at the barrier. The
timings themselves are meaningless here (no streams on a CPU)."""

import csv
import threading

import pytest
import torch

from benchmarks import bench_streams
from benchmarks.bench_concurrency import Training
from benchmarks.bench_streams import FIELDS, in_threads, main, own_stream
from experiments.analysis.timings import engine_code


def test_rows_count_every_threads_images_against_one_run(tmp_path, capsys):
    out = tmp_path / "streams.csv"
    main(["--device", "cpu", "--model", "small_cnn", "--threads", "3", "--steps", "2", "--warmup", "1",
          "--no-compile", "--eval-images", "32", "--out", str(out)])
    with out.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == FIELDS
        alone, threads = list(reader)
    assert (alone["threads"], threads["threads"]) == ("1", "3")  # one run measured first, though not asked for
    for row in (alone, threads):
        assert (row["device"], row["compile"], row["engine_code"], row["torch"]) == (
            "cpu", "eager", engine_code(), torch.__version__)
        assert 0 < float(row["run_images_per_s_min"]) <= float(row["run_images_per_s_mean"])
        assert float(row["aggregate_images_per_s"]) == pytest.approx(
            int(row["threads"]) * float(row["run_images_per_s_mean"]), rel=1e-3)
        assert float(row["ratio_to_one_run"]) == pytest.approx(
            float(row["aggregate_images_per_s"]) / float(alone["aggregate_images_per_s"]), rel=1e-3)
        assert float(row["process_peak_mib"]) > 0 and float(row["eval_images_per_s"]) > 0
    assert "3 runs as threads:" in capsys.readouterr().out


def test_a_failing_thread_is_reported_and_breaks_the_barrier_for_the_others(monkeypatch):
    def fails_once_warm(index, training, threads, barrier, warmup_turn):
        with warmup_turn:
            if index == 1:
                raise ValueError("run 1 broke during its warm-up")
        barrier.wait()  # the others would wait here for ever without the abort
        return {}

    monkeypatch.setattr(bench_streams, "timed_training", fails_once_warm)
    with pytest.raises(RuntimeError) as failure:
        in_threads(Training("cpu", "small_cnn", 8, 0, 1, None), runs=3)
    message = str(failure.value)
    assert message.startswith("3 of 3 runs failed:\nrun 1:") and "run 1 broke during its warm-up" in message
    assert message.count("\nthreading.BrokenBarrierError") == 2  # the two runs left waiting, after run 1


def test_each_thread_gets_a_stream_of_its_own_only_on_cuda():
    with own_stream(torch.device("cpu")) as nothing:
        assert nothing is None
    if torch.cuda.is_available():
        streams = []

        def record():
            with own_stream(torch.device("cuda")):
                streams.append(torch.cuda.current_stream())

        workers = [threading.Thread(target=record) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert len({stream.stream_id for stream in streams}) == 2
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
