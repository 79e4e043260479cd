"""One progress display over a whole profile's training: done, running, failed, diverged, left, images per second and
the time left, on one line rewritten in place on a terminal and a line per finished run elsewhere (a log, a CI job).
Given the store, it also counts the epochs that running runs have checkpointed (:meth:`Progress.observe`, every
:data:`OBSERVE_EVERY` seconds while :meth:`Progress.watching`), so that hours-long runs show their rate before the first
one ends."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import TextIO

from experiments.engine.store import ResultsStore
from experiments.scale.plan import PlannedRun

#: Seconds between two looks at the running runs' checkpoints (:meth:`Progress.watching`).
OBSERVE_EVERY = 30.0
#: Seconds between two progress lines in a log while runs train (a terminal's line is rewritten at every look).
LOG_EVERY = 600.0
#: A log's line that says why a run failed: a Python exception's (``RuntimeError: ...``, a bare ``MemoryError``), a
#: command's ``error: ...``, or what ended its process (a worker's death, Slurm's cancellation or out-of-memory kill),
#: which a log appended to by several attempts writes after an earlier attempt's exception.
_REASON = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?|error: .+"
                     r"|.*(?:worker process \d+ died|CANCELLED|DUE TO TIME LIMIT|oom[_-]kill).*")


def failure_reason(log: str, tail_bytes: int = 65536) -> str:
    """Why the run that wrote ``log`` failed: the last line of the log's end that says so (else its last line), cut
    at 240 characters; empty where the log cannot be read."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - tail_bytes))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    reason = next((line for line in reversed(lines) if _REASON.fullmatch(line)), lines[-1] if lines else "")
    return reason if len(reason) <= 240 else reason[:239] + "…"


