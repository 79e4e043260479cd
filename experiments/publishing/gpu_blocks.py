"""The generated blocks of what GPUs measured (the training step, the kernels, Fig. 3's epochs, runs side by side and
the ``gpu`` profile's hours they give) and of the profiles' time estimates, from ``benchmarks/results/``; registered
in :data:`experiments.publishing.readme.BLOCKS`."""

from __future__ import annotations

import functools
from pathlib import Path

from experiments.analysis import kernel_targets, timings
from experiments.paths import BENCHMARK_RESULTS
from experiments.scale.hours import (Estimate, Rates, calibration_first_then, completeness_then_hours, counted_text,
                                    fastest, invocations, setting_text)
from experiments.publishing.result_rows import (SMOOTH_HEADLINE, by_measurement, engine_staleness, headline_rows,
                                                library_staleness, read_rows, split_by, stamp_text)

#: The CSVs of GPU measurements the ``gpu-results`` block reads.
GPU_CSVS = ("training_step.csv", "step_profile.csv", "fig3_epoch_time.csv", "fused_kernel.csv")


def _training_steps(results: Path) -> str:
    tables = []
    for rows in by_measurement([r for r in read_rows(results / "training_step.csv") if r["device"] == "cuda"]):
        lines = ["| step | loss | backend | K | B | ms per step | over CE (same run) |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['mode']} | {r['loss'].split(' ')[0]} | {r['backend'] or '-'} | {r['K'] or '-'} | {r['B'] or '-'} "
                  f"| {float(r['ms_per_step']):.2f} | {100 * float(r['overhead_vs_ce']):+.1f}% |" for r in rows]
        tables.append(f"{library_staleness(rows[0], 'bash benchmarks/gpu_session.sh step compiled')}"
                      f"Training step, {rows[0]['model']}, batch {rows[0]['batch_size']} (`training_step.csv`; "
                      f"{stamp_text(rows[0])}):\n\n" + "\n".join(lines))
    return "\n\n".join(tables)


def _step_profiles(results: Path) -> str:
    """Where each profiled compiled step's device time went, and what faster library kernels could gain."""
    return "\n\n".join(
        f"The {r['compile']} step of {r['model']}, batch {r['batch_size']}, profiled (`step_profile.csv`; {stamp_text(r)}):"
        f" {float(r['step_ms']):.2f} ms a step over {r['steps']} steps timed before the profiled ones, whose device "
        f"work was {float(r['items_per_step']):.0f} kernels and copies a step summing {float(r['items_ms_per_step']):.2f}"
        f" ms ({float(r['busy']):.0%} of the timed step), {float(r['share_under_50us']):.0%} of that time in items under "
        f"50 us; {timings.library_bound_text(r)}."
        for r in read_rows(results / "step_profile.csv") if r["device"] == "cuda")


def _smooth_hinge_gpu(results: Path) -> str:
    by_method, _, _ = headline_rows(results / "smooth_hinge_cuda.csv", SMOOTH_HEADLINE, (), "cuda")
    if "cross_entropy" not in by_method:
        return ""
    ce = float(by_method["cross_entropy"]["ms"])
    parts = [f"{name} {float(by_method[name]['ms']):.2f} ms (x{float(by_method[name]['ms']) / ce:.1f})"
             for name in ("smooth_hinge_triton", "smooth_hinge_triton_compiled", "smooth_hinge") if name in by_method]
    return (f"{library_staleness(by_method['cross_entropy'], 'bash benchmarks/gpu_session.sh hinge')}"
            f"Smoothed hinge, batch 128, L 1,000, K 5, forward + backward against cross-entropy's {ce:.2f} ms "
            f"(target <= x5 on CUDA): {', '.join(parts)} (`smooth_hinge_cuda.csv`; {stamp_text(by_method['cross_entropy'])})")


def _fused_kernel(results: Path) -> str:
    parts = []
    for rows in by_measurement([r for r in read_rows(results / "fused_kernel.csv") if r["device"] == "cuda"]):
        if lines := kernel_targets.summary(rows, "cuda"):
            parts.append(f"{library_staleness(rows[0], 'bash benchmarks/gpu_session.sh kernel')}"
                         f"Fused kernel, forward + backward of the noised hinge, eager (`fused_kernel.csv`; "
                         f"{stamp_text(rows[0])}):\n\n" + "\n".join(f"- {line}" for line in lines))
    return "\n\n".join(parts)


