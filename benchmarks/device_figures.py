"""The figures of the GPU device run (``benchmarks/device_run.sh``), printed as text lines for its summary.

Subcommands, each over files the run wrote (none imports torch except ``cost``, which starts workers):

- ``diff RUN_A RUN_B``: every ``dump.json`` of two runs of one scenario (verl layout) byte-compared; for a
  pair that differs, how many tensor rows moved and the largest moves (``|a - b| / |b|`` per statistic,
  Mean against the RMS ``Norm / sqrt(numel)`` as the gate scales it; :mod:`precision_harness.dumps.statistics`).
- ``report REPORT_JSON``: a gate's ``report.json`` per scenario and stage: the worst tolerance ratio over its
  steps, whether it passed, the first failing item in execution order, and every judgement line.
- ``manifests GOLDEN_ROOT DEVICE [NAME ...]``: each ``<GOLDEN_ROOT>/<NAME>/<DEVICE>/manifest.json``'s accelerator
  stack (GPU model, drivers, CUDA torch, CUDA, cuDNN, deterministic algorithms, determinism variables).
- ``cost SCENARIO --device D --work DIR``: the scenario run without msprobe and at L0, L1 and ``auto``,
  each in a fresh worker: wall, wall per training step (the sum of ``run.json``'s step timings over the
  steps) and the size of its dump files.

Usage: python benchmarks/device_figures.py {diff,report,manifests,cost} ...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from precision_harness.dumps.rows import rms, tensors  # noqa: E402
from precision_harness.dumps.statistics import STATISTICS  # noqa: E402
from precision_harness.scenarios.profiling import LEVEL_KEY, STAGES  # noqa: E402

#: rows listed per differing dump
TOP = 5
#: the run.json keys of the accelerator stack a golden's manifest must carry
STACK_KEYS = (
    "gpu",
    "gpu_capability",
    "nvidia_driver",
    "cuda_driver",
    "torch",
    "cuda",
    "cudnn",
    "transformers",
    "mindstudio-probe",
    "deterministic_algorithms",
    "determinism_env",
)


def _moves(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[float, str]]:
    """``(relative move, "row statistic: a -> b")`` of every statistic that differs between two dump datas."""
    rows_b = dict(tensors(b))
    out = []
    for path, ta in tensors(a):
        tb = rows_b.get(path)
        if tb is None:
            out.append((math.inf, f"{path}: only in the first run"))
            continue
        row_rms = rms(tb.get("Norm"), tb.get("shape"))
        for stat in STATISTICS:
            x, y = ta.get(stat), tb.get(stat)
            if x == y:
                continue
            numbers = all(isinstance(v, (int, float)) for v in (x, y))
            scale = (row_rms if stat == "Mean" else abs(y)) if numbers else None
            rel = abs(x - y) / scale if scale else math.inf
            out.append((rel, f"{path} {stat}: {x!r} -> {y!r}"))
    return sorted(out, key=lambda m: -m[0])


def diff(run_a: Path, run_b: Path) -> list[str]:
    """Lines: per differing ``dump.json`` its moved rows; a last line counting identical files."""
    dumps = sorted(p.relative_to(run_a) for p in run_a.rglob("dump.json"))
    lines, same = [], 0
    for rel in dumps:
        other = run_b / rel
        if other.is_file() and other.read_bytes() == (run_a / rel).read_bytes():
            same += 1
            continue
        if not other.is_file():
            lines.append(f"{rel}: missing from {run_b}")
            continue
        moves = _moves(json.loads((run_a / rel).read_text())["data"], json.loads(other.read_text())["data"])
        rows = len({m[1].split(" ", 1)[0] for m in moves})
        worst = moves[0][0] if moves else 0.0
        lines.append(f"{rel}: bytes differ, {rows} rows moved, largest relative move {worst:.3g}")
        lines += [f"    {rel_move:.3g}  {text}" for rel_move, text in moves[:TOP]]
    lines.append(f"{same} of {len(dumps)} dump.json files byte-identical")
    return lines


def report(path: Path) -> list[str]:
    """Lines: per (scenario, stage) the worst ratio over its steps; the first failing item; the judgements."""
    doc = json.loads(path.read_text())
    order = {s: i for i, s in enumerate(STAGES)}
    worst: dict[tuple[str, str], list[Any]] = {}
    lines, failing = [], []
    for item in doc["items"]:
        if item["stage"] is None:
            if not item["passed"]:
                lines.append(f"{item['nodeid']}: failed ({item['kind']})")
            continue
        key = (item["scenario"], item["stage"])
        ratio = math.inf if item["worst_ratio"] is None and not item["passed"] else (item["worst_ratio"] or 0.0)
        cell = worst.setdefault(key, [0.0, True])
        cell[0], cell[1] = max(cell[0], ratio), cell[1] and item["passed"]
        if not item["passed"]:
            failing.append((item["scenario"], item["step"], order.get(item["stage"], len(order)), item["nodeid"]))
        if item.get("judgement"):
            j = item["judgement"]
            lines.append(f"{item['nodeid']}: judgement: {j['verdict']} at API {j['api']}: {j['reason']}")
    table = [
        f"{scenario:<28}{stage:<26}worst ratio {ratio:10.4g}  {'pass' if ok else 'FAIL'}"
        for (scenario, stage), (ratio, ok) in sorted(worst.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99)))
    ]
    summary = doc["summary"]
    head = [f"items {summary['items']}: passed {summary['passed']}, failed {summary['failed']}"]
    for scenario in sorted({f[0] for f in failing}):
        first = min(f for f in failing if f[0] == scenario)
        head.append(f"first failing item of {scenario}: {first[3]}")
    return head + table + lines


def manifests(root: Path, device: str, names: list[str]) -> list[str]:
    """Lines: per golden of ``device`` under ``root`` (of the scenarios ``names``; all when empty), the
    accelerator stack its manifest records."""
    lines = []
    for manifest in sorted(root.glob(f"*/{device}/manifest.json")):
        if names and manifest.parent.parent.name not in names:
            continue
        env = json.loads(manifest.read_text()).get("env", {})
        stack = ", ".join(f"{k}={env.get(k)}" for k in STACK_KEYS if k in env or device == "cuda")
        lines.append(f"{manifest.parent.parent.name}: {stack}")
    return lines or [f"no {device} golden under {root}"]


def cost(scenario_path: Path, device: str, work: Path) -> list[str]:
    """Lines: the scenario without msprobe and at L0, L1, auto: wall, wall per step, dump size."""
    from precision_harness.runs.kind_runners import run_scenario
    from precision_harness.runs.launch import RunOptions
    from precision_harness.scenarios.scenario import Scenario

    scenario = Scenario.load(scenario_path)
    lines = [f"{scenario.name} on {device}", f"{'level':<8}{'wall s':>9}{'s/step':>9}{'dump MB':>10}"]
    for level in ("none", "L0", "L1", "auto"):
        variant = scenario
        if level != "none":
            variant = scenario.with_overrides({LEVEL_KEY: level}, directory=work / "variants", tag=level)
        run = run_scenario(variant, out_dir=work / level, device=device, options=RunOptions(dump=level != "none"))
        stages = run.run_json["timings"]["stages"]
        steps = {k.split("/", 1)[0] for k in stages}
        per_step = sum(stages.values()) / max(len(steps), 1)
        size = sum(p.stat().st_size for p in run.run_dir.rglob("*.json") if p.parent.name.startswith("rank"))
        lines.append(f"{level:<8}{run.wall_s:9.2f}{per_step:9.3f}{size / 1e6:10.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("diff")
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p = sub.add_parser("report")
    p.add_argument("report_json", type=Path)
    p = sub.add_parser("manifests")
    p.add_argument("root", type=Path)
    p.add_argument("device")
    p.add_argument("names", nargs="*", help="scenario names (default: every golden of the device)")
    p = sub.add_parser("cost")
    p.add_argument("scenario", type=Path)
    p.add_argument("--device", default="cuda")
    p.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "diff":
        lines = diff(args.run_a, args.run_b)
    elif args.command == "report":
        lines = report(args.report_json)
    elif args.command == "manifests":
        lines = manifests(args.root, args.device, args.names)
    else:
        lines = cost(args.scenario, args.device, args.work)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
