"""``precision-harness``: the gate outside pytest.

- ``run SCENARIO --out DIR``: one scenario run into a verl-layout directory (progress shown);
- ``compare TARGET GOLDEN``: every ``step_<n>/<stage>`` of two verl-layout directories (a golden,
  a run, or a real verl ``outputs/profile``) with the plugin's tolerance policy, verdicts and
  msprobe analysis (:mod:`precision_harness.check`); ``--report DIR`` as ``--precision-report``;
- ``golden verify`` (schema, sha256, NaN/Inf lint) and ``golden list``;
- ``calibrate SCENARIO --runs N``: record rerun noise in the golden manifest (:mod:`precision_harness.calibrate`).

Exit codes: 0 pass, 1 drift (or a bad golden, a failed run), 2 usage (bad arguments or paths).
The compare path imports neither torch nor msprobe.pytorch. Options shared with the plugin come
from :mod:`precision_harness.options`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from precision_harness import options as option_table
from precision_harness.errors import PrecisionError

EXIT_PASS, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command-line mistake: printed as one line, exit 2."""


def _print(line: str = "") -> None:
    print(line, flush=True)


# ------------------------------------------------------------------------------------------ run
def cmd_run(args: argparse.Namespace) -> int:
    from precision_harness import progress
    from precision_harness.launch import run_scenario
    from precision_harness.scenario import Scenario

    scenario = Scenario.load(args.scenario)
    opts = option_table.from_cli(args)
    device = scenario.config["device"] if opts.get("device", "auto") == "auto" else opts["device"]
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(
            run_scenario,
            scenario,
            out_dir=args.out,
            device=device,
            timeout=opts.get("timeout"),
            ray_address=opts.get("ray_address"),
        )
        progress.follow(
            args.out,
            future,
            scenario=scenario.name,
            report=lambda line: _print(f"[precision] {line}"),
            total_steps=scenario.config["trainer"]["total_training_steps"],
        )
        run = future.result()
    _print(
        f"{scenario.name} on {device}: run {run.wall_s:.1f} s ({progress.timing_line(run.manifest)}) -> {run.run_dir}"
    )
    return EXIT_PASS


# -------------------------------------------------------------------------------------- compare
def stage_pairs(target: Path, golden: Path) -> list[tuple[int, str]]:
    """Sorted ``(step, stage)`` with a ``step0/rank*/dump.json`` on either side."""
    found = set()
    for root in (target, golden):
        for dump in root.glob("step_*/*/step0/rank*/dump.json"):
            step_dir = dump.parents[3].name
            if step_dir[5:].isdigit():
                found.add((int(step_dir[5:]), dump.parents[2].name))
    from precision_harness.scenario import STAGES

    return sorted(found, key=lambda p: (p[0], STAGES.index(p[1]) if p[1] in STAGES else len(STAGES), p[1]))