def _epochs(results: Path) -> str:
    parts = []
    for rows in by_measurement([r for r in read_rows(results / "fig3_epoch_time.csv") if r["device"] == "cuda"]):
        lines = [f"- whole epoch of {int(r['images']):,} images, the training engine compiled ({r['compile']}), "
                 f"{_loss_label(r)}: {float(r['epoch_seconds']):.2f} s" for r in rows]
        parts.append(f"Fig. 3's epochs (`fig3_epoch_time.csv`; {stamp_text(rows[0])}):\n\n"
                     + engine_staleness(rows[0], "python -m benchmarks.bench_epoch_time", " on a GPU")
                     + "\n".join(lines))
    return "\n\n".join(parts)


def _loss_label(row: dict) -> str:
    """A Fig. 3 row's loss with its K and backend where it has them, and whether it is the baseline's closing
    measurement (``repeat`` 1)."""
    details = [f"K = {row['K']}"] * bool(row["K"]) + [f"{row['backend']} backend"] * bool(row["backend"])
    details += ["measured again last"] * timings.repeat_of(row)
    return f"{row['loss']} ({', '.join(details)})" if details else row["loss"]


def gpu_results(results: Path = BENCHMARK_RESULTS) -> str:
    """What the committed GPU measurements say, or that there are none."""
    parts = [part for part in (_training_steps(results), _step_profiles(results), _smooth_hinge_gpu(results),
                               _fused_kernel(results), _epochs(results)) if part]
    if not parts:
        return ("*No GPU measurement is committed yet: " + ", ".join(f"`benchmarks/results/{name}`" for name in GPU_CSVS)
                + " hold no CUDA row.*")
    return "\n\n".join(parts)


def profile_time(results: Path = BENCHMARK_RESULTS) -> str:
    """Each committed estimate of a profile's time (``python -m benchmarks.bench_profile_time``): hours of the training
    notebooks, of the learning-rate choice's runs beyond theirs (where the profile chooses) and of one calibration
    point, on the machine that measured it."""
    from experiments.analysis.workload import CALIBRATION_POINT, CHOICE

    lines = []
    for path in sorted(results.glob("profile_time_*.csv")):
        rows = read_rows(path)
        if not rows:
            continue
        hours = {part: sum(float(r["hours"]) for r in rows if r["notebook"] == part)
                 for part in (CHOICE, CALIBRATION_POINT)}
        notebooks = sum(float(r["hours"]) for r in rows) - sum(hours.values())
        choice = (f", the learning-rate choice's other runs {hours[CHOICE]:.2f} h (trained only when the choice is made "
                  f"again)" if any(r["notebook"] == CHOICE for r in rows) else "")
        lines.append(f"- {_stale_workload_warning(rows)}`{rows[0]['profile']}` profile: training notebooks "
                     f"{notebooks:.2f} h{choice}, one calibration point on every seed {hours[CALIBRATION_POINT]:.2f} h "
                     f"({stamp_text(rows[0])}; `{path.name}`)")
    if not any(results.glob("profile_time_gpu_*.csv")) and (bound := gpu_cifar_lower_bound(results)):
        lines.append(bound)
    return "\n".join(lines) or "*No profile time estimate in `benchmarks/results/`: run `make profile-time`.*"


def _stale_workload_warning(rows: list[dict]) -> str:
    """A warning when a profile time estimate's images (its rows' training and evaluated images per notebook and
    setup) are not what :func:`experiments.analysis.workload.profile_work` counts today, or nothing."""
    from experiments.analysis.workload import profile_work
    from experiments.spec.profiles import get_profile

    profile = rows[0]["profile"]
    today = {(work.notebook, work.setup): (str(work.train_images), str(work.eval_images))
             for work in profile_work(get_profile(profile))}
    counted = {(row["notebook"], row.get("setup")): (row.get("train_images"), row.get("eval_images")) for row in rows}
    if counted == today:
        return ""
    return (f"**Stale:** its images are not those `experiments/analysis/workload.py` counts today; rerun `make "
            f"profile-time PROFILE={profile} DEVICE={rows[0]['device']}`. ")


@functools.cache
def _gpu_cifar_runs() -> tuple:
    """The ``gpu`` profile's planned CIFAR-100 runs (:func:`experiments.scale.plan.plan`)."""
    from experiments.scale.plan import plan
    from experiments.spec.profiles import GPU

    return tuple(plan(GPU, ("cifar",)))


