"""``precision-harness``: the gate outside pytest.

- ``run SCENARIO --out DIR``: one scenario run into a verl-layout directory (progress shown), then
  the scenario's ``invariants:`` over it (exit 1 when one fails; docs/consistency.md);
- ``compare TARGET GOLDEN``: every ``step_<n>/<stage>`` and the metrics of a verl-layout directory
  (our run, or verl's ``global_profiler.save_path``) against a golden or another such directory,
  through :func:`precision_harness.check.verdicts.items.check_items`, the path the pytest items take (same
  tolerance, sha256 checks, cross-device rules, verdicts, msprobe analysis); ``--report DIR`` as
  ``--precision-report``. A compressed golden as TARGET (another device's, say) is exported first.
  With ``--scenario``, a run directory as TARGET is also held to the scenario's ``invariants:``;
- ``golden verify`` (schema, sha256, NaN/Inf lint), ``golden list`` (sizes stored and plain),
  ``golden migrate`` (plain goldens rewritten compressed), ``golden export`` (a golden as plain
  files, for msprobe's own tools) and ``golden history``: :mod:`precision_harness.golden_commands`;
- ``calibrate SCENARIO --runs N``: record rerun noise in the golden manifest
  (:mod:`precision_harness.check.tolerance.calibrate`);
- ``portability SCENARIO...``: each scenario under the CPU dispatch choices other processors take
  (:mod:`precision_harness.portability`); exit 1 if a dump changes;
- ``bisect --good REV [--bad REV] SCENARIO [-k EXPR]``: the first commit whose selected items drift
  from a fixed golden (:mod:`precision_harness.history.bisect`); exit 0 when found.

Exit codes: 0 pass, 1 drift or a failed run or a bad golden, 2 usage (bad arguments, a bad scenario
file, a missing golden, an unsafe path): each error class carries its ``exit_code``
(:mod:`precision_harness.errors`). The compare path imports neither torch nor msprobe.pytorch.
Options shared with the plugin come from :mod:`precision_harness.options`.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

from precision_harness import golden_commands
from precision_harness import options as option_table
from precision_harness.errors import EXIT_DRIFT, EXIT_PASS, EXIT_USAGE, PrecisionError, UsageError
from precision_harness.options import PrecisionOptions
from precision_harness.runs.processes import stop_on_signals

#: exit status after Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_INTERRUPTED = 130


def _print(line: str = "") -> None:
    print(line, flush=True)


# ------------------------------------------------------------------------------------------ run
def cmd_run(args: argparse.Namespace) -> int:
    from precision_harness import progress
    from precision_harness.runs.kind_runners import load_scenario, run_scenario
    from precision_harness.runs.launch import RunOptions

    scenario = load_scenario(args.scenario)
    opts = PrecisionOptions.from_cli(args)
    device = opts.device_for(scenario)
    options = RunOptions(timeout=opts.timeout, ray_address=opts.ray_address)
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(run_scenario, scenario, out_dir=args.out, device=device, options=options)
        progress.follow(
            args.out,
            future,
            scenario=scenario.name,
            report=lambda line: _print(f"[precision] {line}"),
            total_steps=scenario.total_steps,
        )
        run = future.result()
    timing = progress.timing_line(run.run_json)
    _print(f"{scenario.name} on {device}: run {run.wall_s:.1f} s ({timing}) -> {run.run_dir}")
    failed = 0
    for _, _, out in _invariant_outcomes(scenario, run.run_dir):
        _print(("PASS " if out.passed else "FAIL ") + out.text)
        failed += not out.passed
    return EXIT_DRIFT if failed else EXIT_PASS


def _invariant_outcomes(scenario, run_dir: Path):
    """``(step, check, Outcome)`` of the scenario's ``invariants:`` over its run in ``run_dir``: no golden,
    the run's own files (:func:`precision_harness.check.tolerance.consistency.run_verdicts`, as the gate's items)."""
    from precision_harness.check.tolerance import consistency
    from precision_harness.check.verdicts.items import Outcome, OutcomeKind

    for step, name, verdict in consistency.run_verdicts(scenario, Path(run_dir)):
        yield step, name, Outcome(verdict.passed, verdict.text, OutcomeKind.COMPARED)


# -------------------------------------------------------------------------------------- compare
def _compare_golden(path: Path):
    """A recorded golden (validated manifest, sha256 checked on use), else any verl-layout directory."""
    from precision_harness.goldens.golden import Golden
    from precision_harness.goldens.manifest import MANIFEST

    return Golden.from_dir(path) if (path / MANIFEST).is_file() else Golden.from_run_dir(path)


def _compare_target(target: Path, artifacts: Path) -> Path:
    """The target as plain files: a compressed golden (e.g. another device's) is exported under ``artifacts``."""
    from precision_harness.goldens.golden import Golden
    from precision_harness.goldens.manifest import MANIFEST

    if not (target / MANIFEST).is_file():
        return target
    golden = Golden.from_dir(target)
    if not golden.compressed:
        return target
    out = artifacts / "target"
    shutil.rmtree(out, ignore_errors=True)
    golden.export(out)
    run = {"scenario": golden.scenario, "device": golden.device, "env": golden.env}
    (out / "run.json").write_text(json.dumps(run), encoding="utf-8")
    return out


def _is_golden(path: Path) -> bool:
    from precision_harness.goldens.manifest import MANIFEST

    return (path / MANIFEST).is_file()


def _target_run(target: Path) -> dict:
    """The target's run.json (device, environment), ``{}`` where it has none or it is unreadable."""
    try:
        run = json.loads((target / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return run if isinstance(run, dict) else {}


def _target_device(target: Path, opts: PrecisionOptions) -> str | None:
    """``--device``, else the device our runner wrote into the target's run.json (None: unknown)."""
    if opts.device != "auto":
        return opts.device
    return _target_run(target).get("device")


def cmd_compare(args: argparse.Namespace) -> int:
    from precision_harness import progress
    from precision_harness.check.check_settings import CheckSettings
    from precision_harness.check.environment import EnvironmentDiff
    from precision_harness.check.tolerance.policy import TolerancePolicy
    from precision_harness.check.verdicts.items import check_items
    from precision_harness.report.item_record import ItemRecord
    from precision_harness.report.precision_report import PrecisionReport
    from precision_harness.runs.kind_runners import load_scenario

    opts = PrecisionOptions.from_cli(args)
    target, golden, artifacts, keys = _compare_inputs(args, opts)
    scenario = load_scenario(args.scenario) if args.scenario else None
    tolerance = scenario.config["tolerance"] if scenario is not None else None
    device = _target_device(target, opts)
    environment = EnvironmentDiff.between(golden.env, _target_run(target).get("env"))
    # another accelerator model is another device's kernels: the cross-device rules, as for another device type
    cross = (device is not None and golden.device is not None and device != golden.device) or bool(
        environment.device_model
    )
    policy = TolerancePolicy.for_golden(tolerance, noise=golden.noise, cross_device=cross)
    bar = progress.compare_bar(len(keys))
    settings = CheckSettings(
        scenario=golden.scenario,
        policy=policy,
        artifacts=artifacts,
        environment=environment,
        msprobe_full=opts.msprobe_full,
        msprobe_timeout=opts.msprobe_timeout,
        progress=bar.set_postfix_str,
        allow_uncompared=opts.allow_uncompared,
    )
    report = PrecisionReport(mode="compare")
    for key, out in check_items(target, golden, keys, settings):
        bar.update(1)
        bar.clear()
        _print(("PASS " if out.passed else "FAIL ") + out.text)
        nodeid = f"{args.target}::{'metrics' if key.is_metrics else f'step_{key.step}/{key.stage}'}"
        record = ItemRecord.from_outcome(out, nodeid=nodeid, scenario=golden.scenario, step=key.step, stage=key.stage)
        report.records.append(record)
    # a golden keeps no weight_sync.json or log_probs.json: invariants are checked on a run directory
    if scenario is not None and target == Path(args.target) and not _is_golden(target):
        for step, name, out in _invariant_outcomes(scenario, target):
            _print(("PASS " if out.passed else "FAIL ") + out.text)
            nodeid = f"{args.target}::{name}[step_{step}]"
            report.records.append(
                ItemRecord.from_outcome(out, nodeid=nodeid, scenario=golden.scenario, step=step, stage=name)
            )
    bar.close()
    _print(f"{report.num_items} compared, {report.num_items - report.num_failed} passed, {report.num_failed} failed")
    if opts.report is not None:
        _print(f"precision report: {', '.join(map(str, report.write(opts.report)))}")
    return EXIT_DRIFT if report.num_failed else EXIT_PASS


def _compare_inputs(args: argparse.Namespace, opts: PrecisionOptions):
    """``(target dir, Golden, artifacts dir, items)`` of ``compare TARGET GOLDEN``; UsageError where unusable."""
    from precision_harness.check.verdicts.items import items_of
    from precision_harness.paths import join_inside
    from precision_harness.runs.stage_api import check_dump_path

    for p, what in ((Path(args.target), "TARGET"), (Path(args.golden), "GOLDEN")):
        if not p.is_dir():
            raise UsageError(
                f"{p}: {what} is not a directory (expected verl's layout: step_<n>/<stage>/step0/rank<r>/dump.json)"
            )
    try:
        check_dump_path(opts.artifacts)
    except ValueError as exc:
        raise UsageError(f"--artifacts: {exc}") from None
    golden = _compare_golden(Path(args.golden))
    artifacts = join_inside(opts.artifacts, golden.scenario, what="artifacts <scenario>")
    target = _compare_target(Path(args.target), artifacts)
    keys = items_of(target, golden)
    if not any(not k.is_metrics for k in keys):
        raise UsageError(
            f"{args.target}, {args.golden}: no step_<n>/<stage>/step0/rank<r>/dump.json on either side; point at "
            "a run directory, a golden, or verl's global_profiler.save_path (outputs/profile)"
        )
    return target, golden, artifacts, keys


# ------------------------------------------------------------------------------------ calibrate
def cmd_calibrate(args: argparse.Namespace) -> int:
    from precision_harness.check.tolerance.calibrate import calibrate, noise_table, proposed_tolerance, reruns
    from precision_harness.goldens.store import GoldenStore
    from precision_harness.runs.kind_runners import bind, load_scenario
    from precision_harness.runs.launch import RunOptions

    if args.runs < 2:
        raise UsageError(f"--runs {args.runs}: calibration needs at least 2 reruns")
    scenario = load_scenario(args.scenario)
    opts = PrecisionOptions.from_cli(args)
    device = opts.device_for(scenario)
    store = GoldenStore(opts.golden_dir)
    golden = store.load(scenario, device)  # GoldenMissingError names the command that records it
    work = Path(args.work_dir or f".precision/calibrate/{scenario.name}")

    def on_run(i, variation, run) -> None:
        _print(f"[precision] {scenario.name}: rerun {i + 1}/{args.runs} ({variation}) {run.wall_s:.1f} s")

    # as the check runs it: a verl scenario's reruns load the golden's pinned rollouts (rollouts each rerun sampled
    # itself would differ by sampling noise, stored as device noise), on the same Ray cluster
    pinned = golden if scenario.pins_rollouts else None
    run = bind(device, RunOptions(timeout=opts.timeout, ray_address=opts.ray_address, pinned=pinned))
    results = reruns(scenario, runs=args.runs, work_dir=work, run=run, on_run=on_run, device=device)
    noise = calibrate(scenario, golden, results, k=args.k, device=device)
    changed = store.set_noise(scenario.name, device, noise)
    for line in noise_table(noise):
        _print(line)
    _print(f"golden {'updated' if changed else 'unchanged'}: {store.path(scenario.name, device) / 'manifest.json'}")
    _print_proposal(proposed_tolerance(noise), work / "tolerance.proposed.yaml")
    return EXIT_PASS


def _print_proposal(proposal: dict, path: Path) -> None:
    import yaml

    if not proposal["stages"]:
        _print("every rerun reproduced the golden exactly: no tolerance to propose")
        return
    path.write_text(yaml.safe_dump({"tolerance": proposal}, sort_keys=False), encoding="utf-8")
    _print(f"proposed tolerance (k x observed) for the scenario file, written to {path}:")
    for line in yaml.safe_dump({"tolerance": proposal}, sort_keys=False).splitlines():
        _print(f"  {line}")


# --------------------------------------------------------------------------------------- bisect
def cmd_bisect(args: argparse.Namespace) -> int:
    from precision_harness.history.bisect import BisectSettings, run_bisect
    from precision_harness.paths import display_path, join_inside
    from precision_harness.runs.kind_runners import load_scenario

    opts = PrecisionOptions.from_cli(args)
    name = load_scenario(args.scenario).name if args.scenario.is_file() else args.scenario.stem
    settings = BisectSettings(
        scenario=args.scenario,
        good=args.good,
        bad=args.bad,
        keyword=args.keyword,
        golden_dir=args.golden_dir,
        work=join_inside(opts.artifacts, "bisect", name, what="artifacts bisect/<scenario>"),
        run_flags=tuple(opts.run_flags()),
    )
    _print(f"[precision] bisect {name}: --good {args.good}, --bad {args.bad}; your checkout is not touched")
    try:
        result = run_bisect(settings, _print)
    except KeyboardInterrupt:
        _print("[precision] bisect interrupted: git bisect reset, its worktree removed; your checkout is as it was")
        return EXIT_INTERRUPTED
    c = result.first_bad
    _print(f"first bad commit: {c.short} {c.subject}")
    for line in result.verdict:
        _print(f"  {line}")
    _print(f"scenario runs: {result.runs} (the good and bad checks included)")
    _print(f"bisect log: {display_path(result.log)} (replay: git bisect replay {display_path(result.log)})")
    return EXIT_PASS


# ---------------------------------------------------------------------------------- portability
def cmd_portability(args: argparse.Namespace) -> int:
    from precision_harness.goldens.store import GoldenStore
    from precision_harness.portability import SETTINGS, PortabilityRun, check_scenario, exported_golden
    from precision_harness.runs.kind_runners import load_scenario

    scenarios = [load_scenario(path) for path in args.scenarios]  # a bad file stops before any run
    opts = PrecisionOptions.from_cli(args)
    settings = SETTINGS
    if args.settings:
        by_name = {s.name: s for s in SETTINGS}
        unknown = [name for name in args.settings if name not in by_name]
        if unknown:
            raise UsageError(f"--setting {unknown[0]!r}: not one of: {', '.join(by_name)}")
        settings = tuple(by_name[name] for name in args.settings)
    dependent = 0
    for scenario in scenarios:
        device = opts.device_for(scenario)
        how = PortabilityRun(
            device=device,
            work_dir=Path(args.work_dir),
            timeout=opts.timeout,
            settings=settings,
            on_run=lambda label, run, name=scenario.name: _print(f"[precision] {name}: {label} {run.wall_s:.1f} s"),
            baseline=exported_golden(GoldenStore(opts.golden_dir), scenario, device, Path(args.work_dir))
            if args.against_golden
            else None,
        )
        result = check_scenario(scenario, how)
        dependent += not result.independent
        for line in result.lines():
            _print(line)
    return EXIT_DRIFT if dependent else EXIT_PASS


# ----------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="precision-harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("run", help="run one scenario into a verl-layout directory")
    p.add_argument("scenario", type=Path, help="scenario YAML file")
    p.add_argument("--out", type=Path, required=True, help="run directory (replaced)")
    option_table.add_cli_options(p, "run")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("compare", help="compare two verl-layout directories (exit 0 pass, 1 drift, 2 usage)")
    p.add_argument("target", type=Path, help="run directory or verl outputs/profile")
    p.add_argument("golden", type=Path, help="golden (golden/<scenario>/<device>) or another run directory")
    p.add_argument(
        "--scenario",
        type=Path,
        default=None,
        help="scenario YAML whose 'tolerance' section applies (default: dtype defaults) and whose "
        "'invariants:' TARGET (a run directory) is held to",
    )
    option_table.add_cli_options(p, "compare")
    p.set_defaults(func=cmd_compare)
    golden_commands.add_parser(sub)
    _add_calibrate(sub)
    _add_portability(sub)
    _add_bisect(sub)
    return parser


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    from precision_harness.check.tolerance.calibrate import DEFAULT_K

    p = sub.add_parser("calibrate", help="record rerun noise (thread counts, process restarts) in the golden manifest")
    p.add_argument("scenario", type=Path, help="scenario YAML file (its golden must exist)")
    p.add_argument("--runs", type=int, default=4, help="reruns (default 4; at least 2)")
    p.add_argument(
        "--k", type=float, default=DEFAULT_K, help=f"rtol = max(k x observed, dtype rtol) (default {DEFAULT_K:g})"
    )
    p.add_argument("--work-dir", default=None, help="where reruns go (default .precision/calibrate/<scenario>)")
    option_table.add_cli_options(p, "calibrate")
    p.set_defaults(func=cmd_calibrate)


def _add_portability(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "portability",
        help="run scenarios under the CPU dispatch choices other processors take; exit 1 if a dump changes",
    )
    p.add_argument("scenarios", type=Path, nargs="+", metavar="SCENARIO", help="scenario YAML files")
    p.add_argument(
        "--setting",
        dest="settings",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this setting, e.g. 'PRECISION_MKLDNN=0' (repeatable; default: all of them)",
    )
    p.add_argument(
        "--work-dir", default=".precision/portability", help="where runs go (default .precision/portability)"
    )
    p.add_argument(
        "--against-golden",
        action="store_true",
        help="compare each setting's run with the scenario's golden instead of a baseline run (one run fewer; "
        "needs a golden the gate holds bitwise on this machine, as the CPU goldens on x86)",
    )
    option_table.add_cli_options(p, "portability")
    p.set_defaults(func=cmd_portability)


def _add_bisect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bisect",
        help="the first commit at which a scenario's items drift from a fixed golden (git bisect run, in a worktree)",
    )
    p.add_argument("scenario", type=Path, help="scenario YAML file (its path in your repository)")
    p.add_argument("--good", required=True, metavar="REV", help="a commit that passes (its golden is the reference)")
    p.add_argument("--bad", default="HEAD", metavar="REV", help="a commit that drifts (default HEAD)")
    p.add_argument("-k", dest="keyword", default=None, metavar="EXPR", help="pytest -k expression selecting items")
    p.add_argument(
        "--golden-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="use the goldens in DIR of the working tree instead of those committed at --good (in the folder "
        "the precision_golden_dir of the pytest ini file at --good names, default golden)",
    )
    option_table.add_cli_options(p, "bisect")
    p.set_defaults(func=cmd_bisect)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``precision-harness``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    stop_on_signals()  # SIGTERM and SIGHUP stop the command's runs as Ctrl-C does
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"precision-harness {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PrecisionError as exc:
        print(f"precision-harness {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code


def script() -> NoReturn:
    """The ``precision-harness`` command (and ``python -m precision_harness.cli``): :func:`main`'s exit code, the
    process's objects frozen first (``gc.freeze``), so the collection at exit does not walk every object a compare
    left (a 65,000-call rank's template, pandas): 0.2-0.3 s to free memory the process gives back anyway."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    script()
