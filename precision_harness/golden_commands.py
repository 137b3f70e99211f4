"""``precision-harness golden ACTION``: the golden store from the command line.

- ``verify``: schema, both sha256 of every file, unlisted files, NaN/Inf lint (exit 1 on a problem; a NaN/Inf the
  golden's scenario declares under ``tolerance.nonfinite`` is listed as declared, with its reason, and passes);
- ``list``: every golden with its level, steps, stored and plain size, calibration;
- ``migrate``: plain (format 1) goldens rewritten compressed, and every dump without an index indexed, atomically,
  re-recording nothing;
- ``export``: one golden as plain files in verl's layout (for msprobe's own tools);
- ``history``: the golden now against each of its committed versions, per stage
  (:mod:`precision_harness.history.golden_history`).

:mod:`precision_harness.cli` registers them (:func:`add_parser`) and maps errors to exit codes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from precision_harness import options as option_table
from precision_harness.errors import EXIT_DRIFT, EXIT_PASS, UsageError
from precision_harness.options import PrecisionOptions

if TYPE_CHECKING:
    from precision_harness.goldens.store import GoldenStore
    from precision_harness.goldens.verification import NonFinite

#: problems listed per golden by ``golden verify`` before "... and N more"
MAX_LISTED = 20


def _print(line: str = "") -> None:
    print(line, flush=True)


def _golden_store(args: argparse.Namespace):
    from precision_harness.goldens.store import GoldenStore

    root = PrecisionOptions.from_cli(args).golden_dir
    if not root.is_dir():
        raise UsageError(f"{root}: no golden directory here (--golden-dir)")
    return GoldenStore(root)


def cmd_golden_verify(args: argparse.Namespace) -> int:
    from precision_harness.goldens.verification import verify_golden

    store = _golden_store(args)
    goldens = store.list()
    declarations = _declarations(args.scenarios, store)
    bad = 0
    for name, device in goldens:
        found = verify_golden(store.path(name, device), declarations.get(name, ()))
        problems = found.problems
        bad += bool(problems)
        counts = [f"{len(problems)} problem(s)"] if problems else []
        counts += [f"{len(found.declared)} NaN/Inf its scenario declares"] if found.declared else []
        _print(
            f"{'FAIL' if problems else 'ok  '} {store.path(name, device)}"
            + (f": {', '.join(counts)}" if counts else "")
        )
        for p in problems[:MAX_LISTED]:
            _print(f"  {p}")
        if len(problems) > MAX_LISTED:
            _print(f"  ... and {len(problems) - MAX_LISTED} more")
        for p in found.declared[:MAX_LISTED]:
            _print(f"  {p}")
        if len(found.declared) > MAX_LISTED:
            _print(f"  ... and {len(found.declared) - MAX_LISTED} more declared")
    _print(f"{len(goldens)} goldens verified, {bad} with problems")
    return EXIT_DRIFT if bad else EXIT_PASS


def _declarations(named: list[Path], store: GoldenStore) -> dict[str, tuple[NonFinite, ...]]:
    """``{scenario name: its tolerance.nonfinite entries}`` of the store's goldens, read from the scenario files
    ``named`` (files or folders of ``*.yaml``/``*.yml``), or where none are named, from every such file in a
    ``scenarios`` folder below the golden directory's parent (the project the goldens belong to).

    Raises:
        ScenarioError: a scenario file is not readable YAML, or a golden's breaks the schema (file and field).
    """
    from precision_harness.goldens.recordable import declared_in_files
    from precision_harness.goldens.unused_goldens import discover_scenarios

    if named:
        files = [f for p in named for f in (sorted([*p.glob("*.yaml"), *p.glob("*.yml")]) if p.is_dir() else [p])]
    else:
        files = discover_scenarios(store.root.resolve().parent, ["scenarios"])
    return declared_in_files(files, {name for name, _ in store.list()})


def cmd_golden_list(args: argparse.Namespace) -> int:
    from precision_harness.errors import GoldenError
    from precision_harness.goldens.golden import Golden

    store = _golden_store(args)
    rows = [("scenario", "device", "level", "steps", "stages", "files", "stored MB", "plain MB", "calibrated")]
    for name, device in store.list():
        try:
            g = Golden.from_dir(store.path(name, device))
        except GoldenError:
            rows.append((name, device, "?", "?", "?", "?", "?", "?", "unreadable manifest"))
            continue
        rows.append(_golden_row(name, device, g))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        _print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return EXIT_PASS


def _golden_row(name: str, device: str, g) -> tuple[str, ...]:
    m, noise = g.manifest, g.noise
    steps, stages = ",".join(map(str, m["steps"])), str(len(m["stages"]))
    calibrated = f"{noise['runs']} runs, k={noise['k']:g}" if noise else "no"
    sizes = (f"{g.size_bytes / 1e6:.2f}", f"{g.content_bytes / 1e6:.2f}")
    return (name, device, g.level or "?", steps, stages, str(len(m["files"])), *sizes, calibrated)


def cmd_golden_export(args: argparse.Namespace) -> int:
    from precision_harness.goldens.golden import Golden
    from precision_harness.runs.kind_runners import load_scenario

    store, opts = _golden_store(args), PrecisionOptions.from_cli(args)
    scenario = load_scenario(args.scenario)
    golden = Golden.from_dir(store.path(scenario.name, opts.device_for(scenario)))
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: not empty; export writes a fresh verl layout (pick an empty or new folder)")
    files = [p for p in golden.export(out).rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    _print(f"exported {golden.path} ({len(files)} files, {size / 1e6:.2f} MB) -> {out}")
    return EXIT_PASS


def cmd_golden_migrate(args: argparse.Namespace) -> int:
    store = _golden_store(args)
    goldens = store.list()
    migrated = 0
    for name, device in goldens:
        path = store.path(name, device)
        before = _stored_bytes(path)
        if store.migrate(name, device):
            migrated += 1
            _print(f"migrated {path}: {before / 1e6:.2f} MB -> {_stored_bytes(path) / 1e6:.2f} MB")
        else:
            _print(f"ok       {path}: already compressed and indexed")
    _print(f"{migrated} of {len(goldens)} goldens migrated")
    return EXIT_PASS


def _stored_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cmd_golden_history(args: argparse.Namespace) -> int:
    import tempfile

    from precision_harness.check.tolerance.policy import TolerancePolicy
    from precision_harness.goldens.golden import Golden
    from precision_harness.history.golden_history import GoldenHistory, history_html, history_lines, history_rows
    from precision_harness.runs.kind_runners import load_scenario

    store, opts = _golden_store(args), PrecisionOptions.from_cli(args)
    scenario = load_scenario(args.scenario)
    device = opts.device_for(scenario)
    current = Golden.from_dir(store.path(scenario.name, device))
    policy = TolerancePolicy.for_golden(scenario.config["tolerance"], noise=current.noise, cross_device=False)
    with tempfile.TemporaryDirectory(prefix="precision-history-") as scratch:
        history = GoldenHistory.of(current.path, Path(scratch))
        commits = history.commits(since=args.since)
        rows = history_rows(current, history, commits, policy)
    title = f"{scenario.name} on {device}: the golden now against its {len(rows)} committed version(s)"
    _print(f"{title} (worst ratio to tolerance per stage; 0: identical)")
    for line in history_lines(rows):
        _print(line)
    if args.html is not None:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(history_html(title, rows), encoding="utf-8")
        _print(f"plot: {args.html}")
    return EXIT_PASS


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``precision-harness golden ACTION``: one subcommand per action, on ``sub`` (the CLI's subcommands)."""
    p = sub.add_parser("golden", help="inspect goldens")
    gsub = p.add_subparsers(dest="golden_command", required=True, metavar="ACTION")
    for action, func, text in (
        (
            "verify",
            cmd_golden_verify,
            "schema, sha256 and NaN/Inf lint of every golden (exit 1 on a problem; a NaN/Inf its scenario declares "
            "under tolerance.nonfinite is shown as declared)",
        ),
        ("list", cmd_golden_list, "every golden with its level, steps, stored and plain size, calibration"),
        (
            "migrate",
            cmd_golden_migrate,
            "rewrite plain (format 1) goldens compressed and index every dump without one, atomically, "
            "re-recording nothing",
        ),
        ("export", cmd_golden_export, "write one golden as plain files in verl's layout (for msprobe's own tools)"),
        ("history", cmd_golden_history, "the golden now against each committed version of it (git), per stage"),
    ):
        gp = gsub.add_parser(action, help=text)
        if action == "verify":
            gp.add_argument(
                "scenarios",
                type=Path,
                nargs="*",
                metavar="SCENARIO",
                help="scenario files (or folders of them) whose tolerance.nonfinite declares NaN/Inf of their golden "
                "(default: every *.yaml in a scenarios folder beside the golden directory)",
            )
        if action == "export":
            gp.add_argument("scenario", type=Path, help="scenario YAML file whose golden is exported")
            gp.add_argument("--out", type=Path, required=True, help="empty or new folder for the plain layout")
            option_table.add_cli_options(gp, "export")
        if action == "history":
            gp.add_argument("scenario", type=Path, help="scenario YAML file whose golden's history is read")
            gp.add_argument("--since", default=None, metavar="REV", help="only versions committed after REV")
            gp.add_argument("--html", type=Path, default=None, metavar="PATH", help="write an offline plot here")
            option_table.add_cli_options(gp, "history")
        option_table.add_cli_options(gp, "golden")
        gp.set_defaults(func=func)
