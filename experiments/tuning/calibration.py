"""Each synthetic stand-in's difficulty fitted to the paper's **cross-entropy** numbers alone, at a profile's scale.

CE is the paper's baseline on every dataset, not a method under test: fitting the data to it says nothing about the
other losses, which are then judged on data as hard for CE as the real data. For each setup, the CE runs behind the
tables' fitted numbers are trained at candidate difficulty knobs (:mod:`data_prep.synthetic`) chosen by a compass
search that minimises the RMS gap, in points, between CE's numbers (the seeds' mean, as the tables show them) and the
paper's; held-out numbers show how faithful the stand-in is beyond the fit. The search trains every seed at its start;
where their spread allows, it averages fewer at the other points it tries (:func:`search_seeds`), and the knobs it
chooses are measured on every seed again. Where a number stays unmatched, :func:`unmatched` says why from the points
searched.

CE trains at a learning rate: the first search uses the grid's, and :mod:`experiments.tuning.fixed_point` searches again
at the rate CE then chooses (:mod:`experiments.tuning.learning_rates`) until the two agree. The result of a search is a
:class:`experiments.spec.tuned.Calibration`, stored in ``experiments/calibrated/<profile>.json``. Runs go through the
results store, so the chosen point's runs are the very runs the tables use, while the code that trained them is
today's: a calibration made before the training's code last changed is searched again (:func:`trained_by_todays_code`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pandas as pd
from scipy import stats

from experiments.paths import TRAINING_CODE
from experiments.provenance import changed_since, git_commit
from experiments.spec import grids, paper, tuned
from experiments.spec.profiles import SETUPS, Profile, untuned
from experiments.spec.tuned import Calibration, Number, Point

#: how far (points) a CE number may be from the paper's and still count as matched: fitted, held out
TOLERANCE = {True: 2.0, False: 5.0}
#: where the search stops a knob: no pixel noise or no class pattern is not a stand-in of real data; no ambiguity is
SMALLEST_KNOB = {"pixel_noise": 0.05, "class_contrast": 0.05, "ambiguity": 0.0, "contrast_spread": 0.0,
                 "superclass_mixing": 0.0}
#: the knobs that are shares, and stop at 1
LARGEST_KNOB = {"ambiguity": 1.0, "superclass_mixing": 1.0}
#: the standard error (points) the search's numbers may have, a quarter of the fitted tolerance (:func:`search_seeds`)
SEARCH_ERROR = TOLERANCE[True] / 4
#: the one-sided confidence of the upper limit put on the seeds' spread before seeds are counted (:func:`spread_limit`):
#: 2 to 4 seeds measure a standard deviation loosely, so a pilot's is taken at its 80% upper limit (Browne, 1995)
SPREAD_CONFIDENCE = 0.8
MOVES_PER_STEP = 8  #: the search moves at most this many times at one step size


@dataclass(frozen=True)
class Target:
    """A CE number of the paper and where our CE run reports it."""

    label: str
    published: float  #: percent
    cell: tuple[tuple[str, object], ...]  #: labels picking the CE run in the grid (beside loss and seed)
    metric: tuple[str, ...]  #: path in the run's test metrics, e.g. ("top", "1") or ("macro_top_by_group", "few", "1")
    fitted: bool = True  #: False: held out, measured at the chosen knobs only


@dataclass(frozen=True)
class StandIn:
    """The calibration of one setup: its grid, the paper's CE numbers, and where the search starts."""

    grid: Callable[[Profile], list]
    targets: tuple[Target, ...]
    start: dict  #: the knobs searched and where the search starts
    steps: dict  #: first step of each knob; halved twice, so a knob is chosen to a quarter of it

    def fingerprint(self) -> str:
        """What a stored calibration was searched with: a changed search makes it stale."""
        return tuned.fingerprint({"grid": self.grid.__name__, "targets": [asdict(t) for t in self.targets],
                                  "start": self.start, "steps": self.steps, "knobs": tuple(self.start),
                                  "moves": MOVES_PER_STEP, "fits": "the seeds' mean"})


