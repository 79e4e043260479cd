"""Two runs of a profile compared table by table: the figures folders two machines (or two executors) wrote, as
evidence of what survives a change of machine.

For each table both wrote (``*.csv``): whether the files are byte-identical; where not, for each cell that differs,
whether the two numbers lie within the seeds' noise of each other. A cell ``m ± h`` is a mean over seeds with the
half-width of its 95% interval (Student t, :func:`experiments.analysis.summary.format_estimate`); two such cells are
within noise when ``|m1 - m2| <= sqrt(h1^2 + h2^2)``, the half-width of the difference's 95% interval for independent
runs (conservative for a t interval of 2-3 seeds). A range ``lo-hi (n seeds)`` is within noise of a number or range it
overlaps. A number without an interval (one seed, or the paper's) must be equal. Columns of timings (seconds) differ
from machine to machine by nature, and so do ratios of them (Fig. 3's overhead over cross-entropy): they are
counted apart, not judged. Then the claims' verdicts side by side.

    python -m experiments.analysis.compare FIGURES_A FIGURES_B [--names A B] [--out comparison.md]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

NUMBER = r"-?\d+(?:\.\d+)?"
ESTIMATE = re.compile(rf"^(?P<mean>{NUMBER})(?: ± (?P<half>{NUMBER}))?(?: \(n=1\))?(?: \(.*\))?(?: \[.*\])?$")
RANGE = re.compile(rf"^(?P<low>{NUMBER})-(?P<high>{NUMBER}) \(\d+ seeds\)")
TIMING = re.compile(r"seconds|\(s\)|_s$|\bms\b|vs CE", re.I)  # "vs CE": Fig. 3's overhead, a ratio of two times


def interval(cell: str) -> tuple[float, float] | None:
    """The interval a cell states: ``m ± h`` -> (m - h, m + h); ``lo-hi (n seeds)`` -> (lo, hi); a bare number ->
    (m, m); None for text."""
    cell = cell.strip()
    if match := RANGE.match(cell):
        return float(match["low"]), float(match["high"])
    if match := ESTIMATE.match(cell):
        mean, half = float(match["mean"]), float(match["half"] or 0.0)
        return mean - half, mean + half
    return None


def within_noise(one: str, other: str) -> bool:
    """Whether two cells agree within the seeds' noise (module docstring); text must be equal."""
    a, b = interval(one), interval(other)
    if a is None or b is None:
        return one.strip() == other.strip()
    if RANGE.match(one.strip()) or RANGE.match(other.strip()):
        return a[0] <= b[1] and b[0] <= a[1]  # overlapping
    (mean_a, half_a), (mean_b, half_b) = ((sum(x) / 2, (x[1] - x[0]) / 2) for x in (a, b))
    return abs(mean_a - mean_b) <= math.hypot(half_a, half_b) + 1e-9  # cells are rounded to their digits


@dataclass
class TableComparison:
    """One table of both runs."""

    name: str
    identical: bool
    cells: int = 0
    differing: int = 0
    timings: int = 0  #: differing cells in timing columns, not judged
    outside: list[str] = field(default_factory=list)  #: "row / column: A vs B" of the cells beyond the noise

    @property
    def verdict(self) -> str:
        if self.identical:
            return "byte-identical"
        if self.outside:
            return f"{len(self.outside)} of {self.cells} cells beyond the seeds' noise"
        judged = self.differing - self.timings
        parts = [f"{judged} of {self.cells} cells differ, all within the seeds' noise" if judged else
                 "the same numbers"]
        if self.timings:
            parts.append(f"{self.timings} timings differ (machine-dependent, not judged)")
        return "; ".join(parts)


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


def compare_table(one: Path, other: Path) -> TableComparison:
    comparison = TableComparison(one.stem, one.read_bytes() == other.read_bytes())
    if comparison.identical:
        return comparison
    a, b = _rows(one), _rows(other)
    if not a or not b or a[0] != b[0] or len(a) != len(b):
        comparison.outside.append(f"the tables' shapes differ ({len(a)} and {len(b)} rows, header "
                                  f"{'the same' if a[:1] == b[:1] else 'different'})")
        return comparison
    header = a[0]
    for row_a, row_b in zip(a[1:], b[1:]):
        for column, cell_a, cell_b in zip(header, row_a, row_b):
            comparison.cells += 1
            if cell_a == cell_b:
                continue
            comparison.differing += 1
            if TIMING.search(column):
                comparison.timings += 1
            elif not within_noise(cell_a, cell_b):
                comparison.outside.append(f"{row_a[0]} / {column}: {cell_a} vs {cell_b}")
    return comparison


def verdicts(figures: Path) -> dict[int, str]:
    """Each claim's verdict status in a figures folder."""
    found = {}
    for path in sorted((figures / "claims").glob("claim*.json")):
        claim = json.loads(path.read_text())
        found[int(claim["claim"])] = claim["status"]
    return found


def compare(one: Path, other: Path) -> tuple[list[TableComparison], list[str], dict[int, tuple[str, str]]]:
    """The tables both folders hold, compared; the tables only one holds; the claims' verdicts of each."""
    names_a, names_b = ({path.name for path in folder.glob("*.csv")} for folder in (one, other))
    tables = [compare_table(one / name, other / name) for name in sorted(names_a & names_b)]
    claims_a, claims_b = verdicts(one), verdicts(other)
    return (tables, sorted(names_a ^ names_b),
            {claim: (claims_a.get(claim, "-"), claims_b.get(claim, "-")) for claim in sorted({*claims_a, *claims_b})})


def markdown(one: Path, other: Path, names: tuple[str, str]) -> str:
    tables, unmatched, claims = compare(one, other)
    identical = sum(table.identical for table in tables)
    beyond = [table for table in tables if table.outside]
    lines = [f"# {names[0]} against {names[1]}", "",
             f"`{one}` against `{other}`: {len(tables)} tables in both, {identical} byte-identical, "
             f"{len(tables) - identical - len(beyond)} within the seeds' noise, {len(beyond)} beyond it; verdicts "
             f"{'all the same' if all(a == b for a, b in claims.values()) else 'not all the same'}.", "",
             "| table | comparison |", "|---|---|"]
    lines += [f"| {table.name} | {table.verdict} |" for table in tables]
    for table in beyond:
        lines += ["", f"{table.name}, beyond the noise:", *(f"- {cell}" for cell in table.outside)]
    if unmatched:
        lines += ["", f"In one folder only: {', '.join(unmatched)}."]
    lines += ["", f"| claim | {names[0]} | {names[1]} |", "|---|---|---|"]
    lines += [f"| {claim} | {a} | {b} |" for claim, (a, b) in claims.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.analysis.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("one", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--names", nargs=2, default=None, help="what each folder is, for the title")
    parser.add_argument("--out", type=Path, help="write the comparison there (Markdown) as well")
    args = parser.parse_args(argv)
    for folder in (args.one, args.other):
        if not folder.is_dir():
            print(f"error: {folder} is not a folder of figures (figures/<profile>/)", file=sys.stderr)
            return 2
    text = markdown(args.one, args.other, tuple(args.names or (str(args.one), str(args.other))))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
