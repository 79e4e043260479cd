"""Where the project's files are: one place, no absolute paths elsewhere."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = PROJECT_ROOT / "notebooks"  #: the source notebooks, output-free
FIGURES = PROJECT_ROOT / "figures"  #: figures/<profile>/: generated figures, tables, claim verdicts, notebook manifests
RESULTS = PROJECT_ROOT / "results"  #: the results store of each profile (results/<profile>), kept across reruns
BUILD = PROJECT_ROOT / "build"  #: executed notebooks (build/<profile>/) and the rendered report (build/report/)
CALIBRATED = PROJECT_ROOT / "experiments" / "calibrated"  #: what tuning chose, per profile (experiments.spec.tuned)
BENCHMARK_RESULTS = PROJECT_ROOT / "benchmarks" / "results"  #: CSVs of the benchmark scripts, committed with the code
#: The training engine's epoch, relative to :data:`PROJECT_ROOT`: a timing made with other contents of these files is
#: stale (experiments.analysis.timings).
ENGINE_EPOCH_CODE = ("experiments/engine/train.py", "experiments/engine/batches.py", "experiments/engine/models.py",
                     "data_prep/transforms.py")
#: The library, as git pathspecs: a benchmark of its losses or kernels made with other contents of these is stale
#: (experiments.publishing.result_rows.library_staleness).
LIBRARY_CODE = ("topk", ":(exclude)topk/tests")
#: What a training's numbers come from, as git pathspecs: the engine's epoch, the run's config, runs stacked into one
#: model, the stand-ins' images, the splits and label noise a training reads, and the library's losses (not its
#: tests). A calibration or a committed run of a profile made with other contents of these is stale
#: (experiments.provenance.changed_since). The real datasets' readers are not here: no committed result read them.
TRAINING_CODE = (*ENGINE_EPOCH_CODE, "experiments/engine/config.py", "experiments/engine/stacked.py",
                 "data_prep/synthetic.py", "data_prep/splits.py", "data_prep/label_noise.py", *LIBRARY_CODE)
#: How a warning names what :data:`TRAINING_CODE` holds.
TRAINING_CODE_TEXT = "the training's code (the engine, the losses)"

# Tables of ``figures/<profile>/`` (name without suffix) that docs/stand-ins.md quotes, and the notebook writing each.
LABEL_NOISE_FIT = "table7_label_noise_fit"  #: the label noise each selected model fitted (table4_table7_label_noise)
CROWDED_CLASSES = "table4_crowded_classes"  #: the classes crowding the test top Ks (table4_table7_label_noise)
CALIBRATION_SEEDS = "calibration_seeds"  #: CE's calibration numbers in the tables' runs (calibration_stand_ins)