@functools.cache
def _gpu_cifar_calibration(searched: int | None):
    """What ``make calibrate`` trains first for the ``gpu`` profile's CIFAR-100 stand-in, its search averaging
    ``searched`` seeds (None: every seed; :class:`experiments.scale.plan.CalibrationFirst`), or None when its stored
    calibration is current."""
    from experiments.scale.plan import calibrations_to_make
    from experiments.spec.profiles import GPU

    return calibrations_to_make(GPU, searched).get("cifar")


def _calibration_text(*estimated: tuple[Estimate, list[dict]]) -> str:
    """The least hours of the CIFAR-100 notebooks with their stand-in's calibration first
    (:func:`experiments.scale.hours.calibration_first_then`), its search averaging one seed, then every seed, for each
    of ``estimated`` (the notebooks' estimate on one GPU, then on several, each with its invocation's rows); that the
    calibration is current, if it is; nothing where a rate was not measured."""
    from experiments.spec.profiles import GPU

    first, every = _gpu_cifar_calibration(1), _gpu_cifar_calibration(None)
    if first is None:
        return "; its stand-in's calibration is committed: nothing to train before them"
    found = [[calibration_first_then(each, search, Rates.from_rows(rows)) for each, rows in estimated]
             for search in (first, every)]
    if None in found[0] + found[1]:
        return ""

    def hours(estimates: list[Estimate]) -> str:
        return " and ".join(f"{each.hours:.1f} h on {'one' if each.gpus == 1 else each.gpus}" for each in estimates)

    return (f"; with the [calibration](docs/reproducing.md#the-calibrations-hours) of its stand-in first "
            f"(`make calibrate`: at least {len(first.runs)} runs in {len(first.moves)} moves, each waiting for the "
            f"last, {len(first.notebooks_trained)} of them the notebooks' own, where the seeds at the search's start "
            f"agree so closely that it averages one), at least {hours(found[0])} ({len(every.runs)} runs and "
            f"{hours(found[1])} where it needs all {len(GPU.cifar.seeds)} seeds)")


def calibration_work() -> str:
    """Whether each of the ``gpu`` profile's stand-ins is calibrated, and if not what ``make calibrate`` trains at
    least before its notebooks (:func:`experiments.scale.plan.calibrations_to_make`): moves, runs, and the training
    images of those that are not the notebooks' own against the notebooks'."""
    from experiments.scale.plan import calibrations_to_make
    from experiments.spec.profiles import GPU

    fewest, every, lines = calibrations_to_make(GPU), calibrations_to_make(GPU, searched=None), []
    for setup in GPU.calibrated_setups:
        dataset = getattr(GPU, setup).dataset
        if (first := fewest.get(setup)) is None:
            lines.append(f"- `{dataset}`: calibrated (`experiments/calibrated/gpu.json`): nothing to train first")
            continue
        def others(search) -> str:  # the runs that are not the notebooks' own, and their images against the notebooks'
            notebooks = search.notebooks_left + search.notebooks_trained
            images = sum(run.train_images for run in search.runs) - sum(run.train_images
                                                                         for run in search.notebooks_trained)
            return (f"{len(search.notebooks_trained)} of them the notebooks' own, the "
                    f"{len(search.runs) - len(search.notebooks_trained)} others {images:,} training images, "
                    f"x{images / sum(run.train_images for run in notebooks):.2f} those of its notebooks' "
                    f"{len(notebooks)} runs")

        lines.append(f"- `{dataset}`: not calibrated; at least {len(first.runs)} runs in {len(first.moves)} moves "
                     f"searching on one seed, {others(first)}; {len(every[setup].runs)} runs on all "
                     f"{len(getattr(GPU, setup).seeds)} seeds, {others(every[setup])}")
    return "\n".join(lines)


def _gpu_cifar_images() -> str:
    """How many runs and images: "119 runs, N training images, N validated, N tested at most"."""
    runs = _gpu_cifar_runs()
    return (f"{len(runs)} runs, {sum(run.train_images for run in runs):,} training images, "
            f"{sum(run.val_images for run in runs):,} validated, {sum(run.test_images for run in runs):,} tested at most")


def _fastest(rows: list[dict]) -> tuple[Estimate, Estimate]:
    """The fastest setting of one invocation's ``rows`` for the ``gpu`` profile's CIFAR-100 notebooks on one GPU and on
    :data:`timings.GPUS` (:func:`experiments.scale.hours.fastest`)."""
    runs, rates = list(_gpu_cifar_runs()), Rates.from_rows(rows)
    return fastest(runs, rates, 1), fastest(runs, rates, timings.GPUS)


