"""How long a profile takes on this machine: each setup's training and evaluation speed measured here, times the images
:mod:`experiments.analysis.workload` counts for each notebook, for the learning-rate choice's runs beyond theirs and for one point
of the calibration.

    python -m benchmarks.bench_profile_time gpu --device cuda
    python -m benchmarks.bench_profile_time quick --device cpu --threads 1    # as `make -j2 paper-figures THREADS=1`

A training step is the engine's (:func:`experiments.engine.train.train_epoch`, compiled as ``--compile`` says, make's
default unless given): the setup's model and batch size, channels-last and bfloat16 autocast on CUDA, cross-entropy,
SGD with Nesterov momentum; evaluation is its forward pass in eval mode.
The images are random (the augmentation's cost is left out) and the loss is cross-entropy: the paper's losses add
their own cost (Fig. 3; :mod:`benchmarks.bench_epoch_time`). The estimate is compared with a measured profile in
docs/reproducing.md ("How long a profile takes"). Not a test: timings depend on the machine. Rows go to
benchmarks/results/profile_time_<profile>_<device>.csv.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from experiments.engine.models import build_model
from experiments.engine.train import COMPILE_MODES, compile_step, train_epoch
from experiments.spec.profiles import SETUPS, get_profile
from experiments.provenance import STAMP_FIELDS, stamp
from experiments.engine.store import write_csv
from experiments.spec.grids import NOTEBOOK_GRIDS
from experiments.analysis.workload import CALIBRATION_POINT, CHOICE, profile_work, stand_in_size
from topk.losses import build_loss

FIELDS = [*STAMP_FIELDS, "profile", "compile", "notebook", "setup", "runs", "epochs", "train_images", "eval_images",
          "train_images_per_s", "eval_images_per_s", "hours"]


def _timed_rate(step, batch_size: int, device: torch.device, budget_s: float) -> float:
    """Images per second of ``step`` (``batch_size`` images), after two warm-up calls, over at least 3 calls and
    ``budget_s``."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        step()
    sync()
    steps, start = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < budget_s:
        step()
        steps += 1
        if steps % 5 == 0:
            sync()
    sync()
    return steps * batch_size / (time.perf_counter() - start)


def setup_rates(setup, device: torch.device, budget_s: float, compile_mode: str | None,
                steps_per_call: int) -> tuple[float, float]:
    """(training, evaluation) images per second of ``setup``'s model at its batch size and image size; training
    through the engine's epoch (``steps_per_call`` steps a call), its model and loss compiled in ``compile_mode``
    (None: eager)."""
    size = stand_in_size(setup)
    cuda = device.type == "cuda"
    model = build_model(setup.model, size.num_classes, **setup.model_options).to(device)
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    images = torch.randn(setup.batch_size, 3, size.image_size, size.image_size, device=device).contiguous(
        memory_format=memory_format)
    labels = torch.randint(0, size.num_classes, (setup.batch_size,), device=device)
    config = setup.config("cross_entropy", setup.seeds[0])
    optimiser = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum, nesterov=True,
                                weight_decay=config.weight_decay)  # the engine's (experiments.engine.train.run)
    trained, loss = model, build_loss("cross_entropy").to(device)
    if compile_mode is not None:
        trained, loss = compile_step(model, loss, compile_mode)

    def train_steps():  # the epoch reads the device once, at its end
        train_epoch(trained, loss, [(images, labels)] * steps_per_call, optimiser, device, False, 0)

    @torch.no_grad()
    def eval_step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            model(images).float()

    train_rate = _timed_rate(train_steps, steps_per_call * setup.batch_size, device, budget_s)
    model.eval()
    return train_rate, _timed_rate(eval_step, setup.batch_size, device, budget_s)


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--budget", type=float, default=5.0, help="seconds of measurement per setup and mode")
    parser.add_argument("--compile", choices=[*COMPILE_MODES, "eager"],
                        help="torch.compile's mode of the training step (default: make's, reduce-overhead on CUDA, "
                             "eager on a CPU)")
    parser.add_argument("--steps-per-call", type=int, default=5,
                        help="training steps per call of the engine's epoch, which reads the device at its end")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.steps_per_call < 1:
        parser.error(f"--steps-per-call should be a positive number of training steps, got {args.steps_per_call}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}, but torch sees no CUDA device here: measure on a machine with a GPU (on "
                     "a cluster: inside srun or salloc)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, profile = torch.device(args.device), get_profile(args.profile)
    compile_mode = args.compile or ("reduce-overhead" if device.type == "cuda" else "eager")
    out = args.out or Path(__file__).parent / "results" / f"profile_time_{profile.name}_{device.type}.csv"
    provenance = stamp(device)
    print(f"{provenance['device_name']} ({device.type}, {torch.get_num_threads()} CPU threads), profile {profile.name}, "
          f"training step {compile_mode}")
    rates = {}
    for name in SETUPS:
        setup = getattr(profile, name)
        rates[name] = setup_rates(setup, device, args.budget, None if compile_mode == "eager" else compile_mode,
                                  args.steps_per_call)
        print(f"  {name:12s} {setup.model:14s} batch {setup.batch_size:4d}: train {rates[name][0]:9.1f} images/s, "
              f"eval {rates[name][1]:9.1f} images/s", flush=True)
    rows, totals = [], {}
    for work in profile_work(profile):
        train_rate, eval_rate = rates[work.setup]
        hours = (work.train_images / train_rate + work.eval_images / eval_rate) / 3600
        totals[work.notebook] = totals.get(work.notebook, 0.0) + hours
        rows.append({**provenance, "profile": profile.name, "compile": compile_mode, **vars(work), "train_images_per_s": round(train_rate, 1),
                     "eval_images_per_s": round(eval_rate, 1), "hours": round(hours, 4)})
    write_csv(rows, FIELDS, out)
    for notebook, hours in totals.items():
        print(f"  {notebook:28s} {hours:10.2f} h")
    notebooks = sum(hours for notebook, hours in totals.items() if notebook in NOTEBOOK_GRIDS)
    print(f"training notebooks: {notebooks:.2f} h; the learning-rate choice's other runs: {totals.get(CHOICE, 0):.2f} h; "
          f"each point of the calibration's search: {totals.get(CALIBRATION_POINT, 0):.2f} h. CSV: {out}")


if __name__ == "__main__":
    main()
