"""The stack matrix: the built-in gate under real releases of mindstudio-probe, transformers and torch.

Each row is one stack: the pinned environment (constraints/cpu.txt, the goldens' own) with one package moved to a
real release from the registry. A cheap row is a constraints file under ``constraints/stacks/`` (its first
requirement names the package and release; the lines after it move what that release cannot import without);
its wheels go, without their dependencies, into ``.venv/stacks/<file stem>`` (``make test`` installs them up
front, as it does transformers 5.23.0 for tests/test_real_upgrade.py), and that folder is put first on
``PYTHONPATH`` for the gate, so nothing else of the pinned environment moves.

For each stack the script runs the built-in gate (``pytest scenarios precision_tests`` by default, ``--gate``
narrows it) against the committed goldens and prints one table row: ran or refused, items passed, identical,
within tolerance, failed, and the verdict line of the failing items (each distinct line once, with its count).
A row is *refused* when every item failed without comparing anything (an ``error`` item: the run could not be
gated); its reason is the gate's own one line.

torch rows: a torch release is a whole environment, not a folder on ``PYTHONPATH``, so another module builds
them: ``benchmarks/torch_matrix.py``, when present, defines ``TORCH_VERSIONS`` (a tuple of release strings),
``run_torch_rows(version: str, settings: MatrixSettings, how: Callable[[str], str | None]) -> list[Row]``, which
builds that torch's environment and returns its rows (``how(row name)``: :func:`how`), and
``describe(version: str) -> str``, the row's stack in words for docs/stacks.md. Without that module the torch rows
are listed as not run, with the reason.

``--write-docs`` writes the table, the date, the CPU model and each package's supported range (the releases of
its rows that passed) to docs/stacks.md.

Usage: python benchmarks/stack_matrix.py [--rows NAME ...] [--gate "ARGS"] [--out DIR] [--write-docs] [--install]
       [--reuse]  (the rows --rows does not name are read from the report.json an earlier run left under --out)
Exit codes: 0 every row ran and passed, 1 a row refused or failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
STACKS = REPO / "constraints" / "stacks"
TARGETS = REPO / ".venv" / "stacks"
DOC = REPO / "docs" / "stacks.md"
#: the gate every row runs unless told otherwise: every built-in scenario and invariant
GATE = ("scenarios", "precision_tests")
#: the package a constraints file's first requirement names -> the row kind
KINDS = {"mindstudio-probe": "msprobe", "transformers": "transformers", "torch": "torch"}
PACKAGES = {kind: package for package, kind in KINDS.items()}


@dataclass(frozen=True)
class Stack:
    """One row's stack: ``package`` at ``version`` beside the pinned environment.

    ``requirements`` is its constraints file (None: the pinned environment itself, or a torch row).
    """

    name: str
    kind: str
    package: str
    version: str
    requirements: Path | None = None

    @property
    def target(self) -> Path | None:
        """The folder its wheels go into, put first on ``PYTHONPATH`` (None: nothing to overlay)."""
        return None if self.requirements is None else TARGETS / self.requirements.stem

    @property
    def paths(self) -> tuple[Path, ...]:
        """The folders put first on ``PYTHONPATH``, in order: its target (a torch row adds what it runs with)."""
        return () if self.target is None else (self.target,)


@dataclass(frozen=True)
class MatrixSettings:
    """How rows run: the interpreter, the gate's pytest arguments, where reports go, the time limit (s)."""

    python: str = sys.executable
    gate: tuple[str, ...] = GATE
    out: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "stack-matrix")
    timeout_s: float = 3600.0


@dataclass
class Row:
    """One row of the table. ``status``: ``ran``, ``refused`` (nothing could be gated) or ``not run``.

    ``companions``: what else the row moves, beside its package (a torch row's transformers); ``gate``: the gate
    it ran when not ``--gate``'s (a torch row's verl scenario); both are shown in its label.
    """

    stack: str
    kind: str
    version: str
    status: str
    reason: str = ""
    passed: int = 0
    identical: int = 0
    within: int = 0
    failed: int = 0
    verdicts: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0
    report: dict = field(default_factory=dict, repr=False)
    companions: str = ""
    gate: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ran" and self.failed == 0 and self.passed > 0


def load_stack(path: Path) -> Stack:
    """The stack of one constraints file: its first requirement names the package and its ``==`` release.

    Raises:
        ValueError: the file has no requirement, or its first one is not ``name==version``.
    """
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise ValueError(f"{path}: no requirement; expected a first line such as mindstudio-probe==26.1.0")
    first = Requirement(lines[0])
    pins = [s.version for s in first.specifier if s.operator == "=="]
    if len(pins) != 1:
        raise ValueError(f"{path}: first requirement {lines[0]!r} is not name==version; pin the row's release")
    return Stack(path.stem, KINDS.get(first.name, first.name), first.name, pins[0], path)


