"""``precision-harness``: the gate without pytest.

``precision-harness run SCENARIO... [--device D] [--ray-address ADDRESS] [--golden-device D]`` runs each
scenario (locally, on a local Ray instance when multi-rank, or on an existing Ray cluster), compares
every profiled stage and the metrics against ``golden/<scenario>/<device>/`` with the same
:class:`~precision_harness.session.PrecisionSession` the pytest plugin uses, prints one verdict per
item and exits 0 (all passed), 1 (a verdict failed) or 2 (usage error).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from precision_harness.errors import PrecisionError
from precision_harness.scenario import Scenario
from precision_harness.session import DEVICE_CHOICES, PrecisionOptions, PrecisionSession


def _run(args: argparse.Namespace) -> int:
    options = PrecisionOptions(
        device=args.device, artifacts=Path(args.artifacts), golden_dir=Path(args.golden_dir),
        ray_address=args.ray_address, golden_device=args.golden_device, timeout=args.timeout or None,
    )
    if options.device != "auto" and not options.ray_address:
        from precision_harness import device_check

        reason = device_check.unavailable_reason(options.device)
        if reason:
            print(f"precision-harness run: --device {options.device}: {reason.removeprefix(f'device {options.device}: ')}", file=sys.stderr)
            return 2
    session = PrecisionSession(options, rootdir=Path.cwd())
    failed = 0
    try:
        scenarios = [Scenario.load(p) for p in args.scenarios]
        for scenario in scenarios:
            session.submit(scenario)
        for scenario in scenarios:
            reason = session.device_unavailable(scenario)
            if reason:
                print(f"SKIP {scenario.name}: {reason}")
                continue
            for step in scenario.steps:
                for stage in scenario.stages:
                    out = session.outcome(scenario, step=step, stage=stage)
                    failed += not out.passed
                    print(("PASS " if out.passed else "FAIL ") + out.text)
            out = session.outcome(scenario)
            failed += not out.passed
            print(("PASS " if out.passed else "FAIL ") + out.text)
    except PrecisionError as exc:
        print(f"precision-harness run: {exc}", file=sys.stderr)
        return 2
    finally:
        session.close()
    for line in session.summary_lines():
        print(line)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="precision-harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios and compare them against their goldens")
    run.add_argument("scenarios", nargs="+", type=Path, metavar="SCENARIO", help="scenario YAML files")
    run.add_argument("--device", choices=DEVICE_CHOICES, default="auto", help="as --precision-device")
    run.add_argument("--ray-address", default=None, metavar="ADDRESS", help="as --precision-ray-address: submit runs to this Ray cluster")
    run.add_argument("--golden-device", choices=("cpu", "cuda", "npu"), default=None, help="as --precision-golden-device")
    run.add_argument("--golden-dir", default="golden", help="golden root (default: golden)")
    run.add_argument("--artifacts", default=".precision/artifacts", help="runs and compare tables (default: .precision/artifacts)")
    run.add_argument("--timeout", type=float, default=0, help="seconds a scenario run may take (0: no limit)")
    run.set_defaults(func=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
