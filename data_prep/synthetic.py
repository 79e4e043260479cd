"""Seeded synthetic stand-ins with the structure of the paper's datasets, for CPU runs where the real data is absent.

Every image is drawn the same way (:class:`ImageModel`): classes come in groups of similar classes (CIFAR-100's
superclasses, Pl@ntNet's look-alike species); a group has a smooth random pattern, each class adds its own smooth
pattern at a smaller amplitude (``class_contrast``: small means the classes of a group are easily confused), and
each image is its class pattern, circularly shifted by up to ``max_shift`` pixels, scaled by a random contrast,
blended with the pattern of a random other group (clutter) and covered in pixel noise. The confusion within a group
is what makes top-K accuracy differ from top-1, as on the real data. Class sizes follow each dataset's shape
(:func:`shot_share_counts`). Data depend only on the arguments (the seed included), never on the global RNG.

Every generator takes the six difficulty knobs of :class:`ImageModel` as keyword arguments:

- ``pixel_noise``: standard deviation of the pixel noise, in units of a pattern's scale (the overall difficulty:
  more noise, lower top-1 and top-5);
- ``class_contrast``: amplitude of a class's own pattern beside its group's (the within-group confusability: smaller,
  lower top-1 at a nearly unchanged top-5);
- ``clutter``: amplitude of the other group's pattern blended into each image;
- ``max_shift``: the largest circular shift in pixels;
- ``ambiguity``: the probability that an image shows another class (drawn uniformly) than its label's, in every split:
  errors that top-5 does not recover, as ImageNet's images holding several objects or a wrong label (0: none);
- ``contrast_spread``: the standard deviation of the log of a class's own contrast across classes (each class's
  ``class_contrast`` times ``exp(contrast_spread g)``, ``g`` standard normal): some species are easier to tell apart
  than others, so accuracy grows with a class's training images less abruptly than when all are alike (0: all alike).

The CIFAR-100 stand-in takes a seventh, ``superclass_mixing``: the share of its classes whose superclass is not their
visual group (:func:`mixed_superclasses`). Superclass label noise redraws a label within its superclass; with no
mixing, among classes that share one pattern, which a model's top 5 holds whatever label it learnt among them.
CIFAR-100's superclasses are groups of meaning whose classes need not look alike (0: superclasses are the visual
groups). It changes the superclasses only, never an image.

:mod:`experiments.tuning.calibration` chooses ``pixel_noise`` and ``class_contrast`` (and ``ambiguity`` for the ImageNet
stand-ins, ``contrast_spread`` for the long-tailed ones, ``superclass_mixing`` for the CIFAR-100 one) per stand-in so
that cross-entropy's results match the paper's; the defaults below are the uncalibrated starting point.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from data_prep.label_noise import label_noise_within_groups
from data_prep.splits import Splits, TensorImages, class_counts
from data_prep.transforms import augment_and_normalise, normalise
from topk.metrics import SHOT_GROUP_BOUNDS


def smooth_patterns(n: int, size: int, generator: torch.Generator, frequencies: int = 3) -> torch.Tensor:
    """``n`` random smooth RGB patterns [n, 3, size, size] of unit scale: sums of low-frequency 2-d cosines."""
    grid = torch.arange(size, dtype=torch.float32) / size
    fy = torch.randint(0, frequencies + 1, (n, 3, frequencies), generator=generator).float()
    fx = torch.randint(0, frequencies + 1, (n, 3, frequencies), generator=generator).float()
    phase = 2 * math.pi * torch.rand(n, 3, frequencies, 2, generator=generator)
    amplitude = torch.randn(n, 3, frequencies, generator=generator)
    # [n, 3, f, size] x [n, 3, f, size] -> [n, 3, size, size]
    wave_y = torch.cos(2 * math.pi * fy[..., None] * grid + phase[..., 0, None])
    wave_x = torch.cos(2 * math.pi * fx[..., None] * grid + phase[..., 1, None])
    patterns = torch.einsum("ncf,ncfy,ncfx->ncyx", amplitude, wave_y, wave_x)
    return patterns / patterns.flatten(1).std(dim=1).clamp_min(1e-6)[:, None, None, None]


class ImageModel:
    """The patterns shared by every image of a dataset: one template per class (its group's pattern plus its own at
    amplitude ``class_contrast``, spread across classes by ``contrast_spread``) and one clutter pattern per group."""

    def __init__(self, group_of_class: torch.Tensor, size: int, generator: torch.Generator, *, class_contrast: float,
                 clutter: float, pixel_noise: float, max_shift: int, ambiguity: float, contrast_spread: float):
        n_groups, n_classes = int(group_of_class.max()) + 1, len(group_of_class)
        group_patterns = smooth_patterns(n_groups, size, generator)
        class_patterns = smooth_patterns(n_classes, size, generator)
        self.clutter_patterns = smooth_patterns(n_groups, size, generator)
        contrast = torch.full((n_classes, 1, 1, 1), float(class_contrast))
        if contrast_spread > 0:  # its own stream, drawn last: without a spread, the patterns drawn before the knob
            own = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (), generator=generator)))
            log_contrast = contrast_spread * torch.randn(n_classes, generator=own)
            contrast = contrast * log_contrast.exp()[:, None, None, None]
        self.templates = group_patterns[group_of_class] + contrast * class_patterns
        self.size, self.clutter, self.pixel_noise, self.max_shift = size, clutter, pixel_noise, max_shift
        self.ambiguity = ambiguity

    def drawn_as(self, labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The class each image shows: its label's, or with probability ``ambiguity`` another class drawn uniformly
        (the label is kept)."""
        n_classes = len(self.templates)
        other = (labels + torch.randint(1, max(n_classes, 2), labels.shape, generator=generator)) % n_classes
        return torch.where(torch.rand(labels.shape, generator=generator) < self.ambiguity, other, labels)

    def render(self, labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 images [N, 3, size, size] for ``labels``, drawn as the module docstring says."""
        templates, clutter_patterns, size = self.templates, self.clutter_patterns, self.size
        n_groups, clutter, pixel_noise, max_shift = len(clutter_patterns), self.clutter, self.pixel_noise, self.max_shift
        if self.ambiguity > 0:  # its own stream: without ambiguity, the images drawn before the knob existed
            labels = self.drawn_as(labels, torch.Generator().manual_seed(
                int(torch.randint(0, 2**62, (), generator=generator))))
        images = torch.empty(len(labels), 3, size, size, dtype=torch.uint8)
        for start in range(0, len(labels), 4096):  # in blocks: memory stays small for large sets
            block = labels[start:start + 4096]
            n = len(block)
            x = templates[block] * (0.7 + 0.6 * torch.rand(n, 1, 1, 1, generator=generator))
            x = x + clutter * clutter_patterns[torch.randint(0, n_groups, (n,), generator=generator)]
            shifts = torch.randint(-max_shift, max_shift + 1, (n, 2), generator=generator)
            if size > 1:  # a 1-pixel image (the sizes alone: experiments.analysis.workload) is its own shift
                x = torch.stack([torch.roll(img, (int(dy), int(dx)), dims=(1, 2)) for img, (dy, dx) in zip(x, shifts)])
            x = x + pixel_noise * torch.randn(x.shape, generator=generator)
            images[start:start + n] = (128 + 42 * x).round().clamp(0, 255).to(torch.uint8)
        return images



def shot_share_counts(n_classes: int, n_images: int, *, few_share: float, many_share: float, min_count: int,
                      train_count: Callable[[int], int] = lambda n: n) -> torch.Tensor:
    """Images per class, largest first, with a real dataset's shares of few-shot and many-shot classes: fewer than 20
    and more than 100 training images (:data:`topk.metrics.SHOT_GROUP_BOUNDS`; ``train_count`` gives a class's
    training images from its size). Within each group sizes fall geometrically with rank: from the largest class to the
    smallest many-shot size, from the largest medium size to the smallest, from the largest few-shot size to
    ``min_count``; the largest class is solved so that they sum to ``n_images``."""
    if not (0 < many_share and 0 <= few_share and few_share + many_share <= 1):
        raise ValueError(f"the shares should be many_share > 0, few_share >= 0, their sum <= 1; got few_share "
                         f"{few_share}, many_share {many_share}")
    few_below, many_above = SHOT_GROUP_BOUNDS

    def smallest_size(enough: Callable[[int], bool]) -> int:
        size = 1
        while not enough(train_count(size)):
            size += 1
        return size

    smallest_many, smallest_medium = smallest_size(lambda t: t > many_above), smallest_size(lambda t: t >= few_below)
    if not 1 <= train_count(min_count) < few_below:
        raise ValueError(f"min_count should leave a class 1 to {few_below - 1} training images, got {min_count} "
                         f"({train_count(min_count)} training images)")
    n_many, n_few = max(1, round(many_share * n_classes)), round(few_share * n_classes)
    n_medium = n_classes - n_many - n_few
    tails = torch.cat([_geometric(smallest_many - 1, smallest_medium, n_medium),
                       _geometric(smallest_medium - 1, min_count, n_few)])

    def counts_for(largest: float) -> torch.Tensor:
        return torch.cat([_geometric(largest, smallest_many, n_many), tails])

    needed = int(counts_for(smallest_many).sum())
    if n_images < needed:
        raise ValueError(f"n_images should be at least {needed} for {n_classes} classes with these shares, "
                         f"got {n_images}")
    low, high = float(smallest_many), float(n_images)
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if counts_for(middle).sum() <= n_images else (low, middle)
    counts = counts_for(low)
    counts[0] += n_images - int(counts.sum())  # rounding remainder on the largest class
    return counts


def _geometric(first: float, last: float, n: int) -> torch.Tensor:
    """``n`` sizes falling geometrically from ``first`` to ``last``, rounded (``first`` alone if ``n`` is 1)."""
    steps = torch.arange(n, dtype=torch.float64) / max(n - 1, 1)
    return (first * (last / first) ** steps).round().long()


def _split_sizes(n: int, fractions: tuple[float, float]) -> tuple[int, int, int]:
    """Train, val and test images of a class of ``n``: ``fractions`` of them (at least 1 each) to val and test."""
    n_val, n_test = (max(1, round(fraction * n)) for fraction in fractions)
    return n - n_val - n_test, n_val, n_test


def _split_per_class(counts: torch.Tensor, fractions: tuple[float, float], generator: torch.Generator):
    """Labels of the train / val / test parts: per class, :func:`_split_sizes` (at least 1 image to train)."""
    parts = ([], [], [])
    for label, n in enumerate(counts.tolist()):
        sizes = _split_sizes(n, fractions)
        if sizes[0] < 1:
            raise ValueError(f"class {label} has {n} images: at least 3 are needed for train, val and test")
        for part, size in zip(parts, sizes):
            part.append(torch.full((size,), label, dtype=torch.long))
    return [torch.cat(part)[torch.randperm(sum(map(len, part)), generator=generator)] for part in parts]


def _make_splits(name, description, label_parts, group_of_class, size, seed, difficulty, augment) -> Splits:
    generator = torch.Generator().manual_seed(seed)
    model = ImageModel(group_of_class, size, generator, **difficulty)
    images = [model.render(labels, generator) for labels in label_parts]
    train_transform = augment_and_normalise(size) if augment else normalise()
    datasets = [TensorImages(images[0], label_parts[0], train_transform)] + [
        TensorImages(im, lab, normalise()) for im, lab in zip(images[1:], label_parts[1:])]
    n_classes = len(group_of_class)
    return Splits(name, *datasets, num_classes=n_classes, class_counts=class_counts(label_parts[0], n_classes),
                  synthetic=True, description=description, info={"seed": seed, "image_size": size, **difficulty})


#: Stand-ins whose drawing changed since their first release, with their version: a run's key in the results store
#: (:meth:`experiments.engine.config.RunConfig.key`) includes it, so runs on the earlier data are never reused.
#: 2: the long tails take the real datasets' shares of few-, medium- and many-shot classes (:func:`shot_share_counts`).
GENERATOR_VERSIONS = {"plantnet_like": 2, "imagenet_lt_like": 2}


CIFAR_DIFFICULTY = {"class_contrast": 0.2, "clutter": 1.0, "pixel_noise": 1.5, "max_shift": 4, "ambiguity": 0.0,
                    "contrast_spread": 0.0}
PLANTNET_DIFFICULTY = {"class_contrast": 0.3, "clutter": 0.8, "pixel_noise": 1.2, "max_shift": 2, "ambiguity": 0.0,
                       "contrast_spread": 0.0}


def difficulty_of(defaults: dict, knobs: dict) -> dict:
    """``defaults`` updated with ``knobs``, each checked: a knob unknown or out of range is refused by name."""
    unknown = sorted(set(knobs) - set(defaults))
    if unknown:
        raise TypeError(f"unknown difficulty knobs {unknown}; the knobs are {sorted(defaults)}")
    difficulty = {**defaults, **knobs}
    for name, value in difficulty.items():
        integral = name == "max_shift"
        if not isinstance(value, int if integral else (int, float)) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"difficulty knob {name!r} should be a{'n integer' if integral else ' number'} >= 0, "
                             f"got {value!r}")
        if name == "ambiguity" and value > 1:
            raise ValueError(f"difficulty knob 'ambiguity' is a probability: it should be at most 1, got {value!r}")
    return difficulty


def mixed_superclasses(group_of_class: torch.Tensor, mixing: float, seed: int) -> torch.Tensor:
    """Each class's superclass: its visual group in ``group_of_class``, but for a share ``mixing`` of the classes,
    drawn at random, whose superclasses are permuted among themselves (a class may draw its own back, so slightly
    fewer move). Superclass sizes are kept. The draws have their own stream, from ``seed``."""
    if not (isinstance(mixing, (int, float)) and not isinstance(mixing, bool) and 0 <= mixing <= 1):
        raise ValueError(f"difficulty knob 'superclass_mixing' is a share of the classes: it should be a number in "
                         f"[0, 1], got {mixing!r}")
    generator = torch.Generator().manual_seed(seed)
    moved = torch.randperm(len(group_of_class), generator=generator)[:round(mixing * len(group_of_class))]
    superclass = group_of_class.clone()
    superclass[moved] = group_of_class[moved][torch.randperm(len(moved), generator=generator)]
    return superclass


def cifar100_like(per_class_train: int = 450, per_class_val: int = 50, per_class_test: int = 100, *,
                  n_superclasses: int = 20, classes_per_superclass: int = 5, image_size: int = 32, seed: int = 0,
                  noise: float = 0.0, noise_seed: int = 0, augment: bool = True, superclass_mixing: float = 0.0,
                  **difficulty) -> Splits:
    """A CIFAR-100-shaped stand-in: 100 classes in 20 superclasses of 5 classes, 32x32x3 images, balanced, split like
    the paper's 45,000 / 5,000 / 10,000 at full size (450 / 50 / 100 per class). The superclasses are the visual groups
    of confusable classes but for a share ``superclass_mixing`` of the classes (:func:`mixed_superclasses`).
    ``noise`` is the real loader's superclass label noise, on the training labels only; ``difficulty``: the other
    knobs of the module docstring."""
    n_classes = n_superclasses * classes_per_superclass
    group_of_class = torch.arange(n_classes) // classes_per_superclass
    superclass = mixed_superclasses(group_of_class, superclass_mixing, seed + 3)
    generator = torch.Generator().manual_seed(seed + 1)
    parts = [torch.arange(n_classes).repeat_interleave(n) for n in (per_class_train, per_class_val, per_class_test)]
    parts = [p[torch.randperm(len(p), generator=generator)] for p in parts]
    description = (f"synthetic CIFAR-100-like: {n_classes} classes in {n_superclasses} superclasses, "
                   f"{per_class_train}/{per_class_val}/{per_class_test} images per class, {image_size}px, seed {seed}")
    if superclass_mixing > 0:
        description += f", {superclass_mixing:.0%} of the classes mixed across superclasses"
    splits = _make_splits("cifar100_like", description, parts, group_of_class, image_size, seed,
                          difficulty_of(CIFAR_DIFFICULTY, difficulty), augment)
    if noise > 0:
        clean = splits.train.labels
        noisy = label_noise_within_groups(clean, superclass[clean], noise, noise_seed)
        splits.train.labels = noisy
        splits.class_counts = class_counts(noisy, n_classes)
        flip_rate = (noisy != clean).float().mean().item()
        splits.description += f", label noise p = {noise} (realised flip rate {flip_rate:.3f})"
        splits.info.update(noise=noise, flip_rate=flip_rate, clean_train_labels=clean)
    splits.info.update(coarse_of_fine=superclass, superclass_mixing=superclass_mixing)
    return splits


def imagenet_like(per_class_train: int = 40, per_class_val: int = 10, per_class_test: int = 10, *,
                  n_classes: int = 1000, group_size: int = 10, image_size: int = 16, seed: int = 0,
                  augment: bool = True, **difficulty) -> Splits:
    """An ImageNet-shaped stand-in: balanced classes in groups of ``group_size`` look-alikes (ImageNet's dog breeds),
    with the same per-class split as :func:`cifar100_like`; ``difficulty``: the knobs of the module docstring."""
    group_of_class = torch.randperm(n_classes, generator=torch.Generator().manual_seed(seed + 1)) // group_size
    generator = torch.Generator().manual_seed(seed + 2)
    parts = [torch.arange(n_classes).repeat_interleave(n) for n in (per_class_train, per_class_val, per_class_test)]
    parts = [p[torch.randperm(len(p), generator=generator)] for p in parts]
    description = (f"synthetic ImageNet-like: {n_classes} balanced classes in groups of {group_size}, "
                   f"{per_class_train}/{per_class_val}/{per_class_test} images per class, {image_size}px, seed {seed}")
    return _make_splits("imagenet_like", description, parts, group_of_class, image_size, seed,
                        difficulty_of(PLANTNET_DIFFICULTY, difficulty), augment)


#: Pl@ntNet-300K's classes: 48% few-shot, 25% medium, 27% many-shot (Garcin's thesis, Sec. 5.3); 80/10/10 split
PLANTNET_SHOTS = {"few_share": 0.48, "many_share": 0.27, "min_count": 4}
PLANTNET_SPLIT = (0.1, 0.1)
#: Pl@ntNet-300K's head: the 80% of species with the fewest images hold 11% of them (the paper, Sec. 4.5). With the
#: shot shares fixed, a stand-in has it only at about the real mean class size (283 images): the full-size one holds
#: 12%; the quick profile's (100 classes, 12,000 images) 26%, so its top-1 weighs the tail twice as much as the real
PLANTNET_TAIL_SHARE = {"classes": 0.8, "images": 0.11}
#: ImageNet-LT's classes: 136 few-shot, 479 medium, 385 many-shot of 1,000, at least 5 images (Liu et al., 2019)
IMAGENET_LT_SHOTS = {"few_share": 0.136, "many_share": 0.385, "min_count": 5}


def plantnet_class_sizes(n_images: int, n_classes: int) -> torch.Tensor:
    """Images per class of :func:`plantnet_like`, largest first: Pl@ntNet-300K's shot shares counted on the training
    part of the official split."""
    return shot_share_counts(n_classes, n_images, **PLANTNET_SHOTS,
                             train_count=lambda n: _split_sizes(n, PLANTNET_SPLIT)[0])


def plantnet_like(n_images: int = 306_146, n_classes: int = 1081, *, group_size: int = 8, image_size: int = 16,
                  seed: int = 0, augment: bool = True, **difficulty) -> Splits:
    """A Pl@ntNet-300K-shaped stand-in (its numbers of images and classes by default): class sizes with the real
    dataset's shares of few-, medium- and many-shot classes (:data:`PLANTNET_SHOTS`, :func:`shot_share_counts`),
    grouped by ``group_size`` look-alike species; about 80/10/10 train/val/test within each class, as in the official
    split; ``difficulty``: the knobs of the module docstring."""
    counts = plantnet_class_sizes(n_images, n_classes)
    generator = torch.Generator().manual_seed(seed + 1)
    group_of_class = torch.randperm(n_classes, generator=generator) // group_size  # head and tail classes mixed
    parts = _split_per_class(counts, PLANTNET_SPLIT, generator)
    description = (f"synthetic Pl@ntNet-300K-like: {n_classes} classes of {counts[-1]} to {counts[0]} images "
                   f"({n_images} in all; few/medium/many-shot shares as the real dataset's), {image_size}px, seed {seed}")
    return _make_splits("plantnet_like", description, parts, group_of_class, image_size, seed,
                        difficulty_of(PLANTNET_DIFFICULTY, difficulty), augment)


def imagenet_lt_like(n_images: int = 115_846, n_classes: int = 1000, *, group_size: int = 10, image_size: int = 16,
                     seed: int = 0, augment: bool = True, **difficulty) -> Splits:
    """An ImageNet-LT-shaped stand-in (its numbers of training images and classes by default): a milder long tail
    than Pl@ntNet's, with ImageNet-LT's shares of few-, medium- and many-shot classes (:data:`IMAGENET_LT_SHOTS`), and
    balanced val and test parts (as ImageNet-LT's 20 and 50 images per class, here 20% of the mean class size each);
    ``difficulty``: the knobs of the module docstring."""
    counts = shot_share_counts(n_classes, n_images, **IMAGENET_LT_SHOTS)
    generator = torch.Generator().manual_seed(seed + 1)
    group_of_class = torch.randperm(n_classes, generator=generator) // group_size
    per_class = max(1, round(0.2 * n_images / n_classes))
    train = torch.arange(n_classes).repeat_interleave(counts)
    held_out = [torch.arange(n_classes).repeat_interleave(per_class) for _ in range(2)]
    parts = [p[torch.randperm(len(p), generator=generator)] for p in (train, *held_out)]
    description = (f"synthetic ImageNet-LT-like: {n_classes} classes, {len(train)} long-tailed training images, "
                   f"{per_class} val/test images per class, {image_size}px, seed {seed}")
    return _make_splits("imagenet_lt_like", description, parts, group_of_class, image_size, seed,
                        difficulty_of(PLANTNET_DIFFICULTY, difficulty), augment)


#: Each stand-in's difficulty knobs and their defaults (the options it takes beside its named parameters).
KNOBS = {"cifar100_like": CIFAR_DIFFICULTY, "plantnet_like": PLANTNET_DIFFICULTY, "imagenet_lt_like": PLANTNET_DIFFICULTY,
         "imagenet_like": PLANTNET_DIFFICULTY}