def _hours_text(one: Estimate, eight: Estimate, device_name: str, rows: tuple[dict, dict] | None = None) -> str:
    """"9.1 h on one NVIDIA H200 with `PER_GPU=1 STACK=8` and 1.6 h on 8 with `PER_GPU=1 STACK=4`" ("... and 1.6 h on
    8, both with ..." for one setting), each with its invocation's compile mode where ``rows`` (each estimate's
    invocation) are given, then what the hours count."""
    settings = [f", {timings.sharing_text(row)}" for row in rows] if rows else ["", ""]
    counted = (counted_text(one) if one.left_out == eight.left_out else
               f"on one GPU {counted_text(one)}, on {eight.gpus} {counted_text(eight)}")
    one_setting, eight_setting = setting_text(one) + settings[0], setting_text(eight) + settings[1]
    if one_setting == eight_setting:
        return (f"{one.hours:.1f} h on one {device_name} and {eight.hours:.1f} h on {eight.gpus}, both with "
                f"{one_setting} (estimated: {counted}")
    return (f"{one.hours:.1f} h on one {device_name} with {one_setting} and {eight.hours:.1f} h on {eight.gpus} with "
            f"{eight_setting} (estimated: {counted}")


def concurrency(path: Path = BENCHMARK_RESULTS / "concurrency.csv") -> str:
    """Trainings side by side on one GPU (:mod:`benchmarks.bench_concurrency`), one line per invocation: one run's
    images/s, each concurrency's and each stack's aggregate against it, and the ``gpu`` profile's CIFAR-100 notebooks'
    estimated hours at the invocation's fastest setting, on one such GPU and on eight (:mod:`experiments.scale.hours`);
    then the fastest with today's engine on each GPU model."""
    by_date = split_by(read_rows(path), "date")
    if not by_date:
        return (f"*No `{path.name}` in `benchmarks/results/`: run `bash benchmarks/gpu_session.sh concurrency` on a "
                f"GPU.*")
    lines = []
    for rows in by_date:
        one = rows[0]
        stale = next((engine_staleness(row, "bash benchmarks/gpu_session.sh concurrency", " on a GPU").rstrip()
                      for row in rows if not timings.made_with_todays_engine(row)), "")
        ratios = _ratios(rows[1:])
        lines.append(f"- {stale + ' ' if stale else ''}{one['device_name']}, {one['model']}, batch {one['batch_size']}, "
                     f"the engine's step ({timings.sharing_text(one)}): one run {float(one['aggregate_images_per_s']):,.0f} "
                     f"images/s{f'; {ratios} (target >= x{timings.RATIO_TARGET:g} on an H100)' if ratios else ''}; "
                     f"the `gpu` profile's CIFAR-100 notebooks ({_gpu_cifar_images()}) would take "
                     f"{_hours_text(*_fastest(rows), one['device_name'])}; targets "
                     f"{timings.ONE_GPU_HOURS_TARGET:g} h and {timings.EIGHT_GPUS_HOURS_TARGET:g} h; `concurrency.csv`: "
                     f"{stamp_text(one)})")
    for device_name, (one, one_rows), (eight, eight_rows) in _fastest_current(path):
        lines.append(f"- **Fastest with today's engine on the {device_name}:** "
                     f"{_hours_text(one, eight, device_name, (one_rows[0], eight_rows[0]))})")
    return "\n".join(lines)


def _ratios(rows: list[dict]) -> str:
    """Each measurement's aggregate against one run's: "side by side 2 x1.80, 4 x3.60; stacked 4 x2.10, 2 x 4 x3.00"."""
    def ratio(row: dict) -> str:
        return f"x{float(row['ratio_to_one_run']):.2f}"

    side_by_side = [f"{row['concurrency']} {ratio(row)}" for row in rows if timings.stacked_runs(row) == 1]
    stacked = [f"{row['concurrency'] + ' x ' if row['concurrency'] != '1' else ''}{timings.stacked_runs(row)} "
               f"{ratio(row)}" for row in rows if timings.stacked_runs(row) > 1]
    return "; ".join([*[f"side by side {', '.join(side_by_side)}"] * bool(side_by_side),
                      *[f"stacked into one model {', '.join(stacked)}"] * bool(stacked)])