class Progress:
    """Counts the runs of one ``train`` call as executors report them; :meth:`summary` is its last line. The images
    counted are those trained by this call: a resumed run's checkpointed epochs (read from ``store``, if given) are
    neither trained again nor counted."""

    def __init__(self, runs: list[PlannedRun], *, store: ResultsStore | None = None, stream: TextIO = sys.stderr,
                 live: bool = True):
        self.runs, self.store, self.stream = {run.key: run for run in runs}, store, stream
        self.total = len(runs)
        self.kept = {run.key: self._checkpointed(run) for run in runs}  # images of the epochs each run had already
        self.trained: dict[str, int] = {}  # images each run trained in this call (a finished one: all it had left)
        self.running: dict[str, float] = {}  # key -> start time
        self.finished: set[str] = set()
        self.others: set[str] = set()  # runs another process trains (:meth:`elsewhere`)
        self.failed: dict[str, str] = {}  # key -> its log
        self.reasons: dict[str, str] = {}  # key -> why it failed, as its log says (:func:`failure_reason`)
        self.diverged: dict[str, str] = {}  # key -> its log: its loss became NaN, an outcome kept in the store
        self.started = self.logged = time.monotonic()
        self.first_start: float | None = None  # when the first run this call trains started
        self.tty = live and stream.isatty()  # one line rewritten in place; else a line per event
        self.lock = threading.Lock()  # the executor's thread and :meth:`watching`'s

    @property
    def done(self) -> int:
        return len(self.finished)

    def _checkpointed(self, run: PlannedRun) -> int:
        if self.store is None or not run.train_images:
            return 0
        return run.train_images * self.store.epochs_kept(run.key) // run.config.epochs

    def start(self, run: PlannedRun) -> None:
        left = self._checkpointed(run) if run.key in self.others else None  # read unlocked, as observe() reads
        with self.lock:
            if left is not None:  # left by another process: this call trains the epochs its checkpoint lacks
                self.others.discard(run.key)
                self.kept[run.key] = left
                self.trained.pop(run.key, None)
            self.running[run.key] = time.monotonic()
            if self.first_start is None:
                self.first_start = self.running[run.key]
            self._show()

    def elsewhere(self, run: PlannedRun) -> None:
        """``run`` is trained by another process (its claim's live holder): shown running, its images not this
        call's."""
        with self.lock:
            self.kept[run.key] = run.train_images or 0
            self.others.add(run.key)
            self.running[run.key] = time.monotonic()
            self._show()

    def left_to_others(self, runs: list[PlannedRun]) -> list[PlannedRun]:
        """The runs of ``runs`` that another process trains (:meth:`elsewhere`) and whose outcome is not reported
        yet."""
        with self.lock:
            ended = {*self.finished, *self.failed, *self.diverged}
            return [run for run in runs if run.key in self.others and run.key not in ended]

    def finish(self, run: PlannedRun) -> None:
        with self.lock:
            started = self.running.pop(run.key, None)  # None: found finished, never seen running (a Slurm task)
            self.finished.add(run.key)
            self.trained[run.key] = (run.train_images or 0) - self.kept[run.key]
            took = f" in {time.monotonic() - started:.1f} s" if started is not None else ""
            self._show(f"finished {run.key} ({', '.join(run.notebooks)}){took}")

    def fail(self, run: PlannedRun, log: str) -> None:
        with self.lock:
            self.running.pop(run.key, None)
            self.failed[run.key] = log
            self.reasons[run.key] = failure_reason(log)
            self._show(f"FAILED {run.key} ({', '.join(run.notebooks)}): {self.reasons[run.key] or 'no reason'} "
                       f"(log: {log})")

    def diverge(self, run: PlannedRun, log: str) -> None:
        """``run`` ended in the engine's divergence: not a failure, an outcome the notebooks show."""
        with self.lock:
            self.running.pop(run.key, None)
            self.diverged[run.key] = log
            self._show(f"diverged {run.key} ({', '.join(run.notebooks)}): its loss became NaN, see {log}")

    def report_stored(self, run: PlannedRun, store: ResultsStore, log: str) -> bool:
        """Report ``run`` finished or diverged where ``store`` holds its outcome (its record, or its loss's NaN, for
        which ``log`` says where to read why); False while it holds neither (a damaged record is set aside by the
        store's read and counts as none: the run is trained again)."""
        if store.finished(run.key) is not None:
            self.finish(run)
        elif store.divergence(run.config.training_key()) is not None:
            self.diverge(run, log)
        else:
            return False
        return True

    def observe(self) -> None:
        """Count the epochs the running runs have checkpointed since this call began (never fewer than counted before:
        a finished run's checkpoints are gone before its end is reported), and show the line (in a log, at most every
        :data:`LOG_EVERY` seconds)."""
        if self.store is None:
            return
        with self.lock:
            running = list(self.running)
        checkpointed = {key: self._checkpointed(self.runs[key]) - self.kept[key] for key in running}  # reads: unlocked
        with self.lock:
            for key, images in checkpointed.items():
                if key in self.running:
                    self.trained[key] = max(self.trained.get(key, 0), images)
            if self.tty or time.monotonic() - self.logged >= LOG_EVERY:
                self._show("training" if not self.tty else None)

    @contextmanager
    def watching(self, every: float = OBSERVE_EVERY):
        """:meth:`observe` every ``every`` seconds in a thread of its own, while the body trains."""
        stop = threading.Event()

        def look() -> None:
            while not stop.wait(every):
                self.observe()

        thread = threading.Thread(target=look, name="progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def rate(self) -> float:
        """Images per second trained in this call, since its first run started (the time before, a Slurm array's in
        the queue, would make the time left far too long), else since the call began."""
        elapsed = time.monotonic() - (self.started if self.first_start is None else self.first_start)
        return sum(self.trained.values()) / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        elapsed, rate = time.monotonic() - self.started, self.rate()
        images_left = sum((run.train_images or 0) - self.kept[key] - self.trained.get(key, 0)
                          for key, run in self.runs.items()
                          if key not in {*self.failed, *self.diverged, *self.finished})
        left = self.total - self.done - len(self.failed) - len(self.diverged) - len(self.running)
        eta = f", about {_duration(images_left / rate)} left" if rate > 0 and images_left > 0 else ""
        diverged = f"{len(self.diverged)} diverged, " if self.diverged else ""
        return (f"[{_duration(elapsed)}] {self.done}/{self.total} done, {len(self.running)} running, "
                f"{len(self.failed)} failed, {diverged}{left} left; {rate:,.0f} images/s{eta}")

    def _show(self, event: str | None = None) -> None:
        if self.tty:
            if event:
                self.stream.write(f"\r\033[K{event}\n")
            self.stream.write(f"\r\033[K{self.line()}")
        elif event:
            self.stream.write(f"{event} | {self.line()}\n")
            self.logged = time.monotonic()
        self.stream.flush()

    def summary(self) -> str:
        """The last line: what finished, and each failed and diverged run with its log."""
        diverged = f", {len(self.diverged)} diverged (their loss became NaN: kept as such)" if self.diverged else ""
        lines = [f"{self.done} of {self.total} runs finished, {len(self.failed)} failed{diverged} "
                 f"in {_duration(time.monotonic() - self.started)}"]
        counts, example = Counter(), {}
        for reason in self.reasons.values():
            shape = re.sub(r"\d+", "N", reason)  # job ids, pids and sizes aside
            counts[shape] += 1
            example[shape] = reason
        lines += [f"  why {count} failed{', as' * (count > 1)}: {example[shape] or 'their logs say nothing'}"
                  for shape, count in counts.most_common()]
        lines += [f"  failed: {key} (log: {log})" for key, log in self.failed.items()]
        lines += [f"  diverged: {key} (log: {log})" for key, log in self.diverged.items()]
        return ("\n" if self.tty else "") + "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}"
