"""The HTML report: ``build/report/index.html`` (every claim's verdict, every figure and table, provenance) and one page
per executed notebook, readable offline (no script or style from a CDN; code hidden, a button shows it). Read like a
paper's appendix: each notebook page leads with its figures and tables, its runs' progress lines are folded away, a
claim's evidence is one lead line with the rest a click away, and no page scrolls sideways at 1300 px.

    python -m experiments.publishing.report --profile quick            # render (outputs no notebook writes removed)
    python -m experiments.publishing.report --profile smoke --check    # render, then fail on any missing output or error cell
    python -m experiments.publishing.report --check-screenshot build/report/screenshot.png   # check it in Chromium
"""

from __future__ import annotations

import argparse
import base64
import copy
import html
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd

from experiments.publishing import latex
from experiments.publishing.catalogue import ITEMS, Item
from experiments.analysis.claims import NOT_RUN, REPRODUCED, STATUSES
from experiments.spec.paper import CLAIMS
from experiments.paths import BUILD, FIGURES
from experiments.spec.profiles import get_profile
from experiments.provenance import device_name, git_commit, short_commit, versions

OK, FAILED, MISSING = "ok", "failed", "not run"
_REMOTE_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>', re.S)
_MATHJAX_CONFIG = re.compile(r'<script type="text/x-mathjax-config">.*?</script>', re.S)
_SCRIPT_IMPORTING_REMOTE = re.compile(r"<script\b[^>]*>(?:(?!</script>).)*?https?://cdn(?:(?!</script>).)*?</script>", re.S)
_REMOTE_RESOURCE = re.compile(r'<(?:script|img|link|iframe)\b[^>]*\b(?:src|href)="(?:https?:)?//', re.I)

PAGE_WIDTH = 1300  #: no page may scroll sideways in a window this wide (px)
LEAD_CHARS = 120  #: a claim's evidence lead: at most two lines of the index's evidence column
_PROGRESS_LINE = re.compile(r"\[\d+/\d+\] .*: (?P<status>\w+), (?:trained in (?P<seconds>[\d.]+) s|from the store)")
_VERDICT_HTML = re.compile(  # a verdict as the harness shows it (claims.Verdict.to_html)
    r"<p><b>Claim (?P<claim>\d+): (?P<status>[^<]*)</b></p><ul>(?P<items>(?:<li>.*?</li>)*)</ul>", re.S)
