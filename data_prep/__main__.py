"""``python -m data_prep <name> --root PATH``: check a downloaded dataset (CIFAR-100: fetch and extract it too) and
print what was found: sizes, classes, few/medium/many-shot groups, the realised label-flip rate, and for Pl@ntNet-300K
whether the ImageNet weights the paper profile's ResNet-50 starts from are in its folder."""

from __future__ import annotations

import argparse
import sys

from pathlib import Path

from data_prep import REAL, cifar100, load, plantnet
from data_prep.common import MissingDataError
from topk.metrics import shot_groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_prep", description=__doc__)
    parser.add_argument("name", choices=sorted(REAL))
    parser.add_argument("--root", required=True, help="the folder holding the downloaded files")
    parser.add_argument("--download", action="store_true", help="CIFAR-100 only: fetch the archive if absent")
    parser.add_argument("--noise", type=float, default=0.0, help="CIFAR-100 only: superclass label-noise probability")
    parser.add_argument("--noise-groups", choices=sorted(cifar100.NOISE_GROUPS), default="superclass",
                        help="CIFAR-100 only: redraw a noisy label within its superclass (the papers' text) or its "
                             "block of 5 consecutive labels (the authors' code)")
    args = parser.parse_args(argv)
    options = {}
    try:
        if args.name == "cifar100":
            cifar100.prepare(args.root, download=args.download)
            options.update(noise=args.noise, noise_groups=args.noise_groups)
        splits = load(args.name, args.root, **options)
    except MissingDataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    groups = shot_groups(splits.class_counts)
    print(splits.description)
    print(f"train {len(splits.train)}, val {len(splits.val)}, test {len(splits.test)}, {splits.num_classes} classes; "
          + ", ".join(f"{name} {int(mask.sum())} classes" for name, mask in groups.items()))
    if "flip_rate" in splits.info:
        groups = {"superclass": "superclass", "blocks_of_5": "block of 5 labels"}[splits.info["noise_groups"]]
        print(f"label noise p = {splits.info['noise']} within each {groups}: realised flip rate "
              f"{splits.info['flip_rate']:.4f}")
    if args.name == "plantnet" and not (weights := Path(args.root) / plantnet.WEIGHTS).exists():
        print(f"note: the paper profile's ResNet-50 starts from ImageNet weights, not found: {weights}\n"
              f"  get them from {plantnet.WEIGHTS_SOURCE} and save them as {weights}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
