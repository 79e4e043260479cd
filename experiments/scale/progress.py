"""One progress display over a whole profile's training: done, running, failed, left, images per second and the time
left, on one line rewritten in place on a terminal and a line per finished run elsewhere (a log, a CI job)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from experiments.scale.plan import PlannedRun


class Progress:
    """Counts the runs of one ``train`` call as executors report them; :meth:`summary` is its last line."""

    def __init__(self, runs: list[PlannedRun], *, stream: TextIO = sys.stderr):
        self.total, self.stream = len(runs), stream
        self.images_left = sum(run.train_images or 0 for run in runs)
        self.running: dict[str, float] = {}  # key -> start time
        self.done = 0
        self.failed: dict[str, str] = {}  # key -> its log
        self.images_done = 0
        self.started = time.monotonic()
        self.tty = stream.isatty()

    def start(self, run: PlannedRun) -> None:
        self.running[run.key] = time.monotonic()
        self._show()

    def finish(self, run: PlannedRun) -> None:
        seconds = time.monotonic() - self.running.pop(run.key, time.monotonic())
        self.done += 1
        self.images_done += run.train_images or 0
        self.images_left -= run.train_images or 0
        self._show(f"finished {run.key} ({', '.join(run.notebooks)}) in {seconds:.1f} s")

    def fail(self, run: PlannedRun, log: str) -> None:
        self.running.pop(run.key, None)
        self.failed[run.key] = log
        self.images_left -= run.train_images or 0
        self._show(f"FAILED {run.key} ({', '.join(run.notebooks)}): see {log}")

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.images_done / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done - len(self.failed) - len(self.running)
        eta = f", about {_duration(self.images_left / rate)} left" if rate > 0 and self.images_left > 0 else ""
        return (f"[{_duration(elapsed)}] {self.done}/{self.total} done, {len(self.running)} running, "
                f"{len(self.failed)} failed, {left} left; {rate:,.0f} images/s{eta}")

    def _show(self, event: str | None = None) -> None:
        if self.tty:
            if event:
                self.stream.write(f"\r\033[K{event}\n")
            self.stream.write(f"\r\033[K{self.line()}")
        elif event:
            self.stream.write(f"{event} | {self.line()}\n")
        self.stream.flush()

    def summary(self) -> str:
        """The last line: what finished, and each failed run with its log."""
        lines = [f"{self.done} of {self.total} runs finished, {len(self.failed)} failed "
                 f"in {_duration(time.monotonic() - self.started)}"]
        lines += [f"  failed: {key} (log: {log})" for key, log in self.failed.items()]
        return ("\n" if self.tty else "") + "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}"