CHROMIUM = ("chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync")

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
.scroll { overflow-x: auto; max-width: 100%; } .scroll > table { margin-bottom: 0.5em; }
table.claims { table-layout: fixed; width: 100%; } table.claims td { overflow-wrap: anywhere; }
.claims .badge { white-space: normal; }
.lead { margin: 0 0 0.2em; } details > summary { cursor: pointer; color: #555; } details ul { margin: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.reproduced { background: #d9f2d9; } .not-reproduced { background: #f9dcdc; } .not-run { background: #eee; } .inconclusive { background: #fdf0c8; }
.failed { background: #f9dcdc; font-weight: bold; } .ok { background: #d9f2d9; }
.badge { padding: 1px 6px; border-radius: 4px; white-space: nowrap; }
img { max-width: 100%; } .muted { color: #666; font-size: 0.9em; } section { margin-bottom: 2.5em; }
"""
NOTEBOOK_PAGE_TOP = """
<style>body.hide-code .jp-CodeCell .jp-Cell-inputWrapper { display: none; }
#toggle-code { position: fixed; top: 8px; right: 8px; z-index: 10; }
details > summary { cursor: pointer; color: #555; } .run-log pre { white-space: pre-wrap; overflow-wrap: anywhere; }
.jp-OutputArea-output img { max-width: 100%; height: auto; } #back { font-family: system-ui, sans-serif; margin: 8px; }</style>
<button id="toggle-code" onclick="document.body.classList.toggle('hide-code')">show / hide code</button>
<p id="back"><a href="index.html">&larr; back to the report</a></p>
"""


@dataclass
class NotebookRun:
    item: Item
    status: str
    path: Path | None
    seconds: float | None
    errors: list[str]
    missing_outputs: list[str]
    manifest: dict | None  #: what the notebook wrote, if it wrote it at this profile


def collect(profile: str, executed: Path, figures: Path) -> list[NotebookRun]:
    """What happened to each notebook of the catalogue at ``profile``: ok, failed (papermill kept the failed copy as
    ``<name>.failed.ipynb``) or not run; its error cells; the outputs it should have written but did not."""
    runs = []
    for item in ITEMS:
        done, failed = executed / f"{item.notebook}.ipynb", executed / f"{item.notebook}.failed.ipynb"
        path = done if done.exists() else failed if failed.exists() else None
        status = OK if path == done else FAILED if path else MISSING
        seconds, errors = None, []
        if path:
            notebook = nbformat.read(path, as_version=4)
            seconds = notebook.metadata.get("papermill", {}).get("duration")
            errors = [f"{o.get('ename')}: {o.get('evalue')}" for cell in notebook.cells
                      for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                status = FAILED
        manifest = _read_json(figures / "manifests" / f"{item.notebook}.json")
        if manifest is not None and manifest.get("profile") != profile:
            manifest = None
        missing = [o for o in item.expected_outputs() if not (manifest and o in manifest["outputs"]
                                                              and (figures / o).exists())]
        runs.append(NotebookRun(item, status, path, seconds, errors, missing, manifest))
    return runs


def verdicts(profile: str, figures: Path, runs: list[NotebookRun]) -> list[dict]:
    """Each claim's verdict at ``profile``; a claim whose notebook did not run or failed is "not run at this profile"."""
    status_of = {run.item.notebook: run.status for run in runs}
    out = []
    for claim in CLAIMS:
        found = _read_json(figures / "claims" / f"claim{claim.number}.json")
        if found is None or found.get("profile") != profile or status_of[claim.notebook] != OK:
            why = f"the notebook {claim.notebook} {'failed' if status_of[claim.notebook] == FAILED else 'did not run'}"
            found = {"claim": claim.number, "status": NOT_RUN, "evidence": [why], "data": ""}
        out.append({**found, "text": claim.text, "source": claim.source, "notebook": claim.notebook})
    return out


def provenance(profile: str, runs: list[NotebookRun]) -> dict:
    """Where the results come from (the notebooks' manifests: their commits, the commits that trained their runs,
    their machines) and where this page was rendered."""
    import torch

    manifests = [run.manifest for run in runs if run.manifest]
    listed = lambda values: ", ".join(sorted(set(values))) or "-"  # noqa: E731
    data = sorted({d for m in manifests for d in m.get("data", [])})
    devices = sorted({m["device"] for m in manifests})
    return {
        "profile": f"{profile}: {get_profile(profile).description}",
        "data": "; ".join(data) or "none",
        "real or synthetic": _real_or_synthetic(data),
        "notebooks run at commit": listed(short_commit(m["commit"]) for m in manifests if m.get("commit")),
        "runs trained at commit": listed(short_commit(c) for m in manifests for c in m.get("run_commits", [])),
        "notebooks' machines": listed(m["machine"] for m in manifests if m.get("machine")),
        "rendered at commit": git_commit(),
        "rendered": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "versions": ", ".join(f"{name} {version}" for name, version in versions().items()),
        "device": ", ".join(devices) or "-",
        "rendering machine": f"{device_name('cpu')}, {torch.get_num_threads()} torch threads",
        "notebook run time": f"{sum(r.seconds or 0 for r in runs) / 60:.1f} min in total for this execution "
                             "(runs already in the results store are read back, not retrained)",
    }


def _real_or_synthetic(data: list[str]) -> str:
    synthetic = [d for d in data if d.startswith("synthetic")]
    if not data:
        return "no training data"
    if len(synthetic) == len(data):
        return "synthetic stand-ins only (the real datasets were not used)"
    return "real datasets" + (" and synthetic stand-ins" if synthetic else "")


def render(profile: str, executed: Path, figures: Path, out: Path) -> list[NotebookRun]:
    """Write ``out/index.html`` and one page per executed notebook; return what :func:`collect` found."""
    from nbconvert import HTMLExporter

    out.mkdir(parents=True, exist_ok=True)
    runs = collect(profile, executed, figures)
    exporter = HTMLExporter(template_name="lab")
    for run in runs:
        if run.path:
            body, _ = exporter.from_notebook_node(for_reading(nbformat.read(run.path, as_version=4)))
            (out / f"{run.item.notebook}.html").write_text(offline(_with_code_toggle(body)))
    index = _index(profile, figures, runs)
    (out / "index.html").write_text(index)
    return runs


def for_reading(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of the executed notebook as its page shows it (the file is left as it is): each section's figures and
    tables right under its text, every cell's printed lines folded away, every verdict's evidence led by one line."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = [_with_short_evidence(output) for output in _printed_lines_folded(cell.outputs)]
    notebook.cells = _exhibits_first(notebook.cells)
    return notebook


def _exhibits_first(cells: list) -> list:
    """``cells`` with the figures and tables of each section (its markdown, then the code cells up to the next
    markdown) moved into a cell of their own under its markdown, ahead of the other outputs (descriptions, logs,
    verdicts)."""
    ordered, holder = [], None
    for cell in cells:
        if cell.cell_type != "code":
            holder = None
        else:
            if holder is None:
                holder = nbformat.v4.new_code_cell(metadata={"transient": {"remove_source": True}})
                ordered.append(holder)
            holder.outputs += [nbformat.v4.new_output("display_data", output.data, metadata=output.metadata)
                               for output in cell.outputs if _is_exhibit(output)]  # with no "Out[ ]:" prompt
            cell.outputs = [output for output in cell.outputs if not _is_exhibit(output)]
        ordered.append(cell)
    empty_holders = {id(cell) for cell in ordered if cell.metadata.get("transient") and not cell.outputs}
    return [cell for cell in ordered if id(cell) not in empty_holders]


def _is_exhibit(output: dict) -> bool:
    """A figure (an image) or a table (HTML with a ``<table>``)."""
    data = output.get("data", {})
    return any(kind.startswith("image/") for kind in data) or "<table" in data.get("text/html", "")


def _printed_lines_folded(outputs: list) -> list:
    """``outputs`` with their stream outputs (stdout, stderr) as one closed ``<details>``, where the first one was."""
    printed = "".join(output.text for output in outputs if output.output_type == "stream")
    if not printed:
        return outputs
    first = next(i for i, output in enumerate(outputs) if output.output_type == "stream")
    others = [output for output in outputs if output.output_type != "stream"]
    folded = nbformat.v4.new_output("display_data", {"text/html": (
        f'<details class="run-log"><summary>{_text(log_summary(printed.splitlines()))}</summary>'
        f"<pre>{_text(printed)}</pre></details>")})
    return others[:first] + [folded] + others[first:]


def log_summary(lines: list[str]) -> str:
    """One line for printed ``lines``: how many runs (progress lines of the harness) ended how, trained or read back."""
    runs = [match for match in map(_PROGRESS_LINE.fullmatch, lines) if match]
    if not runs:
        return _counted(len(lines), "printed line")
    seconds = [float(run["seconds"]) for run in runs if run["seconds"]]
    ended = ", ".join(f"{count} {status}" for status, count in Counter(run["status"] for run in runs).items())
    trained_for = f"{sum(seconds):.0f} s" if sum(seconds) < 60 else f"{sum(seconds) / 60:.1f} min"
    summary = (f"{len(runs)} runs: {ended}; {len(seconds)} trained in {trained_for}, "
               f"{len(runs) - len(seconds)} read from the store")
    others = len(lines) - len(runs)
    return summary + (f"; {_counted(others, 'other printed line')}" if others else "")


def _text(text: str) -> str:
    """``text`` escaped for an element's content (quotes left as they are, as nbconvert writes them back)."""
    return html.escape(text, quote=False)


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _with_short_evidence(output: dict) -> dict:
    """A verdict as the harness shows it (a claim's status and its evidence lines) re-drawn by :func:`evidence_html`;
    any other output as it is."""
    match = _VERDICT_HTML.fullmatch(output.get("data", {}).get("text/html", "").strip())
    if not match:
        return output
    evidence = [html.unescape(line) for line in re.findall(r"<li>(.*?)</li>", match["items"], re.S)]
    shortened = evidence_html(html.unescape(match["status"]), evidence)
    return nbformat.v4.new_output("display_data", {"text/html": (
        f"<p><b>Claim {match['claim']}: {match['status']}</b></p>{shortened}")})


def evidence_html(status: str, evidence: list[str], data: str = "") -> str:
    """A claim's evidence in at most three lines: its lead (:func:`evidence_lead`), then a closed ``<details>`` with
    every line and the data it was judged on."""
    lines = "".join(f"<li>{_text(line)}</li>" for line in evidence)
    stamp = f'<p class="muted">{_text(data)}</p>' if data else ""
    return (f'<p class="lead">{_text(evidence_lead(status, evidence))}</p>'
            f"<details><summary>the evidence ({_counted(len(evidence), 'line')})</summary><ul>{lines}</ul>{stamp}"
            "</details>")


def evidence_lead(status: str, evidence: list[str]) -> str:
    """The line a reader needs first, cut at a word boundary to :data:`LEAD_CHARS`: a reproduced claim's first line;
    for any other, the first line that is not a passed check (✓): the failed or undecided check, or why it was
    overruled or not run."""
    reasons = [line for line in evidence if not line.startswith("✓")]
    line = reasons[0] if status != REPRODUCED and reasons else evidence[0] if evidence else ""
    return textwrap.shorten(line, LEAD_CHARS, placeholder=" …")


def offline(page: str) -> str:
    """``page`` without its CDN scripts (require.js, MathJax, the mermaid loader: the report has no widgets, no
    diagrams and no LaTeX in HTML, Table 1 is MathML)."""
    page = _SCRIPT_IMPORTING_REMOTE.sub("", _MATHJAX_CONFIG.sub("", _REMOTE_SCRIPT.sub("", page)))
    if _REMOTE_RESOURCE.search(page):
        raise ValueError(f"the page still loads a remote resource: {_REMOTE_RESOURCE.search(page).group(0)}")
    return page


def _with_code_toggle(page: str) -> str:
    """Code hidden by default: ``hide-code`` joins the body's classes; the button toggles it."""
    def hide(match: re.Match) -> str:
        attributes = match.group(1)
        if re.search(r'\bclass="', attributes):
            attributes = re.sub(r'\bclass="', 'class="hide-code ', attributes, count=1)
        else:
            attributes += ' class="hide-code"'
        return f"<body{attributes}>{NOTEBOOK_PAGE_TOP}"
    return re.sub(r"<body([^>]*)>", hide, page, count=1)


def _index(profile: str, figures: Path, runs: list[NotebookRun]) -> str:
    claims = verdicts(profile, figures, runs)
    counts = {s: sum(c["status"] == s for c in claims) for s in STATUSES}
    parts = [f"<h1>Reproduction report: Garcin et al., ICML 2022 ({html.escape(profile)} profile)</h1>",
             "<p>Stochastic smoothing of the top-K calibrated hinge loss for deep imbalanced classification. "
             "Every figure and table of the paper, regenerated by <code>make paper-figures</code>, beside the "
             "published numbers.</p>"]
    if not get_profile(profile).judges_training:
        parts.append(f"<p class='failed'>The {profile} profile only checks that every notebook runs: its training "
                     "numbers mean nothing.</p>")
    parts.append("<section><h2>The paper's claims</h2><p>" + ", ".join(f"{n} {s}" for s, n in counts.items())
                 + "</p><table class='claims'><colgroup><col style='width: 3em'><col style='width: 30%'>"
                 "<col style='width: 5.5em'><col style='width: 10em'><col></colgroup>"
                 "<tr><th>#</th><th>claim</th><th>source</th><th>verdict</th><th>evidence</th></tr>")
    for c in claims:
        css = c["status"].replace(" at this profile", "").replace(" ", "-")
        parts.append(f"<tr><td>{c['claim']}</td><td>{html.escape(c['text'])}</td><td>{c['source']}</td>"
                     f"<td><span class='badge {css}'>{c['status']}</span></td>"
                     f"<td>{evidence_html(c['status'], c['evidence'], c.get('data', ''))}</td></tr>")
    parts.append("</table></section><section><h2>Notebooks</h2><table><tr><th>item</th><th>status</th>"
                 "<th>run time</th><th>outputs</th></tr>")
    for run in runs:
        link = f"<a href='{run.item.notebook}.html'>{html.escape(run.item.title)}</a>" if run.path else html.escape(run.item.title)
        problems = "".join(f"<br><b>{html.escape(e)}</b>" for e in run.errors[:3])
        missing = f"missing: {', '.join(run.missing_outputs)}" if run.missing_outputs else "all present"
        seconds = f"{run.seconds:.0f} s" if run.seconds is not None else "-"
        parts.append(f"<tr><td>{link}</td><td class='{'ok' if run.status == OK else 'failed'}'>{run.status}{problems}"
                     f"</td><td>{seconds}</td><td>{missing}</td></tr>")
    parts.append("</table></section>")
    for run in runs:
        parts.append(_item_section(run, figures))
    parts.append("<section><h2>Provenance</h2><table>" + "".join(
        f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in provenance(profile, runs).items())
        + "</table></section>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>topk reproduction report ({profile})</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def _item_section(run: NotebookRun, figures: Path) -> str:
    parts = [f"<section><h2>{html.escape(run.item.title)}</h2>"]
    if run.status != OK:
        parts.append(f"<p class='failed'>The notebook {run.item.notebook} {run.status}; what it wrote before is not "
                     "shown.</p></section>")
        return "".join(parts)
    for name in run.item.figures:
        if f"{name}.png" in run.missing_outputs:  # listed as missing in the notebooks table
            continue
        data = base64.b64encode((figures / f"{name}.png").read_bytes()).decode()
        parts.append(f"<p><img alt='{name}' src='data:image/png;base64,{data}'></p>")
    for name in run.item.tables:
        if f"{name}.csv" in run.missing_outputs or f"{name}.md" in run.missing_outputs:
            continue
        lines = (figures / f"{name}.md").read_text().splitlines()
        table = pd.read_csv(figures / f"{name}.csv", index_col=0)
        parts.append(f"<p><b>{html.escape(lines[0].strip('*'))}</b></p><div class='scroll'>{_table_html(table)}</div>"
                     f"<p class='muted'>{html.escape(lines[-1].strip('*'))}</p>")
    parts.append(f"<p><a href='{run.item.notebook}.html'>the executed notebook</a></p></section>")
    return "".join(parts)


def _table_html(table: pd.DataFrame) -> str:
    """The table with LaTeX cells as MathML (Table 1), everything else escaped."""
    cell = lambda value: latex.to_html(value) if isinstance(value, str) else html.escape(str(value))  # noqa: E731
    return table.map(cell).rename(index=cell).to_html(escape=False, na_rep="-")


def check(runs: list[NotebookRun]) -> list[str]:
    """Every problem that makes a report incomplete: a failed or missing notebook, an error cell, a missing output."""
    problems = []
    for run in runs:
        if run.status != OK:
            problems.append(f"{run.item.notebook}: {run.status}" + "".join(f"; {e}" for e in run.errors))
        problems += [f"{run.item.notebook}: missing output figures/{o}" for o in run.missing_outputs]
    return problems


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


#: What a notebook writes in ``figures/<profile>/`` (figures, tables, verdicts): other files there are never removed.
OUTPUT_SUFFIXES = (".png", ".pdf", ".csv", ".md")


def unclaimed_outputs(figures: Path) -> list[Path]:
    """The files of ``figures`` (its top level and ``claims/``) that no notebook's manifest names among its outputs:
    left by an earlier run of a notebook that no longer writes them (a GPU figure whose measurement was taken back,
    say), which the report would not show but the folder would still hold."""
    named = {output for manifest in sorted(figures.glob("manifests/*.json"))
             for output in (_read_json(manifest) or {}).get("outputs", [])}
    files = [path for path in figures.iterdir() if path.is_file() and path.suffix in OUTPUT_SUFFIXES]
    files += sorted((figures / "claims").glob("*.json"))
    return sorted(path for path in files if path.relative_to(figures).as_posix() not in named)


def remove_unclaimed_outputs(figures: Path, complete: bool) -> list[str]:
    """Remove :func:`unclaimed_outputs` where the report is ``complete`` (every notebook ran and wrote its outputs);
    what was done, a line each. A notebook's manifest lists its outputs anew from its start, so one that failed or
    did not run may own files it does not name yet: then they are kept, and said to be."""
    if not any((figures / "manifests").glob("*.json")):  # outputs are told apart by the manifests
        return []
    unclaimed = unclaimed_outputs(figures)
    if unclaimed and not complete:
        return [f"kept {len(unclaimed)} files that no notebook's manifest names ({', '.join(p.name for p in unclaimed)}): "
                "they are removed once every notebook has run"]
    for path in unclaimed:
        path.unlink()
    return [f"removed {path}: no notebook writes it any more" for path in unclaimed]


def screenshot_problems(path: Path) -> list[str]:
    """A screenshot of the entry page must exist and show something (not one flat colour)."""
    from PIL import Image

    if not path.exists():
        return [f"no screenshot at {path}"]
    image = Image.open(path).convert("L")
    low, high = image.getextrema()
    if high - low < 64:
        return [f"the screenshot {path} is blank (grey levels {low} to {high})"]
    return []


_MEASURE_WIDTHS = """<!DOCTYPE html><body><script>
Promise.all(PAGES.map(src => new Promise(done => {
  const frame = document.createElement('iframe');
  frame.style.width = 'WIDTHpx'; frame.style.height = '1000px';
  frame.onload = () => { const page = frame.contentDocument.documentElement;
                         done([src, page.scrollWidth, page.clientWidth]); };
  frame.src = src; document.body.appendChild(frame); })))
  .then(widths => { const out = document.createElement('pre'); out.id = 'widths';
                    out.textContent = JSON.stringify(widths); document.body.appendChild(out); });
</script></body>"""


def sideways_scrolling(pages: list[Path], width: int = PAGE_WIDTH) -> list[str]:
    """Every page of ``pages`` wider than a Chromium window ``width`` px wide (it would scroll sideways), measured in
    one headless run that loads each page in a frame of that width."""
    if not pages:
        return ["no page to measure"]
    with tempfile.TemporaryDirectory() as scratch:
        measure = Path(scratch) / "measure.html"
        measure.write_text(_MEASURE_WIDTHS.replace("PAGES", json.dumps([page.resolve().as_uri() for page in pages]))
                           .replace("WIDTH", str(width)))
        dom = subprocess.run([*CHROMIUM, f"--user-data-dir={scratch}", "--allow-file-access-from-files",
                              "--virtual-time-budget=30000", "--dump-dom", measure.as_uri()],
                             capture_output=True, text=True, timeout=300).stdout
    found = re.search(r'<pre id="widths">(.*?)</pre>', dom, re.S)
    if not found:
        return [f"Chromium measured none of the {len(pages)} pages"]
    return [f"{Path(src).name} scrolls sideways at {width} px: {scroll} px wide for {client} px"
            for src, scroll, client in json.loads(html.unescape(found.group(1))) if scroll > client]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.publishing.report", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--executed", type=Path, help="executed notebooks (default: build/<profile>)")
    parser.add_argument("--figures", type=Path, help="the notebooks' outputs (default: figures/<profile>)")
    parser.add_argument("--out", type=Path, default=BUILD / "report")
    parser.add_argument("--check", action="store_true", help="exit 1 if a notebook failed or an output is missing")
    parser.add_argument("--check-screenshot", type=Path, metavar="PNG",
                        help=f"only check the rendered report in Chromium: the screenshot PNG of its entry page shows "
                             f"something and no page of --out scrolls sideways at {PAGE_WIDTH} px")
    args = parser.parse_args(argv)
    if args.check_screenshot:
        problems = screenshot_problems(args.check_screenshot) + sideways_scrolling(sorted(args.out.glob("*.html")))
        print("\n".join(problems) or f"screenshot: {args.check_screenshot} shows the report; no page of {args.out} "
              f"scrolls sideways at {PAGE_WIDTH} px", file=sys.stderr)
        return 1 if problems else 0
    figures = args.figures or FIGURES / args.profile
    runs = render(args.profile, args.executed or BUILD / args.profile, figures, args.out)
    print(f"report: {args.out / 'index.html'}")
    problems = check(runs)
    for line in remove_unclaimed_outputs(figures, complete=not problems):
        print(line, file=sys.stderr)
    for problem in problems:
        print(f"  problem: {problem}", file=sys.stderr)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