def _ce(table: dict, *index) -> float:
    value = table["cross_entropy"]
    for i in index:
        value = value[i]
    return value


def _cifar_targets() -> tuple[Target, ...]:
    """Tables 4 and 7: top-1 and top-5 at p = 0 and p = 0.4 fitted, p = 0.2 held out."""
    return tuple(Target(f"top-{k}, p = {p:g}", table["cross_entropy"][paper.LABEL_NOISE.index(p)][0], (("p", p),),
                        ("top", str(k)), fitted=p != 0.2)
                 for p in (0.0, 0.4, 0.2) for k, table in ((1, paper.TABLE_7), (5, paper.TABLE_4)))


#: CIFAR-100's label noise redraws within a superclass (Tables 4 and 7): where superclasses are the stand-in's visual
#: groups, CE at p = 0.4 loses far less than the paper's, so ``superclass_mixing`` (classes whose superclass is not
#: their visual group) is searched as well.
MIXED = {"pixel_noise": 0.4, "class_contrast": 0.4, "superclass_mixing": 0.2}
#: ImageNet's groups of 10 look-alikes: top-1 turns on a narrow range of class contrast, so its steps are finer.
#: Their errors are not all confusions within a group (which top-5 recovers): ``ambiguity``, images showing another
#: class than their label's (ImageNet's multi-object images and label errors), is searched as well.
FINE_CONTRAST = {"pixel_noise": 0.4, "class_contrast": 0.1, "ambiguity": 0.08}
#: Pl@ntNet's few-, medium- and many-shot classes (Table 5): with every class as distinct as the others, accuracy
#: jumps from near 0 to near 100 over a narrow range of training images, so no setting of the two knobs gives the
#: paper's three groups at once; ``contrast_spread`` (classes unequally distinct) is searched as well.
SPREAD = {"pixel_noise": 0.4, "class_contrast": 0.1, "contrast_spread": 0.4}

STAND_INS = {
    "cifar": StandIn(grids.label_noise, _cifar_targets(),
                     {"pixel_noise": 2.8, "class_contrast": 1.0, "superclass_mixing": 0.3}, MIXED),
    "plantnet": StandIn(grids.plantnet, (
        Target("macro top-1", paper.TABLE_5[1]["cross_entropy"][0], (("K", 1),), ("macro_top", "1")),
        *(Target(f"macro top-1, {group}-shot", paper.TABLE_5[1]["cross_entropy"][2][i], (("K", 1),),
                 ("macro_top_by_group", group, "1")) for i, group in enumerate(("few", "medium", "many"))),
        Target("top-1", paper.TABLE_8[1]["cross_entropy"][0], (("K", 1),), ("top", "1")),
        Target("macro top-5", paper.TABLE_5[5]["cross_entropy"][0], (("K", 5),), ("macro_top", "5"), fitted=False),
        Target("top-5", paper.TABLE_8[5]["cross_entropy"][0], (("K", 5),), ("top", "5"), fitted=False),
    ), {"pixel_noise": 2.0, "class_contrast": 0.3, "contrast_spread": 1.0}, SPREAD),
    # The top-5 of the run selected on top-1 (the paper's is selected on top-5): one run per point instead of two.
    # Its shot groups (Table 6) are fitted with ``contrast_spread``, as Pl@ntNet's.
    "imagenet_lt": StandIn(grids.imagenet_lt, (
        Target("top-1", paper.TABLE_6[1]["cross_entropy"][0], (("K", 1),), ("top", "1")),
        *(Target(f"top-1, {group}-shot", paper.TABLE_6[1]["cross_entropy"][2][i], (("K", 1),),
                 ("macro_top_by_group", group, "1")) for i, group in enumerate(("few", "medium", "many"))),
        Target("top-5 (selected on top-1)", paper.TABLE_6[5]["cross_entropy"][0], (("K", 1),), ("top", "5"),
               fitted=False),
    ), {"pixel_noise": 1.3, "class_contrast": 0.4, "ambiguity": 0.1, "contrast_spread": 0.5},
        {**FINE_CONTRAST, "contrast_spread": 0.4}),
    "imagenet": StandIn(grids.imagenet, (  # the paper gives CE's top-1 and top-5 only: nothing is held out
        Target("top-1", paper.TABLE_9[1]["cross_entropy"][0], (("K", 1),), ("top", "1")),
        Target("top-5 (selected on top-1)", paper.TABLE_9[5]["cross_entropy"][0], (("K", 1),), ("top", "5")),
    ), {"pixel_noise": 0.8, "class_contrast": 0.6, "ambiguity": 0.1}, FINE_CONTRAST),
}


