"""The experiments' command line: one run from a JSON config, or a whole profile (plan, train, run-one); the
usage and examples are in :data:`DESCRIPTION` and :data:`EXAMPLES`, what ``--help`` prints."""

from __future__ import annotations

import argparse
import json
import os
import sys

try:  # torch's import takes seconds: Ctrl-C then ends the command as it would later, with no traceback
    import torch
    import torch.distributed as dist

    from experiments.engine.compile_cache import share_compilations
    from experiments.engine.config import RunConfig
    from experiments.engine.store import ResultsStore, unusable_store
    from experiments.engine.train import COMPILE_MODES, run
    from experiments.scale import cli, executors
except KeyboardInterrupt:
    print("\ninterrupted while starting: nothing was trained", file=sys.stderr)
    raise SystemExit(130) from None


DESCRIPTION = """Train one run from a JSON config (the fields of experiments.engine.config.RunConfig), or print its
record if the store already holds it finished. A killed run resumes from its last epoch.

A whole profile's runs have their own commands (python -m experiments train --help):
  plan PROFILE       every run of the profile and what the store holds of it
  train PROFILE      train the missing runs through an executor: inline, local (--jobs N, --per-gpu M) or slurm
  run-one KEY... --profile PROFILE
                     planned runs, as a Slurm array task calls it"""

EXAMPLES = """examples (experiments/example_run.json ships with the package: 4 epochs of a small CNN on a CIFAR-100
stand-in, with the noised loss):
  python -m experiments experiments/example_run.json --store results/example
  python -m experiments experiments/example_run.json --store results/example --device cuda --compile reduce-overhead
  torchrun --nproc_per_node 2 -m experiments experiments/example_run.json --store results/example
  python -m experiments plan quick"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in cli.COMMANDS:  # plan, train, run-one: a whole profile (experiments.scale)
        return cli.main(argv)
    if argv[:1] and not argv[0].startswith("-") and not argv[0].endswith(".json") and not os.path.exists(argv[0]):
        print(f"error: {argv[0]!r} is neither a command ({', '.join(cli.COMMANDS)}) nor a run's JSON config (no "
              "such file): python -m experiments --help", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="python -m experiments", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a JSON file with the fields of experiments.engine.config.RunConfig")
    parser.add_argument("--store", required=True, help="results store folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", help="folder of a real dataset, as given to `python -m data_prep`")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes reading an image-folder dataset (default: the machine's cores)")
    parser.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES, metavar="MODE",
                        help=f"compile the model and the loss with torch.compile (MODE: {', '.join(COMPILE_MODES)}; "
                             "default: default)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar per epoch")
    args = parser.parse_args(argv)
    try:
        with open(args.config) as handle:
            config = RunConfig.from_dict(json.load(handle))
    except (OSError, ValueError, TypeError) as error:
        print(f"error: bad config {args.config}: {error}", file=sys.stderr)
        return 2
    finished = not unusable_store(args.store) and ResultsStore(args.store).finished(config.key()) is not None
    if problem := unusable_store(args.store) or executors.device_refusal(args.device, trains_here=not finished):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = args.device
    if distributed:
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        if device == "cuda":
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
    store, interrupted = ResultsStore(args.store), False
    if args.compile is not None:
        share_compilations()
    try:
        record = run(config, store, device=device, data_root=args.data_root, num_workers=args.workers,
                     compile_mode=args.compile, progress=args.progress)
    except KeyboardInterrupt:
        interrupted = True
        print(f"interrupted: {_progress_kept(store, config)}; the same command resumes it", file=sys.stderr)
        return 130
    finally:
        if distributed:
            if not interrupted:  # the other processes may be interrupted too: no collective after an interrupt
                dist.barrier()
            dist.destroy_process_group()
    if not distributed or int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"key": record["key"], "selected_epoch": record["selected_epoch"], "test": record["test"]["top"]}))
    return 0


def _progress_kept(store: ResultsStore, config: RunConfig) -> str:
    """What an interrupted run keeps: the epochs of its last checkpoint, written after every epoch."""
    checkpoint = store.load_checkpoint(config.key())
    epochs = checkpoint["state"]["epoch"] if checkpoint is not None else 0
    return (f"run {config.key()} keeps {epochs} of its {config.epochs} epochs (its checkpoint in "
            f"{store.root / 'checkpoints'})")


if __name__ == "__main__":
    executors.run_as_command(main)