def cmd_compare(args: argparse.Namespace) -> int:
    import json

    from precision_harness import report
    from precision_harness.check import check_metrics, check_stage
    from precision_harness.golden import MANIFEST, Golden
    from precision_harness.runner.probe import check_dump_path
    from precision_harness.scenario import Scenario, validate
    from precision_harness.tolerance import TolerancePolicy

    target, golden_dir = Path(args.target), Path(args.golden)
    for p, what in ((target, "TARGET"), (golden_dir, "GOLDEN")):
        if not p.is_dir():
            raise UsageError(
                f"{p}: {what} is not a directory (expected verl's layout: step_<n>/<stage>/step0/rank<r>/dump.json)"
            )
    pairs = stage_pairs(target, golden_dir)
    if not pairs:
        raise UsageError(
            f"{target}, {golden_dir}: no step_<n>/<stage>/step0/rank<r>/dump.json on either side; "
            "point at a run directory, a golden, or verl's global_profiler.save_path (outputs/profile)"
        )
    policy = TolerancePolicy()
    if args.scenario:
        policy = TolerancePolicy.from_config(Scenario.load(args.scenario).config["tolerance"])
    golden = None
    if (golden_dir / MANIFEST).is_file():
        manifest = json.loads((golden_dir / MANIFEST).read_text(encoding="utf-8"))
        validate(manifest, "golden_manifest", source=golden_dir / MANIFEST)
        golden = Golden(path=golden_dir, manifest=manifest)
        policy = policy.with_noise(manifest.get("noise"))
    opts = option_table.from_cli(args)
    artifacts = opts.get("artifacts", Path(".precision/compare"))
    try:
        check_dump_path(artifacts)
    except ValueError as exc:
        raise UsageError(f"--artifacts: {exc}") from None
    name = golden.manifest["scenario"] if golden else target.name
    records, failed = [], 0
    for step, stage in pairs:
        level = _dump_level(target, golden_dir, step, stage)
        out = check_stage(
            target / f"step_{step}" / stage,
            golden_dir / f"step_{step}" / stage,
            scenario=name,
            step=step,
            stage=stage,
            policy=policy,
            golden_sha256=golden.sha256(step, stage) if golden else None,
            golden_statistics=golden.statistics(step, stage) if golden else None,
            artifacts=artifacts / f"step_{step}" / stage,
            level=level,
        )
        failed += not out.passed
        _print(("PASS " if out.passed else "FAIL ") + out.text)
        records.append(
            report.item_record(
                nodeid=f"{target}::step_{step}/{stage}", scenario=name, step=step, stage=stage, outcome=out
            )
        )
    t_metrics, g_metrics = target / "metrics.jsonl", golden_dir / "metrics.jsonl"
    if t_metrics.is_file() and g_metrics.is_file():
        out = check_metrics(t_metrics, g_metrics, scenario=name, policy=policy)
        failed += not out.passed
        _print(("PASS " if out.passed else "FAIL ") + out.text)
        records.append(
            report.item_record(nodeid=f"{target}::metrics", scenario=name, step=None, stage=None, outcome=out)
        )
    _print(f"{len(records)} compared, {len(records) - failed} passed, {failed} failed")
    if opts.get("report") is not None:
        paths = report.write_report(opts["report"], report.build_report(records, mode="compare"))
        _print(f"precision report: {', '.join(map(str, paths))}")
    return EXIT_DRIFT if failed else EXIT_PASS


def _dump_level(target: Path, golden: Path, step: int, stage: str) -> str | None:
    """msprobe level recorded in the stage's dump.json (``"level"``), target side first."""
    import json

    for root in (target, golden):
        for dump in sorted((root / f"step_{step}" / stage).glob("step0/rank*/dump.json")):
            try:
                with open(dump, encoding="utf-8") as fh:
                    head = fh.read(4096)
                start = head.find('"level"')
                if start >= 0:
                    return json.loads("{" + head[start:].split(",", 1)[0] + "}")["level"]
            except (OSError, ValueError):
                continue
    return None


# --------------------------------------------------------------------------------------- golden
def _golden_root(args: argparse.Namespace) -> Path:
    root = Path(args.golden_dir)
    if not root.is_dir():
        raise UsageError(f"{root}: no golden directory here (--golden-dir)")
    return root


def cmd_golden_verify(args: argparse.Namespace) -> int:
    from precision_harness.golden import GoldenStore, verify_golden

    store = GoldenStore(_golden_root(args))
    goldens = store.list()
    bad = 0
    for name, device in goldens:
        problems = verify_golden(store.path(name, device))
        if problems:
            bad += 1
            _print(f"FAIL {store.path(name, device)}: {len(problems)} problem(s)")
            for p in problems[:20]:
                _print(f"  {p}")
            if len(problems) > 20:
                _print(f"  ... and {len(problems) - 20} more")
        else:
            _print(f"ok   {store.path(name, device)}")
    _print(f"{len(goldens)} goldens verified, {bad} with problems")
    return EXIT_DRIFT if bad else EXIT_PASS