def ce_config(profile: Profile, setup: str, target: Target, knobs: dict, rates: dict | None = None,
              seed: int | None = None):
    """The config of the CE run behind ``target`` (the setup's ``seed``, by default its first) with the difficulty
    ``knobs``, at the grid's learning rate times its multiplier in ``rates`` (by
    :func:`experiments.spec.grids.choice_key`; absent: 1)."""
    seed = getattr(profile, setup).seeds[0] if seed is None else seed
    cells = [c for c in STAND_INS[setup].grid(untuned(profile, setup)) if c.labels["loss"] == "cross_entropy"
             and c.labels["seed"] == seed and all(c.labels[k] == v for k, v in target.cell)]
    if len(cells) != 1:
        raise ValueError(f"{len(cells)} CE runs of {STAND_INS[setup].grid.__name__} match {dict(target.cell)}, "
                         f"expected one")
    config = cells[0].config
    config = config.replace(dataset_options={**config.dataset_options, **knobs})
    return grids.scaled_lr(config, (rates or {}).get(grids.choice_key(config), 1.0))


def ce_keys(profile: Profile, setup: str) -> dict[str, str]:
    """The choice key (:func:`experiments.spec.grids.choice_key`) of the CE run behind each of ``setup``'s numbers, by
    label."""
    return {t.label: grids.choice_key(ce_config(profile, setup, t, {})) for t in STAND_INS[setup].targets}


def calibrated_rates(entry: Calibration, profile: Profile, setup: str) -> dict:
    """CE's learning-rate multipliers a calibration was made at, by choice key (absent: the grid's rate, 1)."""
    return {key: entry.ce_multipliers.get(key, 1.0) for key in set(ce_keys(profile, setup).values())}


def _cell_configs(profile: Profile, setup: str, knobs: dict, targets, rates: dict | None, seed: int | None) -> dict:
    """The CE run behind each cell of ``targets`` (:func:`ce_config`), in the targets' order."""
    first = {}
    for target in targets:
        first.setdefault(target.cell, target)
    return {cell: ce_config(profile, setup, target, knobs, rates, seed) for cell, target in first.items()}


def ce_configs(profile: Profile, setup: str, knobs: dict, targets, rates: dict | None = None,
               seeds: tuple[int, ...] | None = None) -> list:
    """The CE runs :func:`measure_seeds` trains at ``knobs`` for ``targets``: one per target's cell and seed of
    ``seeds`` (default: the setup's)."""
    return [config for seed in _seeds(profile, setup, seeds)
            for config in _cell_configs(profile, setup, knobs, targets, rates, seed).values()]


def measure(profile: Profile, setup: str, knobs: dict, targets, train, rates: dict | None = None,
            seed: int | None = None) -> dict:
    """Our CE number (percent) for each of ``targets`` at ``knobs``, the learning-rate multipliers ``rates`` and
    ``seed`` (:func:`ce_config`); ``train(config)`` gives a run's record."""
    records = {cell: train(config) for cell, config in _cell_configs(profile, setup, knobs, targets, rates,
                                                                      seed).items()}
    values = {}
    for target in targets:
        value = records[target.cell]["test"]
        for key in target.metric:
            value = value[key]
        values[target.label] = 100 * value
    return values