def _fastest_current(path: Path, current: bool = True) -> list[tuple[str, tuple[Estimate, list[dict]],
                                                                          tuple[Estimate, list[dict]]]]:
    """Per GPU model, among the invocations measured with today's engine (with ``current`` False: with an earlier one)
    on the ``gpu`` profile's CIFAR-100 model and batch (:func:`experiments.scale.hours.invocations`; of each, its
    rows made with that engine), the best estimate of its CIFAR-100 notebooks' hours on one GPU
    and, apart, on eight (:func:`experiments.scale.hours.completeness_then_hours`: the most complete, then the
    fastest): the GPU's name, and each estimate with its invocation's rows."""
    measured = [[row for row in invocation if timings.made_with_todays_engine(row) == current]
                for invocation in invocations(read_rows(path), _gpu_cifar_runs())]
    by_gpu: dict[str, list] = {}
    for invocation in (invocation for invocation in measured if invocation):
        by_gpu.setdefault(invocation[0]["device_name"], []).append(invocation)
    found = []
    for device_name, same_gpu in by_gpu.items():
        estimates = [(_fastest(invocation), invocation) for invocation in same_gpu]
        best = [min(((pair[gpus], row) for pair, row in estimates), key=lambda each: completeness_then_hours(each[0]))
                for gpus in (0, 1)]
        found.append((device_name, *best))
    return found


def gpu_hours(path: Path = BENCHMARK_RESULTS / "concurrency.csv") -> str:
    """The README's line (one, whatever the GPU models measured): how long the ``gpu`` profile's CIFAR-100 notebooks
    would take at the fastest setting measured with today's engine on each GPU model (:func:`concurrency` has every
    measurement); without such a measurement, the fastest setting an earlier engine measured, said to be stale."""
    def hours(fastest_found: list) -> str:
        return "; in ".join(f"{_hours_text(one, eight, name, (one_rows[0], eight_rows[0]))}; "
                            f"{'; '.join(dict.fromkeys(stamp_text(rows[0]) for rows in (one_rows, eight_rows)))})"
                            + _calibration_text((one, one_rows), (eight, eight_rows))
                            for name, (one, one_rows), (eight, eight_rows) in fastest_found)

    other_counts = "on N GPUs at each measured setting: `python -m experiments plan gpu --gpus N`"
    if current := _fastest_current(path):
        return (f"*The `gpu` profile's CIFAR-100 notebooks would take {hours(current)} (`{path.name}`, "
                f"[measurements](docs/reproducing.md#runs-side-by-side-on-one-gpu)); {other_counts}.*")
    earlier = _fastest_current(path, current=False)
    return ("*The `gpu` profile's training time is not measured with today's engine"
            + (f" (with an earlier one, its CIFAR-100 notebooks would have taken {hours(earlier)}; stale)"
               if earlier else "")
            + f": run `bash benchmarks/gpu_session.sh concurrency reduce-overhead` on a GPU; {other_counts}.*")


def gpu_cifar_lower_bound(results: Path = BENCHMARK_RESULTS) -> str:
    """Until the ``gpu`` profile's time is measured: its CIFAR-100 notebooks' training steps at the compiled
    DenseNet-40-40 cross-entropy step of ``training_step.csv`` (the paper's batch of 64), a lower bound."""
    from experiments.spec.profiles import GPU

    steps = [row for row in read_rows(results / "training_step.csv") if row["device"] == "cuda"
             and row["model"] == "densenet40_40" and row["mode"] == "compiled" and row["loss"] == "cross_entropy"
             and int(row["batch_size"]) == GPU.cifar.batch_size]
    images, lines = sum(run.train_images for run in _gpu_cifar_runs()), []
    for measured in by_measurement(steps):
        ms = sum(float(row["ms_per_step"]) for row in measured) / len(measured)
        hours = images / GPU.cifar.batch_size * ms / 3.6e6
        lines.append(f"- `gpu` profile, CIFAR-100's training notebooks alone, one run at a time: at least {hours:.0f} "
                     f"h on {measured[0]['device_name']} ({images:,} training images at {ms:.2f} ms per batch of "
                     f"{GPU.cifar.batch_size}, the compiled cross-entropy step of DenseNet-40-40, mean of {len(measured)} "
                     f"in `training_step.csv`: {stamp_text(measured[0])}); evaluation, the other setups and the losses' own "
                     f"cost come on top")
    return "\n".join(lines)