def pinned_stack() -> Stack:
    """The reference row: constraints/cpu.txt's environment, the one the goldens were recorded in."""
    return Stack("pinned", "pinned", "constraints/cpu.txt", "")


def stacks() -> list[Stack]:
    """The pinned row, then one row per file of ``constraints/stacks/``, by package and release (oldest first)."""
    rows = sorted((load_stack(p) for p in STACKS.glob("*.txt")), key=lambda s: (s.package, Version(s.version)))
    return [pinned_stack(), *rows]


def install(stack: Stack, python: str = sys.executable) -> None:
    """Install ``stack``'s wheels, without their dependencies, into its target (skipped when it already holds them).

    Raises:
        subprocess.CalledProcessError: pip failed (the registry unreachable, a release that does not exist).
    """
    if stack.requirements is None:
        return
    stamp = stack.target / ".requirements"
    wanted = stack.requirements.read_text()
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    argv = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-compile"]
    subprocess.run([*argv, "--upgrade", "--target", str(stack.target), "-r", str(stack.requirements)], check=True)
    stamp.write_text(wanted)


def environment(stack: Stack) -> dict[str, str]:
    """This process's environment with ``stack``'s folders (:attr:`Stack.paths`) first on ``PYTHONPATH``."""
    paths = [str(path) for path in stack.paths]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_gate(stack: Stack, settings: MatrixSettings) -> Row:
    """Run ``settings.gate`` under ``stack`` against the committed goldens; its row, read from report.json.

    Raises:
        FileNotFoundError: a folder of the stack is not installed (run :func:`install`, or ``make .venv/.test``).
    """
    for path in stack.paths:
        if not path.is_dir():
            raise FileNotFoundError(f"{path} is absent: `make .venv/.test` installs constraints/stacks/{path.name}.txt")
    out = settings.out / stack.name
    argv = [settings.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *settings.gate]
    argv += ["--precision-artifacts", str(out / "artifacts"), "--precision-report", str(out / "report")]
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=REPO, env=environment(stack), capture_output=True, text=True, timeout=settings.timeout_s
    )
    seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    (out / "seconds.txt").write_text(f"{seconds:.1f}\n")
    report_path = out / "report" / "report.json"
    if not report_path.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        return Row(stack.name, stack.kind, stack.version, "refused", f"no report.json: {tail[0]}", seconds=seconds)
    return row_from_report(stack, json.loads(report_path.read_text()), seconds)


#: what a refused run's line says around the reason: the scenario file that failed, and its log
_RUN_FAILED = re.compile(r"^\S+: scenario run failed: ")
_LOG = re.compile(r" \(log: [^)]*\)$")


def _headline(text: str) -> str:
    """A failing item's verdict line: its first line that is not the environment line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    rest = [line for line in lines if not line.startswith("environment differs")]
    return (rest or lines or [""])[0]


def row_from_report(stack: Stack, report: dict, seconds: float) -> Row:
    """The row of one gate run: counts by item kind and the distinct verdict lines of its failing items."""
    items = report["items"]
    failing = [i for i in items if not i["passed"]]
    row = Row(stack.name, stack.kind, stack.version, "ran", seconds=seconds, report=report)
    row.passed = sum(1 for i in items if i["passed"])
    row.identical = sum(1 for i in items if i["passed"] and i["kind"] == "identical")
    row.within = sum(1 for i in items if i["passed"] and i["kind"] == "compared")
    row.failed = len(failing)
    row.verdicts = [(n, line) for line, n in Counter(_headline(i["text"]) for i in failing).most_common()]
    if items and all(i["kind"] == "error" for i in items):
        line = row.verdicts[0][1] if row.verdicts else "every item errored"
        row.status, row.reason = "refused", _LOG.sub("", _RUN_FAILED.sub("", line))
    return row


def reused(stack: Stack, settings: MatrixSettings) -> Row:
    """``stack``'s row from the report.json an earlier run left under ``settings.out`` (``not run`` without one)."""
    path = settings.out / stack.name / "report" / "report.json"
    if not path.is_file():
        return Row(stack.name, stack.kind, stack.version, "not run", f"no {path}")
    seconds = settings.out / stack.name / "seconds.txt"
    wall = float(seconds.read_text()) if seconds.is_file() else 0.0
    return row_from_report(stack, json.loads(path.read_text()), wall)