def measure_each_seed(profile: Profile, setup: str, knobs: dict, targets, train, rates: dict | None = None,
                      seeds: tuple[int, ...] | None = None) -> list[dict]:
    """:func:`measure` at each of ``seeds`` (default: the setup's), in their order."""
    return [measure(profile, setup, knobs, targets, train, rates, seed) for seed in _seeds(profile, setup, seeds)]


def _seeds(profile: Profile, setup: str, seeds: tuple[int, ...] | None) -> tuple[int, ...]:
    """``seeds``, or where None every seed of ``setup``."""
    return getattr(profile, setup).seeds if seeds is None else seeds


def seeds_mean(by_seed: list[dict]) -> dict:
    """Each number's mean over :func:`measure_each_seed`'s seeds: what the tables show."""
    return {label: sum(values[label] for values in by_seed) / len(by_seed) for label in by_seed[0]}


def measure_seeds(profile: Profile, setup: str, knobs: dict, targets, train, rates: dict | None = None,
                  seeds: tuple[int, ...] | None = None) -> dict:
    """The mean over ``seeds`` (default: the setup's) of :func:`measure` (:func:`seeds_mean`)."""
    return seeds_mean(measure_each_seed(profile, setup, knobs, targets, train, rates, seeds))


def seed_spread(by_seed: list[dict], labels) -> float | None:
    """The seeds' spread of the numbers ``labels`` in :func:`measure_each_seed`'s ``by_seed``: the largest of the
    numbers' sample standard deviations, in points (not pooled: a number may scatter while the others agree); None
    with one seed or an undefined number."""
    numbers = [[values[label] for values in by_seed] for label in labels]
    if len(by_seed) < 2 or not all(math.isfinite(value) for values in numbers for value in values):
        return None
    return max(statistics.stdev(values) for values in numbers)


def spread_limit(spread: float, seeds: int) -> float:
    """The upper confidence limit, at :data:`SPREAD_CONFIDENCE`, of a standard deviation measured as ``spread`` over
    ``seeds`` seeds: ``spread`` * sqrt((n - 1) / chi2_(1 - confidence)(n - 1)), the chi-square quantile at n - 1
    degrees of freedom (normal numbers)."""
    freedom = seeds - 1
    return spread * math.sqrt(freedom / stats.chi2.ppf(1 - SPREAD_CONFIDENCE, freedom))


def search_seeds(spread: float | None, seeds: int) -> int:
    """How many of a setup's ``seeds`` the search averages at each point, ``spread`` being the largest standard
    deviation measured over them (:func:`seed_spread`): the fewest whose mean's standard error, the spread's upper
    limit (:func:`spread_limit`) / sqrt(n), is at most :data:`SEARCH_ERROR`; every seed where the spread is unknown."""
    if spread is None or seeds < 2:
        return seeds
    limit = spread_limit(spread, seeds)
    return min(seeds, max(1, math.ceil(limit ** 2 / SEARCH_ERROR ** 2 - 1e-9)))  # 1e-9: a float's last bit


def rms_gap(values: dict, targets) -> float:
    """Root mean square of ours - the paper's over ``targets``, in points (inf if one is undefined)."""
    gaps = [values[t.label] - t.published for t in targets]
    return math.sqrt(sum(g * g for g in gaps) / len(gaps)) if all(map(math.isfinite, gaps)) else math.inf


