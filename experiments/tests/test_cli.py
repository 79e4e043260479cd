"""The experiments' command line as a new user meets it: ``--help`` that can be pasted, an example config that ships
with the package, and a config checked whole (names and values of every option) before anything is built or
trained, each error naming the option and listing the valid ones."""

import json
import re

import pytest

from experiments.__main__ import main
from experiments.engine.config import RunConfig
from experiments.paths import PROJECT_ROOT
from experiments.tests.test_experiments import TINY

EXAMPLE = PROJECT_ROOT / "experiments" / "example_run.json"


def test_help_is_plain_text_whose_commands_can_be_pasted(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    shown = capsys.readouterr().out
    assert exited.value.code == 0 and "``" not in shown and ":func:" not in shown
    commands = re.findall(r"^  ((?:python|torchrun) .*)$", shown, flags=re.M)
    assert len(commands) == 4
    assert "torchrun --nproc_per_node 2 -m experiments experiments/example_run.json --store results/example" in commands
    assert all("python -m experiments" in command or " -m experiments " in command for command in commands)
    for command in commands:  # each names a file that exists, from the repository's root
        assert all((PROJECT_ROOT / word).exists() for word in command.split() if word.endswith(".json")), command
    for word in ("plan PROFILE", "train PROFILE", "run-one KEY"):
        assert word in shown


def test_the_example_config_is_a_run_config():
    config = RunConfig.from_dict(json.loads(EXAMPLE.read_text()))
    assert config.loss == "noised_balanced" and config.dataset == "cifar100_like"


BAD = [
    ({"dataset_options": {**TINY["dataset_options"], "per_class_trian": 4}}, r"unknown option \['per_class_trian'\] "
     r"of the dataset 'cifar100_like'; its options are \[.*'ambiguity'.*'image_size'.*'per_class_train'.*"
     r"'superclass_mixing'"),
    ({"dataset_options": {**TINY["dataset_options"], "noise": 1.5}}, r"'noise' should be a probability in \[0, 1\], "
     r"got 1.5"),
    ({"dataset_options": {**TINY["dataset_options"], "image_size": 16.5}}, "'image_size' should be an integer >= 0, "
     "got 16.5"),
    ({"dataset_options": {**TINY["dataset_options"], "augment": "no"}}, "'augment' should be true or false"),
    ({"dataset_options": {**TINY["dataset_options"], "pixel_noise": -1.0}}, "'pixel_noise' should be a finite "
     "number >= 0, got -1.0"),
    ({"dataset": "cifar100", "dataset_options": {"noise": 0.2, "noise_sed": 1}}, r"unknown option \['noise_sed'\] of "
     r"the dataset 'cifar100'; its options are \['augment', 'expected_md5', 'expected_sizes', 'noise', 'noise_groups',"
     r" 'noise_seed'\]"),
    ({"dataset_options": [1, 2]}, "'dataset_options' should be a mapping"),
    ({"model_options": {"widht": 8}}, r"unknown model_options \['widht'\] of the model 'small_cnn'; its options are "
     r"\['cosine_scale', 'width'\]"),
    ({"model": "densenet40_40", "model_options": {"depth": 100}}, r"unknown model_options \['depth'\] of the model "
     r"'densenet40_40'; its options are \['cosine_scale'\]"),
    ({"loss_options": {**TINY["loss_options"], "sclae": 30.0}}, r"'loss_options' .* of the loss 'noised_balanced': "
     r"build_loss\('noised_balanced', ...\): unknown parameter \['sclae'\]; its parameters are k, epsilon, n_samples"),
    ({"loss_options": {"k": 5, "epsilon": 0.2}}, r"missing \['n_samples'\]"),
    ({"loss_options": {**TINY["loss_options"], "epsilon": -0.1}}, "'epsilon' should be >= 0.0, got -0.1"),
    ({"loss_options": {**TINY["loss_options"], "margins": -1.0}}, "'margins' should be >= 0.0, got -1.0"),
    ({"loss": "ldam", "loss_options": {"max_margin": -0.5}}, "'max_margin' should be >= 0.0, got -0.5"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[re.sub(r"\W+", " ", m)[:40] for _, m in BAD])
def test_a_bad_option_is_refused_when_the_config_is_made_naming_it_and_the_valid_ones(change, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**{**TINY, **change})


def test_parts_checked_once_are_still_told_apart_from_bad_ones_that_look_alike():
    """The configs' parts are checked once per process: a refused config is refused again, and a value that differs
    from an accepted one only in its type (True for 1, a float for an integer) is checked on its own."""
    RunConfig(**TINY)
    for _ in range(2):
        with pytest.raises(ValueError, match="unknown model_options"):
            RunConfig(**{**TINY, "model_options": {"widht": 8}})
    with pytest.raises(ValueError, match="'augment' should be true or false"):
        RunConfig(**{**TINY, "dataset_options": {**TINY["dataset_options"], "augment": 1}})
    with pytest.raises(ValueError, match="'per_class_train' should be an integer"):  # TINY's 4 was accepted
        RunConfig(**{**TINY, "dataset_options": {**TINY["dataset_options"], "per_class_train": 4.0}})


def test_the_command_refuses_a_bad_config_before_training_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**json.loads(EXAMPLE.read_text()), "model_options": {"widht": 8}}))
    assert main([str(path), "--store", str(tmp_path / "store")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: bad config {path}: unknown model_options ['widht']") and "Traceback" not in error
    assert not (tmp_path / "store").exists()  # nothing was built, nothing written
