"""The synthetic stand-ins: seeded, shaped like the real datasets, hard for a linear model yet learnable."""

import hashlib

import pytest
import torch
import torch.nn.functional as F

from data_prep import synthetic
from topk.metrics import TopKAccuracy, shot_groups


def test_same_seed_same_data_other_seed_other_data():
    a, b = synthetic.cifar100_like(5, 2, 2, seed=3), synthetic.cifar100_like(5, 2, 2, seed=3)
    c = synthetic.cifar100_like(5, 2, 2, seed=4)
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.test.labels, b.test.labels)
    assert not torch.equal(a.train.images, c.train.images)


def test_cifar100_like_has_100_classes_in_20_superclasses_of_32px_images():
    splits = synthetic.cifar100_like(10, 2, 3)
    assert splits.num_classes == 100 and splits.synthetic
    assert splits.train.images.shape == (1000, 3, 32, 32) and splits.class_counts.tolist() == [10] * 100
    assert torch.bincount(splits.info["coarse_of_fine"]).tolist() == [5] * 20
    assert "synthetic CIFAR-100-like" in splits.description


def test_cifar100_like_label_noise_stays_within_superclasses_and_only_touches_training_labels():
    clean, noisy = synthetic.cifar100_like(40, 2, 3), synthetic.cifar100_like(40, 2, 3, noise=0.5, noise_seed=1)
    coarse = clean.info["coarse_of_fine"]
    changed = noisy.train.labels != clean.train.labels
    assert torch.equal(coarse[noisy.train.labels], coarse[clean.train.labels])
    # A redraw among the 5 classes of the superclass keeps the label with probability 1/5: flip rate 0.4.
    assert abs(changed.float().mean().item() - 0.4) < 0.03 and noisy.info["flip_rate"] == changed.float().mean().item()
    assert torch.equal(noisy.val.labels, clean.val.labels) and torch.equal(noisy.test.labels, clean.test.labels)
    assert noisy.class_counts.sum() == 4000 and "label noise p = 0.5" in noisy.description
    assert torch.equal(noisy.info["clean_train_labels"], clean.train.labels) and "clean_train_labels" not in clean.info