def compass_search(error: Callable[[dict], float], start: dict, steps: dict, halvings: int = 2,
                   ahead: Callable[[list[dict]], None] = lambda points: None) -> dict:
    """Knobs minimising ``error``: move to the best of the 2 x len(start) neighbours one step away along a knob
    while it improves (at most :data:`MOVES_PER_STEP` times), then halve the steps, ``halvings`` times. Each move's
    points are given to ``ahead`` before any is scored: they are independent, so their runs can train side by side."""
    ahead([dict(start)])
    centre, best, steps = dict(start), error(start), dict(steps)
    for _ in range(halvings + 1):
        for _ in range(MOVES_PER_STEP):
            neighbours = [{**centre, knob: round(min(LARGEST_KNOB.get(knob, math.inf),
                                                     max(SMALLEST_KNOB[knob], centre[knob] + sign * steps[knob])), 4)}
                          for knob in centre for sign in (-1, 1)]
            ahead([n for n in neighbours if n != centre])
            scored = min(((error(n), i, n) for i, n in enumerate(neighbours) if n != centre), default=None)
            if scored is None or scored[0] >= best:
                break
            best, _, centre = scored
        steps = {knob: step / 2 for knob, step in steps.items()}
    return centre


def calibrate(profile: Profile, setup: str, train, halvings: int = 2, rates: dict | None = None,
              start: dict | None = None, round_: int = 1, ahead=None) -> Calibration:
    """Search the knobs of ``setup``'s stand-in with CE at the learning-rate multipliers ``rates`` (by choice key;
    default: the grid's rate) from ``start`` (default: the stand-in's), then measure the held-out numbers at the chosen
    knobs; ``round_`` is the round of :mod:`experiments.tuning.fixed_point`. ``train(config)`` gives a run's record;
    ``ahead(configs)``, if given, is told the runs of each step of the search before ``train`` is asked for them, so
    that an executor can train them side by side (:func:`experiments.scale.calibrate.executor_ahead`). Every seed is
    trained at the start, the first :func:`search_seeds` of them at the other points, every seed at the knobs chosen;
    where the search averaged fewer, the start is kept if the mean over every seed puts it closer to the paper's (a
    minimum over many noisy points is biased towards luck)."""
    ahead = ahead or (lambda configs: None)
    stand_in = STAND_INS[setup]
    rates = {key: (rates or {}).get(key, 1.0) for key in set(ce_keys(profile, setup).values())}
    start = dict(start or stand_in.start)
    fitted, free = searched_targets(stand_in)
    started = time.time()
    ahead(ce_configs(profile, setup, start, free, rates))
    at_start = measure_each_seed(profile, setup, start, free, train, rates)
    spread = seed_spread(at_start, [t.label for t in fitted])
    searched = getattr(profile, setup).seeds[:search_seeds(spread, len(at_start))]
    start_values = seeds_mean(at_start[:len(searched)])
    points = [Point(start, start_values, rms_gap(start_values, fitted))]

    def error(knobs: dict) -> float:
        for point in points:
            if point.knobs == knobs:
                return point.rms_gap
        values = measure_seeds(profile, setup, knobs, free, train, rates, searched)
        points.append(Point(knobs, values, rms_gap(values, fitted)))
        return points[-1].rms_gap

    def points_ahead(knob_points: list[dict]) -> None:
        known = [point.knobs for point in points]
        ahead([config for knobs in knob_points if knobs not in known
               for config in ce_configs(profile, setup, knobs, free, rates, searched)])

    def on_every_seed(knobs: dict) -> dict:  # every target's number at ``knobs``, the mean over every seed
        ahead(ce_configs(profile, setup, knobs, stand_in.targets, rates))
        return measure_seeds(profile, setup, knobs, stand_in.targets, train, rates)

    knobs = compass_search(error, start, stand_in.steps, halvings, points_ahead)
    values = on_every_seed(knobs)
    if knobs != start and rms_gap(seeds_mean(at_start), fitted) < rms_gap(values, fitted):
        knobs = start  # every seed's mean puts the start closer (where every seed was searched, it never does)
        values = on_every_seed(knobs)
    return Calibration(dataset=getattr(profile, setup).dataset, knobs=knobs, start=start,
                       targets=tuple(Number(**asdict(t), ours=values[t.label]) for t in stand_in.targets),
                       rms_gap_fitted=rms_gap(values, fitted), points=tuple(points), ce_multipliers=rates,
                       round=round_, setup_fingerprint=getattr(profile, setup).fingerprint(),
                       search_fingerprint=stand_in.fingerprint(), commit=git_commit(),
                       seconds=round(time.time() - started, 1), searched_seeds=tuple(searched), seed_spread=spread)