def cmd_golden_list(args: argparse.Namespace) -> int:
    import json

    from precision_harness.golden import MANIFEST, GoldenStore

    store = GoldenStore(_golden_root(args))
    rows = [("scenario", "device", "level", "steps", "stages", "files", "MiB", "calibrated")]
    for name, device in store.list():
        try:
            m = json.loads((store.path(name, device) / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rows.append((name, device, "?", "?", "?", "?", "?", "unreadable manifest"))
            continue
        size = sum(f.get("bytes", 0) for f in m.get("files", {}).values()) / 2**20
        noise = m.get("noise")
        rows.append(
            (
                name,
                device,
                m.get("level", "?"),
                ",".join(map(str, m.get("steps", []))),
                str(len(m.get("stages", []))),
                str(len(m.get("files", {}))),
                f"{size:.1f}",
                f"{noise['runs']} runs, k={noise['k']:g}" if noise else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        _print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return EXIT_PASS


# ------------------------------------------------------------------------------------ calibrate
def cmd_calibrate(args: argparse.Namespace) -> int:
    from precision_harness.calibrate import calibrate
    from precision_harness.golden import GoldenStore
    from precision_harness.scenario import Scenario
    from precision_harness.tolerance import STATISTICS, TolerancePolicy

    if args.runs < 2:
        raise UsageError(f"--runs {args.runs}: calibration needs at least 2 reruns")
    scenario = Scenario.load(args.scenario)
    opts = option_table.from_cli(args)
    device = scenario.config["device"] if opts.get("device", "auto") == "auto" else opts["device"]
    store = GoldenStore(Path(opts.get("golden_dir", "golden")))
    golden = store.load(scenario, device)  # GoldenMissingError names the command that records it
    work = Path(args.work_dir or f".precision/calibrate/{scenario.name}")
    noise = calibrate(
        scenario,
        golden,
        runs=args.runs,
        device=device,
        work_dir=work,
        k=args.k,
        timeout=opts.get("timeout"),
        on_run=lambda i, v, r: _print(f"[precision] {scenario.name}: rerun {i + 1}/{args.runs} ({v}) {r.wall_s:.1f} s"),
    )
    changed = store.set_noise(scenario.name, device, noise)
    policy = TolerancePolicy.from_config(scenario.config["tolerance"]).with_noise(noise)
    _print(
        f"observed noise over {args.runs} reruns (relative change vs golden) -> fp32 rtol = max({args.k:g} x observed, floor):"
    )
    _print("  " + "stage".ljust(24) + "".join(s.ljust(20) for s in STATISTICS))
    for stage, stats in noise["stages"].items():
        cells = [
            f"{stats[s]:.2g} -> {policy.for_tensor(dtype='torch.float32', stage=stage, statistic=s, api='').rtol:.2g}"
            for s in STATISTICS
        ]
        _print("  " + stage.ljust(24) + "".join(c.ljust(20) for c in cells))
    _print(f"golden {'updated' if changed else 'unchanged'}: {store.path(scenario.name, device) / 'manifest.json'}")
    return EXIT_PASS


# ----------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from precision_harness.calibrate import DEFAULT_K

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
        help="scenario YAML whose 'tolerance' section applies (default: dtype defaults)",
    )
    option_table.add_cli_options(p, "compare")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("golden", help="inspect goldens")
    gsub = p.add_subparsers(dest="golden_command", required=True, metavar="ACTION")
    for action, func, text in (
        ("verify", cmd_golden_verify, "schema, sha256 and NaN/Inf lint of every golden (exit 1 on a problem)"),
        ("list", cmd_golden_list, "every golden with its level, steps, size and calibration"),
    ):
        gp = gsub.add_parser(action, help=text)
        option_table.add_cli_options(gp, "golden")
        gp.set_defaults(func=func)
    p = sub.add_parser("calibrate", help="record rerun noise (thread counts, process restarts) in the golden manifest")
    p.add_argument("scenario", type=Path, help="scenario YAML file (its golden must exist)")
    p.add_argument("--runs", type=int, default=4, help="reruns (default 4; at least 2)")
    p.add_argument(
        "--k", type=float, default=DEFAULT_K, help=f"rtol = max(k x observed, dtype rtol) (default {DEFAULT_K:g})"
    )
    p.add_argument("--work-dir", default=None, help="where reruns go (default .precision/calibrate/<scenario>)")
    option_table.add_cli_options(p, "calibrate")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``precision-harness``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"precision-harness {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PrecisionError as exc:
        print(f"precision-harness {args.command}: {exc}", file=sys.stderr)
        from precision_harness.errors import GoldenMissingError, ScenarioError

        return EXIT_USAGE if isinstance(exc, (ScenarioError, GoldenMissingError)) else EXIT_DRIFT


if __name__ == "__main__":
    sys.exit(main())