def test_superclass_mixing_moves_noise_across_visual_groups_and_leaves_the_images_alone():
    plain, mixed = (synthetic.cifar100_like(8, 2, 3, noise=0.5, superclass_mixing=m) for m in (0.0, 0.4))
    assert torch.equal(plain.train.images, mixed.train.images) and torch.equal(plain.test.labels, mixed.test.labels)
    visual, superclass = plain.info["coarse_of_fine"], mixed.info["coarse_of_fine"]
    assert torch.equal(visual, torch.arange(100) // 5)
    assert torch.bincount(superclass).tolist() == [5] * 20  # sizes kept
    moved = int((superclass != visual).sum())
    assert 25 <= moved <= 40  # 40 classes permuted among themselves, a few drawing their own group back
    # the noise now redraws within the mixed superclasses, so some flipped labels leave their visual group
    clean, noisy = mixed.info["clean_train_labels"], mixed.train.labels
    assert torch.equal(superclass[noisy], superclass[clean]) and bool((visual[noisy] != visual[clean]).any())
    assert "40% of the classes mixed" in mixed.description and "mixed" not in plain.description


@pytest.mark.parametrize("mixing", [-0.1, 1.5, "0.2", True])
def test_superclass_mixing_out_of_range_is_refused_by_name(mixing):
    with pytest.raises(ValueError, match=r"superclass_mixing.*\[0, 1\]"):
        synthetic.cifar100_like(2, 1, 1, superclass_mixing=mixing)


def test_imagenet_like_is_balanced_with_look_alike_groups():
    splits = synthetic.imagenet_like(6, 2, 2, n_classes=50, group_size=5)
    assert splits.num_classes == 50 and splits.class_counts.tolist() == [6] * 50
    assert len(splits.val) == len(splits.test) == 100 and splits.train.images.shape[1:] == (3, 16, 16)


@pytest.mark.parametrize("make, shots, n_images, n_classes", [
    (synthetic.plantnet_like, synthetic.PLANTNET_SHOTS, 12_000, 100),
    (synthetic.imagenet_lt_like, synthetic.IMAGENET_LT_SHOTS, 10_000, 100),
])
def test_long_tailed_stand_ins_have_the_real_shares_of_few_medium_and_many_shot_classes(make, shots, n_images, n_classes):
    splits = make(n_images, n_classes, image_size=4)
    groups = {name: int(mask.sum()) for name, mask in shot_groups(splits.class_counts).items()}
    many, few = round(shots["many_share"] * n_classes), round(shots["few_share"] * n_classes)
    assert groups == {"few": few, "medium": n_classes - few - many, "many": many}
    assert len(splits.train) + (len(splits.val) + len(splits.test)) * (make is synthetic.plantnet_like) == n_images


def test_shot_share_counts_at_full_size_sum_right_fall_with_rank_and_refuse_too_few_images():
    counts = synthetic.shot_share_counts(1081, 306_146, **synthetic.PLANTNET_SHOTS)
    assert counts.sum() == 306_146 and counts.min() == 4 and bool((counts[:-1] >= counts[1:]).all())
    with pytest.raises(ValueError, match="n_images should be at least .* got 1000"):
        synthetic.shot_share_counts(100, 1000, **synthetic.PLANTNET_SHOTS)
    with pytest.raises(ValueError, match="many_share > 0"):
        synthetic.shot_share_counts(100, 10_000, few_share=0.8, many_share=0.3, min_count=4)
    with pytest.raises(ValueError, match="min_count should leave a class 1 to 19 training images, got 25"):
        synthetic.shot_share_counts(100, 10_000, few_share=0.5, many_share=0.3, min_count=25)


def test_long_tailed_stand_ins_keep_every_class_in_every_split():
    for splits in (synthetic.plantnet_like(6000, 50), synthetic.imagenet_lt_like(3000, 30)):
        for part in (splits.train, splits.val, splits.test):
            assert torch.bincount(part.labels, minlength=splits.num_classes).min() >= 1
        assert splits.class_counts.max() > 10 * splits.class_counts.min()


def _one_epoch_linear(splits, lr=0.01):
    torch.manual_seed(0)
    images = torch.stack([splits.train.transform(im) for im in splits.train.images]).flatten(1)
    model = torch.nn.Linear(images.shape[1], splits.num_classes)
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for rows in torch.randperm(len(images)).split(64):
        optimiser.zero_grad()
        F.cross_entropy(model(images[rows]), splits.train.labels[rows]).backward()
        optimiser.step()
    test = torch.stack([splits.test.transform(im) for im in splits.test.images]).flatten(1)
    with torch.no_grad():
        scores = model(test)
    metric = TopKAccuracy((1, 5))
    metric.update(scores, splits.test.labels)
    return metric.compute()


def test_cifar100_like_is_not_solved_by_a_linear_model_in_one_epoch_but_is_learnable():
    accuracy = _one_epoch_linear(synthetic.cifar100_like(100, 10, 20, augment=False))
    top1, top5 = accuracy[1], accuracy[5]
    print(f"linear model, one epoch: top-1 {top1:.3f}, top-5 {top5:.3f}")
    assert top1 < 0.6, top1  # far from separable
    assert top5 > 3 * 0.05, top5  # well above chance (5%): there is signal to learn


def test_difficulty_knobs_change_the_images_and_bad_knobs_are_refused_by_name():
    default = synthetic.imagenet_like(2, 1, 1, n_classes=10, augment=False)
    noisier = synthetic.imagenet_like(2, 1, 1, n_classes=10, augment=False, pixel_noise=3.0)
    assert torch.equal(default.train.labels, noisier.train.labels)
    assert not torch.equal(default.train.images, noisier.train.images)
    assert noisier.info["pixel_noise"] == 3.0 and default.info["pixel_noise"] == synthetic.PLANTNET_DIFFICULTY["pixel_noise"]
    with pytest.raises(TypeError, match="pixel_nois"):
        synthetic.cifar100_like(2, 1, 1, pixel_nois=1.0)
    with pytest.raises(ValueError, match="'class_contrast' should be a number >= 0, got -0.5"):
        synthetic.plantnet_like(1500, 20, class_contrast=-0.5)
    with pytest.raises(ValueError, match="'max_shift' should be an integer"):
        synthetic.imagenet_lt_like(1500, 20, max_shift=1.5)
    with pytest.raises(ValueError, match="'ambiguity' is a probability: it should be at most 1, got 1.5"):
        synthetic.imagenet_like(2, 1, 1, n_classes=10, ambiguity=1.5)


def test_ambiguity_shows_another_class_as_often_as_asked_and_keeps_the_labels():
    group_of_class = torch.arange(50) // 5
    model = synthetic.ImageModel(group_of_class, 8, torch.Generator().manual_seed(0), class_contrast=0.5, clutter=0.0,
                                 pixel_noise=0.0, max_shift=0, ambiguity=0.3, contrast_spread=0.0)
    labels = torch.arange(50).repeat(200)
    shown = model.drawn_as(labels, torch.Generator().manual_seed(1))
    assert abs((shown != labels).float().mean().item() - 0.3) < 0.02
    assert torch.bincount(shown[shown != labels], minlength=50).min() > 0  # any class, not only the group's
    plain = synthetic.imagenet_like(3, 1, 1, n_classes=10, augment=False)
    some = synthetic.imagenet_like(3, 1, 1, n_classes=10, augment=False, ambiguity=0.5)
    assert torch.equal(plain.train.labels, some.train.labels) and not torch.equal(plain.train.images, some.train.images)


def test_contrast_spread_gives_each_class_a_log_normal_contrast_around_the_class_contrast():
    group_of_class = torch.arange(4000) // 8
    knobs = {"clutter": 0.0, "pixel_noise": 0.0, "max_shift": 0, "ambiguity": 0.0}

    def templates(class_contrast, contrast_spread):
        return synthetic.ImageModel(group_of_class, 8, torch.Generator().manual_seed(0), class_contrast=class_contrast,
                                    contrast_spread=contrast_spread, **knobs).templates

    groups_alone = templates(0.0, 0.0)
    log_contrast = ((templates(0.5, 0.7) - groups_alone).flatten(1).std(dim=1) / 0.5).log()
    assert abs(log_contrast.mean().item()) < 0.05 and abs(log_contrast.std().item() - 0.7) < 0.03
    alike = ((templates(0.5, 0.0) - groups_alone).flatten(1).std(dim=1) / 0.5).log()
    assert alike.abs().max().item() < 1e-4  # no spread: every class at the class contrast
    some = synthetic.plantnet_like(2000, 20, augment=False, contrast_spread=1.0)
    plain = synthetic.plantnet_like(2000, 20, augment=False)
    assert torch.equal(plain.train.labels, some.train.labels) and not torch.equal(plain.train.images, some.train.images)


def _drawn(splits) -> tuple[str, int, int]:
    """The labels' digest, the pixels' count and sum: a pixel may round the other way on another CPU (float sums in
    another order), a change of the drawing moves the sum far more."""
    parts = (splits.train, splits.val, splits.test)
    labels = hashlib.sha256(b"".join(part.labels.numpy().tobytes() for part in parts)).hexdigest()[:16]
    return labels, sum(part.images.numel() for part in parts), sum(int(part.images.long().sum()) for part in parts)


#: What each stand-in draws at its version in ``GENERATOR_VERSIONS`` (1 where absent): labels' digest, pixels, their
#: sum. CIFAR-100's and ImageNet's are those of every commit since 1afa2ea at least (``ambiguity`` 0 takes nothing
#: from the images' random stream).
DRAWN = {"cifar100_like": (1, ("ea3cbcaa8a715be9", 96_000, 12_128_139)),
         "imagenet_like": (1, ("c33105e319c790f4", 76_800, 10_026_822)),
         "plantnet_like": (2, ("3cfd983d7879e450", 288_000, 33_670_428)),
         "imagenet_lt_like": (2, ("2ef65e6b2fbc565c", 403_200, 52_579_667))}


def test_a_stand_in_draws_what_its_generator_version_drew():
    """Fails when a stand-in's drawing changes: bump its GENERATOR_VERSIONS entry (so that runs on the earlier data
    are not reused from a results store), then this record."""
    drawn = {"cifar100_like": synthetic.cifar100_like(3, 1, 1, image_size=8),
             "imagenet_like": synthetic.imagenet_like(3, 1, 1, n_classes=20),
             "plantnet_like": synthetic.plantnet_like(1500, 20, image_size=8),
             "imagenet_lt_like": synthetic.imagenet_lt_like(1500, 20, image_size=8)}
    for name, splits in drawn.items():
        version, (labels, pixels, total) = DRAWN[name]
        assert synthetic.GENERATOR_VERSIONS.get(name, 1) == version, name
        got_labels, got_pixels, got_total = _drawn(splits)
        assert (got_labels, got_pixels) == (labels, pixels), name
        assert abs(got_total - total) <= 1e-3 * pixels, (name, got_total, total)