def searched_targets(stand_in: StandIn) -> tuple[list[Target], list[Target]]:
    """The targets a search fits, and those it measures at every point: the fitted ones and the held-out ones read
    from the fitted numbers' own runs, which cost nothing (kept for :func:`why_unmatched`)."""
    fitted = [t for t in stand_in.targets if t.fitted]
    return fitted, [t for t in stand_in.targets if t.fitted or t.cell in {f.cell for f in fitted}]


def shortest_search(profile: Profile, setup: str, searched: int | None = 1,
                    halvings: int = 2) -> tuple[list[list], dict]:
    """The CE runs :func:`calibrate` hands to ``ahead``, move by move, at the grid's learning rate, when the search
    averages ``searched`` seeds (:func:`search_seeds`; the fewest, one, by default; None: every seed), no move improves
    on the stand-in's start and the steps only halve: the least a search of ``setup``'s stand-in trains (every seed at
    the start, then 2 x knobs x (``halvings`` + 1) points on ``searched`` seeds, then the held-out numbers' runs), each
    move's runs waiting for the last's; and the knobs it chooses, the start. A run may come again in a later move (a
    knob stopped at its bound, or the start's seeds): it trains once."""
    stand_in = STAND_INS[setup]
    _, free = searched_targets(stand_in)
    start, seeds = dict(stand_in.start), getattr(profile, setup).seeds[:searched]
    moves: list[list[dict]] = []
    knobs = compass_search(lambda knobs: 0.0, start, stand_in.steps, halvings, moves.append)
    return ([ce_configs(profile, setup, start, free)]
            + [[config for point in move for config in ce_configs(profile, setup, point, free, seeds=seeds)]
               for move in moves[1:]]
            + [ce_configs(profile, setup, knobs, stand_in.targets)], knobs)


def trained_by_todays_code(commit: str) -> bool:
    """Whether runs trained at ``commit`` (a stored calibration's or choice's, a record's) were trained by today's
    training code (:data:`experiments.paths.TRAINING_CODE` unchanged since, as committed): earlier code can give the
    same runs other numbers. Uncommitted edits do not count: what they train is stamped with HEAD (``-dirty``), which
    could then never be today's, and a calibration would search again for ever. True where git cannot tell (no
    checkout, or a commit it does not hold)."""
    return changed_since(commit, TRAINING_CODE, uncommitted=False) is not True


def todays(entry: Calibration | tuned.LearningRates | None) -> Calibration | tuned.LearningRates | None:
    """``entry`` where its runs were trained by today's code (:func:`trained_by_todays_code`), else None: what
    ``make calibrate`` keeps (an earlier code's is still used, and shown stale, until it has been made again)."""
    return entry if entry is not None and trained_by_todays_code(entry.commit) else None


def is_current(entry: Calibration | None, profile: Profile, setup: str) -> bool:
    """Whether a stored calibration was made for this setup with this search, on at least the seeds
    :func:`search_seeds` asks for at the spread it measured (an entry that searched every seed always has)."""
    if entry is None or not entry.is_current(getattr(profile, setup).fingerprint(), STAND_INS[setup].fingerprint()):
        return False
    seeds = getattr(profile, setup).seeds
    asked = search_seeds(entry.seed_spread, len(seeds))
    return not entry.searched_seeds or entry.searched_seeds[:asked] == seeds[:asked]