def how(name: str, chosen: list[str] | None, reuse: bool) -> str | None:
    """Whether the row ``name`` runs (``run``), is read from an earlier run's report.json (``reuse``) or is left out
    (None): ``--rows`` names the rows that run (``torch`` every torch row); with ``--reuse`` the rest are read."""
    if not chosen:
        return "reuse" if reuse else "run"
    if name in chosen or ("torch" in chosen and name.startswith("torch-")):
        return "run"
    return "reuse" if reuse else None


def _torch_matrix():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        return importlib.import_module("torch_matrix")
    except ModuleNotFoundError:
        return None


def torch_rows(settings: MatrixSettings, chosen: list[str] | None = None, reuse: bool = False) -> list[Row]:
    """The torch rows, from ``benchmarks/torch_matrix.py`` (module docstring); one ``not run`` row without it."""
    torch_matrix = _torch_matrix()
    if torch_matrix is None:
        return [Row("torch", "torch", "", "not run", "benchmarks/torch_matrix.py (the torch rows) is absent")]
    rows = []
    for version in torch_matrix.TORCH_VERSIONS:
        rows += torch_matrix.run_torch_rows(version, settings, lambda name: how(name, chosen, reuse))
    return rows


def _cell(text: str, width: int = 160) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (a terminal shows it as is)."""
    out = [
        "| stack | ran or refused | passed | identical | within tolerance | failed | verdict of the failing items"
        " | gate s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        verdict = "; ".join(f"{n} x {_cell(line)}" for n, line in row.verdicts) if row.status == "ran" else ""
        status = row.status if not row.reason else f"{row.status}: {_cell(row.reason, 400)}"
        counts = (row.passed, row.identical, row.within, row.failed) if row.status != "not run" else ("",) * 4
        seconds = f"{row.seconds:.0f}" if row.seconds else ""
        out.append(f"| {_label(row)} | {status} | {' | '.join(map(str, counts))} | {verdict} | {seconds} |")
    return "\n".join(out) + "\n"


def _label(row: Row) -> str:
    if row.kind == "pinned":
        return "pinned (constraints/cpu.txt)"
    label = f"{row.kind} {row.version}".strip()
    label += f" with {row.companions}" if row.companions else ""
    return label + (f", {row.gate}" if row.gate else "")


def file_pins(path: Path) -> dict[str, str]:
    """A constraints file's ``name==version`` pins: canonical name -> version (comments and blank lines skipped)."""
    found = {}
    for line in path.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text:
            req = Requirement(text)
            found.update({canonicalize_name(req.name): s.version for s in req.specifier if s.operator == "=="})
    return found


def pins() -> dict[str, str]:
    """constraints/cpu.txt's pins of the packages the matrix moves."""
    return {KINDS[name]: v for name, v in file_pins(REPO / "constraints" / "cpu.txt").items() if name in KINDS}


def supported(rows: list[Row]) -> dict[str, tuple[list[str], list[str]]]:
    """Per row kind: the releases proved (the pinned one and every release whose rows all passed, oldest first), and
    notes: what a proved release was proved with (a row's companions) and each row that did not pass."""
    proved: dict[str, set[str]] = {kind: {version} for kind, version in pins().items()}
    notes: dict[str, list[str]] = {}
    for row in rows:
        if row.kind == "pinned" or row.status == "not run":
            continue
        what = f"{row.version}{f', {row.gate}' if row.gate else ''}"
        if row.ok:
            proved.setdefault(row.kind, set()).add(row.version)
            if row.companions:
                notes.setdefault(row.kind, []).append(f"proved with {row.companions}: {what}")
        else:
            why = row.reason or (row.verdicts[0][1] if row.verdicts else "")
            notes.setdefault(row.kind, []).append(f"not proved: {what} ({row.status}, {row.failed} failed: {why})")
    failed = {(row.kind, row.version) for row in rows if row.status != "not run" and not row.ok}
    proved = {kind: {v for v in versions if (kind, v) not in failed} for kind, versions in proved.items()}
    return {kind: (sorted(versions, key=Version), notes.get(kind, [])) for kind, versions in proved.items()}


def cpu_model() -> str:
    """``lscpu``'s model name (``platform.processor()`` where lscpu is absent)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def notes(stack: Stack) -> str:
    """What a row moves and why, in its constraints file's own words (its leading comment, joined)."""
    if stack.requirements is None:
        return ""
    lines = []
    for line in stack.requirements.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines)
    return text.split("): ", 1)[1] if text.startswith("Stack matrix row (") else text