def earlier_search(profile: Profile, setup: str) -> Calibration | None:
    """The stored calibration of ``setup`` made for this setup by a search or a training code that has changed since,
    if any."""
    entry = tuned.calibrations(profile.name).get(setup)
    return entry if entry is not None and entry.fits(getattr(profile, setup).fingerprint()) \
        and not (is_current(entry, profile, setup) and trained_by_todays_code(entry.commit)) else None


def table(entry: Calibration) -> pd.DataFrame:
    """One setup's calibration as the report shows it: each CE number, the paper's, ours, the gap, fitted or not."""
    rows = [{"CE number": t.label, "role": "fitted" if t.fitted else "held out", "paper (%)": t.published,
             "calibrated stand-in (%)": round(t.ours, 1), "gap (points)": round(t.ours - t.published, 1)}
            for t in entry.targets]
    return pd.DataFrame(rows).set_index("CE number")


def unmatched(entry: Calibration | dict) -> list[dict]:
    """The CE numbers further from the paper's than :data:`TOLERANCE`, each with :func:`why_unmatched` (``entry``:
    a calibration, or its stored JSON)."""
    entry = Calibration.of(entry)
    return [{"CE number": t.label, "role": "fitted" if t.fitted else "held out",
             "gap (points)": round(t.ours - t.published, 1), "tolerance (points)": TOLERANCE[t.fitted],
             "why": why_unmatched(entry, t)}
            for t in entry.targets if abs(t.ours - t.published) > TOLERANCE[t.fitted]]


def why_unmatched(entry: Calibration, target: Number) -> str:
    """Why the search left ``target`` unmatched, read from the points it evaluated that hold it (a held-out number is
    kept at every point only if its run is one of the fitted numbers'). In order:

    1. a difference between ``target`` and a fitted number that stayed on one side of the paper's at every point:
       no setting of the knobs matches both (the difference furthest from the paper's is given);
    2. no point brought ``target`` within its tolerance of the paper's;
    3. points that match it leave the fitted numbers further from the paper's: the search traded it for the others.
    """
    label, tolerance = target.label, TOLERANCE[target.fitted]
    points = [point for point in entry.points if label in point.values]
    if len(points) < 2:
        return "measured at the chosen knobs only (held out), so the search cannot tell whether other knobs match it"
    fitted = {t.label: t.published for t in entry.fitted if t.label != label}
    searched = (f" (on seed{'s' * (len(entry.searched_seeds) > 1)} {', '.join(map(str, entry.searched_seeds))})"
                if entry.searched_seeds else "")  # an entry stored before searched_seeds searched every seed
    settings = f"the {len(points)} knob settings tried{searched}"
    outside = []
    for other, published in fitted.items():
        spread = [point.values[label] - point.values[other] for point in points]
        paper = target.published - published
        outside.append((max(min(spread) - paper, paper - max(spread)), other, min(spread), max(spread), paper))
    if outside and max(outside)[0] > 0:
        _, other, low, high, paper = max(outside)
        return (f"{label} minus {other} stayed within [{low:.1f}, {high:.1f}] points over {settings}, the paper's is "
                f"{paper:.1f}: no setting of the knobs searched gives the stand-in the paper's difference between them")
    reached = [point for point in points if abs(point.values[label] - target.published) <= tolerance]
    if not reached:
        values = [point.values[label] for point in points]
        return (f"no knob setting tried brings it within {tolerance:g} points of the paper's {target.published:g}: "
                f"it ranged over [{min(values):.1f}, {max(values):.1f}] over {settings}")
    best = min(reached, key=lambda point: point.rms_gap)
    worst = max(fitted, key=lambda other: abs(best.values[other] - fitted[other]))
    return (f"where it is matched ({_knobs_text(best.knobs)}: {best.values[label]:.1f}), {worst} is "
            f"{best.values[worst]:.1f} against the paper's {fitted[worst]:g}, and the fitted numbers are "
            f"{best.rms_gap:.1f} points RMS from the paper's{searched} ({entry.rms_gap_fitted:.1f} at the chosen "
            f"knobs{', every seed' * bool(searched)})")


def _knobs_text(knobs: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in knobs.items())


def current_entry(profile: Profile, setup: str) -> Calibration | None:
    """The stored calibration of ``setup``, if it is the one the profile uses."""
    entry = tuned.calibrations(profile.name).get(setup)
    return entry if setup in profile.calibrated_setups and is_current(entry, profile, setup) else None


def report_table(profile: Profile) -> pd.DataFrame:
    """Every setup's CE numbers against the paper's (:func:`table`), or one row saying why it is not calibrated."""
    parts = []
    for setup in SETUPS:
        entry, dataset = current_entry(profile, setup), getattr(profile, setup).dataset
        if entry:
            part = table(entry).assign(knobs=_knobs_text(entry.knobs))
            parts.append(part.rename(index=lambda label, dataset=dataset: f"{dataset}: {label}"))
        else:
            parts.append(pd.DataFrame({"role": [summary_line(profile, setup)]}, index=[dataset]))
    return pd.concat(parts).rename_axis("CE number")


def current_entries(profile: Profile) -> dict[str, Calibration]:
    """The stored calibrations the profile uses (:func:`current_entry`), by setup in the order of :data:`SETUPS`."""
    return {setup: entry for setup in SETUPS if (entry := current_entry(profile, setup))}


def unmatched_table(profile: Profile) -> pd.DataFrame:
    """Every calibrated setup's CE numbers outside :data:`TOLERANCE` of the paper's, and why (:func:`unmatched`)."""
    rows = [{**row, "CE number": f"{entry.dataset}: {row['CE number']}"}
            for entry in current_entries(profile).values() for row in unmatched(entry)]
    return pd.DataFrame(rows, columns=["CE number", "role", "gap (points)", "tolerance (points)", "why"]
                        ).set_index("CE number")


def search_table(profile: Profile) -> pd.DataFrame:
    """Every point the searches evaluated, in order: the setup, the knobs, the RMS gap of the fitted numbers, the seeds
    it averages (:func:`search_seeds`)."""
    rows = [{"data": entry.dataset, **point.knobs, "RMS gap (points)": round(point.rms_gap, 2),
             "seeds": len(entry.searched_seeds or getattr(profile, setup).seeds), "chosen": point.knobs == entry.knobs}
            for setup, entry in current_entries(profile).items() for point in entry.points]
    return pd.DataFrame(rows)


def summary_line(profile: Profile, setup: str) -> str:
    """What a verdict on ``setup``'s data says about its difficulty."""
    if not getattr(profile, setup).synthetic:
        return f"real data ({getattr(profile, setup).dataset})"
    entry = current_entry(profile, setup)
    if entry is None:
        return f"uncalibrated stand-in {getattr(profile, setup).dataset} (its CE difficulty was not fitted to the paper's)"
    worst = max(entry.targets, key=lambda target: abs(target.ours - target.published))
    role = "fitted" if worst.fitted else "held out"
    return (f"stand-in {entry.dataset} calibrated on CE alone ({_knobs_text(entry.knobs)}): CE's fitted numbers at "
            f"{rate_text(calibrated_rates(entry, profile, setup))} {entry.rms_gap_fitted:.1f} points RMS from the "
            f"paper's, largest gap {worst.ours - worst.published:+.1f} ({worst.label}, {role})")


def rate_text(rates: dict) -> str:
    """CE's learning-rate multipliers as a reader sees them: "the grid's learning rate" or "x3 the grid's learning
    rate" ("x1, x3" where its runs differ)."""
    values = sorted(set(rates.values()))
    return "the grid's learning rate" if set(values) <= {1.0} else \
        f"{', '.join(f'x{m:g}' for m in values)} the grid's learning rate"