def docs_page(rows: list[Row], settings: MatrixSettings) -> str:
    """docs/stacks.md: the table with its date, CPU and gate, and each package's supported range."""
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    others = ["A row whose label names a gate (verl's scenario) ran that gate instead (torch rows, below)."]
    others = others if any(row.gate for row in rows) else []
    lines = [
        "# Stacks the gate runs on",
        "",
        "Generated by `python benchmarks/stack_matrix.py --write-docs` (do not edit by hand): each row is the pinned",
        "environment (constraints/cpu.txt, the goldens' own) with one package moved to a real release of the",
        "registry, installed without its dependencies into a folder put first on `PYTHONPATH`",
        "(`constraints/stacks/`). The gate ran against the committed goldens. `make test` runs one scenario under",
        "each of these rows (tests/test_stack_matrix.py).",
        "",
        f"Run on {today}, {cpu_model()} ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.0f} when written),",
        f"gate `pytest {' '.join(settings.gate)}`. gate s: each row's wall time on that machine, other jobs included.",
        *others,
        "",
        table(rows),
        "## Supported range",
        "",
        "The releases of each package that a row proves: the gate ran, nothing failed. The floor of",
        "mindstudio-probe in pyproject.toml is the oldest of them whose own requirements the pinned stack meets",
        "(a row installs its release without them: 26.0.0 declares protobuf<=3.20.2, which ray[default] forbids, and",
        "8.3.3 numpy<2.0, which verl 0.9.1 forbids; its row holds numpy 1.26.4 and runs no verl scenario).",
        "",
    ]
    for kind, (proved, rest) in supported(rows).items():
        span = f"{proved[0]} to {proved[-1]}" if len(proved) > 1 else proved[0]
        lines.append(f"- **{PACKAGES.get(kind, kind)}**: {span} (proved: {', '.join(proved)})")
        lines += [f"  - {_cell(text, 300)}" for text in rest]
    lines += ["", "## The rows", ""]
    lines += [f"- **{s.name}** (`{s.requirements.relative_to(REPO)}`): {notes(s)}" for s in stacks() if s.requirements]
    lines += ["", "## torch rows", "", *TORCH_HOOK]
    torch_matrix = _torch_matrix()
    if torch_matrix is not None:
        lines += ["", *(f"- **torch-{v}**: {torch_matrix.describe(v)}" for v in torch_matrix.TORCH_VERSIONS)]
    return "\n".join(lines) + "\n"


#: how the torch rows plug in (docs/stacks.md says it too)
TORCH_HOOK = [
    "A torch release is a whole environment, not a folder on `PYTHONPATH`, so its rows come from another module:",
    "`benchmarks/torch_matrix.py`, when present, defines `TORCH_VERSIONS` (release strings),",
    "`run_torch_rows(version, settings, how) -> list[Row]`, which builds that torch's environment and returns its",
    "rows: `settings.gate` against the committed goldens (`torch-X`) and, where verl's own requirements allow the",
    "row's stack, verl's 2-rank bf16 scenario against its committed goldens (`torch-X-verl`); and",
    "`describe(version)`, what the row runs with. Without it, the table lists the torch rows as not run. They run",
    "from the benchmark, not in `make test`.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", nargs="+", help="rows to run: constraints/stacks/ file stems, pinned, torch-X[-verl], torch (all)"
    )
    parser.add_argument("--gate", default=" ".join(GATE), help="the gate's pytest arguments, as one string")
    parser.add_argument("--out", type=Path, default=MatrixSettings().out, help="reports and artifacts")
    parser.add_argument("--write-docs", action="store_true", help="write the table to docs/stacks.md")
    parser.add_argument("--install", action="store_true", help="only install the rows' wheels (make .venv/.test)")
    parser.add_argument(
        "--reuse", action="store_true", help="read each row that --rows does not name from its report.json under --out"
    )
    args = parser.parse_args(argv)
    settings = MatrixSettings(gate=tuple(shlex.split(args.gate)), out=args.out)
    if args.install:
        for stack in (s for s in stacks() if not args.rows or s.name in args.rows):
            install(stack, settings.python)
        return 0
    rows = []
    for stack in stacks():
        mode = how(stack.name, args.rows, args.reuse)
        if mode == "reuse":
            rows.append(reused(stack, settings))
        elif mode == "run":
            install(stack, settings.python)
            rows.append(run_gate(stack, settings))
            print(f"{stack.name}: {rows[-1].status}, {rows[-1].failed} failed, {rows[-1].seconds:.0f} s", flush=True)
    rows += torch_rows(settings, args.rows, args.reuse)
    print(table(rows))
    if args.write_docs:
        DOC.write_text(docs_page(rows, settings))
        print(f"wrote {DOC.relative_to(REPO)}")
    return 0 if all(r.ok for r in rows if r.status != "not run") else 1


if __name__ == "__main__":
    sys.exit(main())
