"""Overhead of the gate, printed as ratios measured within one run (these machines are noisy).

For each scenario under scenarios/ (or the ones named on the command line):

- ``dump / no-dump``: worker wall time with msprobe collecting every profiled stage, over the same
  run without msprobe (msprobe's own cost);
- ``pytest check / dump``: a full ``pytest scenarios/<x>.yaml`` against the committed golden, over
  the dumped run alone (what the harness adds: pytest start-up, golden checks, compare);
- ``compare speed-up``: ``msprobe compare`` on the command line over our per-stage compare of the
  same two dump.json files, for the scenario's largest stage dump, with a perturbed target so the
  full compare runs (not the byte-identical fast path).

Section ``goldens`` (no scenario runs): for every committed golden, its stored and plain size, and
the time of the gate's compare path (``check.check_items`` over every item) against the compressed
golden and against the same golden stored plain (format 1), for a target identical to the golden
(the sha256 fast path) and for a target with every stage perturbed (the full compare).

Section ``levels``: ``benchmarks/scenarios/grpo_deep24.yaml`` (grpo_tiny at 24 layers) recorded at L1
and at ``auto`` in a throwaway project, then the wall time of ``pytest`` checking it at ``auto``
against ``L1``, once unchanged (passing) and once with ``PRECISION_TEST_PLANT=advantages`` (failing
from actor_update @ step_1; auto's time includes the L1 localisation rerun); and dump/no-dump for
L0, L1 and auto: the worker's wall time and its profiled stages' time over a run without msprobe.

Section ``shape``: ``benchmarks/scenarios/grpo_qwen2_05b.yaml`` (Qwen2-0.5B's layer shapes, one step) run
once each without msprobe and at L0, L1 and ``auto`` (fresh workers, one after another): the worker's
wall time, the step's time (its rollout and profiled stages, from run.json) and its profiled stages'
alone, each over the run without msprobe, the dump's size on disk (:data:`DUMP_FILES`) and its
dump.json calls. ``auto``'s L1 localisation rerun is not in it (it runs only for a failing stage: an
L1 run to that step). One run each: it takes minutes.

Section ``gate``: the full gate's wall time (``pytest scenarios precision_tests``) with warm workers
(``--precision-worker warm``, forked from a preloaded server) against a fresh interpreter per run.

Section ``kernels``: every scenario's run (msprobe on, fresh interpreter) with the portable CPU
kernels the goldens are recorded with (``trainer.cpu_kernels: portable``, the default) against
torch's own MKL/oneDNN kernels (``vendor``), interleaved scenario by scenario (after one discarded
warm-up run, alternating which goes first), summed: what CPU portability costs the gate's runs.

Each timing is the minimum of ``--repeat`` runs. Nothing is
asserted: this is a measurement, not a test.

Usage: python benchmarks/overhead.py [SCENARIO.yaml ...] [--repeat N]
       [--sections collection,goldens,levels,shape,gate,kernels]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from precision_harness.check.check_settings import CheckSettings  # noqa: E402
from precision_harness.check.compare.stage import compare_stage  # noqa: E402
from precision_harness.check.tolerance.policy import TolerancePolicy  # noqa: E402
from precision_harness.check.verdicts.items import check_items, items_of  # noqa: E402
from precision_harness.dumps.stage import DirStage  # noqa: E402
from precision_harness.goldens.golden import Golden  # noqa: E402
from precision_harness.goldens.manifest import MANIFEST  # noqa: E402
from precision_harness.goldens.store import GoldenStore  # noqa: E402
from precision_harness.runs.kind_runners import run_scenario  # noqa: E402
from precision_harness.runs.launch import RunOptions  # noqa: E402
from precision_harness.scenarios.profiling import LEVEL_KEY  # noqa: E402
from precision_harness.scenarios.scenario import Scenario  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pytest_wall(
    args: list[str], artifacts: Path, *, cwd: Path = REPO, env: dict[str, str] | None = None, expect: int = 0
) -> float:
    """Wall time of ``pytest ARGS`` in ``cwd``; exits if pytest's exit code is not ``expect``."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--precision-artifacts",
        str(artifacts),
        *args,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if proc.returncode != expect:
        raise SystemExit(f"pytest {' '.join(args)} exited {proc.returncode}, expected {expect}:\n{proc.stdout[-3000:]}")
    return wall


def perturbed_copy(stage_dir: Path, dest: Path) -> Path:
    """Copy a stage dir, scaling one Norm by 1e-3 so the compare cannot take the sha256 fast path."""
    shutil.copytree(stage_dir, dest)
    dump = next(dest.glob("step0/rank*/dump.json"))
    data = json.loads(dump.read_text())
    first = next(iter(data["data"].values()))
    for slot in first.get("output", []):
        if isinstance(slot, dict) and slot.get("Norm") is not None:
            slot["Norm"] *= 1.001
            break
    dump.write_text(json.dumps(data, indent=1))
    return dest


def msprobe_cli() -> str:
    """The ``msprobe`` console script of this interpreter's environment (the venv need not be active)."""
    beside = Path(sys.executable).parent / "msprobe"
    return str(beside) if beside.exists() else (shutil.which("msprobe") or "msprobe")


def plain_copy(golden: Golden, dest: Path) -> Golden:
    """The golden stored plain (format 1, as goldens were before compression), for comparing the two."""
    golden.export(dest)
    files = {n: {"sha256": golden.content_sha256(n), "bytes": (dest / n).stat().st_size} for n in golden.contents}
    manifest = {k: v for k, v in golden.manifest.items() if k != "codec"}
    (dest / MANIFEST).write_text(json.dumps({**manifest, "format": 1, "files": files}))
    return Golden.from_dir(dest)


def perturbed_run(golden: Golden, dest: Path) -> Path:
    """The golden's content as a run directory with every stage's first rank perturbed (no fast path)."""
    golden.export(dest)
    for step, stage in golden.stages():
        stage_dir = dest / f"step_{step}" / stage
        perturbed_copy(stage_dir, dest / "tmp_stage")
        shutil.rmtree(stage_dir)
        (dest / "tmp_stage").rename(stage_dir)
    return dest


def compare_all(target: Path, golden: Golden, artifacts: Path) -> None:
    """The gate's compare path over every item (msprobe's table/analysis only for failing stages)."""
    settings = CheckSettings(scenario=golden.scenario, policy=TolerancePolicy(), artifacts=None)
    for _ in check_items(target, golden, items_of(target, golden), settings):
        pass


def goldens_section(tmp: Path, repeat: int) -> None:
    """Stored vs plain size and compare time, compressed vs plain golden, for every committed golden."""
    store = GoldenStore(REPO / "golden")
    print(f"{'golden':<34}{'stored MB':>10}{'plain MB':>9}{'ratio':>7}  compare s (identical / drifted): zstd vs plain")
    totals = [0, 0, 0.0, 0.0, 0.0, 0.0]
    for name, device in store.list():
        golden = Golden.from_dir(store.path(name, device))
        plain = plain_copy(golden, tmp / "plain" / name)
        same, drifted = golden.export(tmp / "same" / name), perturbed_run(golden, tmp / "drifted" / name)
        times = [
            best(lambda g=g, t=t: compare_all(t, g, tmp / "art"), repeat)
            for t in (same, drifted)
            for g in (golden, plain)
        ]
        sizes = [golden.size_bytes, golden.content_bytes]
        totals = [a + b for a, b in zip(totals, sizes + times, strict=True)]
        print(
            f"{name + '/' + device:<34}{sizes[0] / 1e6:>10.2f}{sizes[1] / 1e6:>9.2f}{sizes[1] / sizes[0]:>6.1f}x"
            f"  {times[0]:.3f} vs {times[1]:.3f} / {times[2]:.3f} vs {times[3]:.3f}"
        )
    t = totals
    print(
        f"{'all goldens':<34}{t[0] / 1e6:>10.2f}{t[1] / 1e6:>9.2f}{t[1] / t[0]:>6.1f}x"
        f"  {t[2]:.3f} vs {t[3]:.3f} ({t[2] / t[3]:.2f}x) / {t[4]:.3f} vs {t[5]:.3f} ({t[4] / t[5]:.2f}x)"
    )


def measure(path: Path, tmp: Path, repeat: int) -> tuple:
    """One scenario's row: no-dump, dump and pytest check wall times, and compare speed on its largest stage."""
    scenario = Scenario.load(path)
    device = scenario.config["device"]
    nodump = best(
        lambda: run_scenario(scenario, out_dir=tmp / "nodump", device=device, options=RunOptions(dump=False)), repeat
    )
    dump = best(lambda: run_scenario(scenario, out_dir=tmp / "dump", device=device), repeat)
    check = best(lambda: pytest_wall([str(path.relative_to(REPO)), "--precision-jobs", "1"], tmp / "art"), repeat)
    # compare speed on the largest stage dump of step 1
    stage = max(
        scenario.stages,
        key=lambda s: next((tmp / "dump" / f"step_1/{s}").glob("step0/rank*/dump.json")).stat().st_size,
    )
    golden = Golden.from_dir(REPO / "golden" / scenario.name / device)
    golden_stage = golden.stage(1, stage).plain_dir(tmp / f"plain_{scenario.name}")
    target = perturbed_copy(tmp / "dump" / "step_1" / stage, tmp / f"perturbed_{scenario.name}")
    settings = CheckSettings(scenario=scenario.name, policy=TolerancePolicy())
    ours = best(
        lambda: compare_stage(DirStage(target, step=1, name=stage), DirStage(golden_stage, step=1), settings),
        repeat + 1,
    )
    cli_s = best(lambda: msprobe_compare(target, golden_stage, tmp), repeat)
    return scenario.name, nodump, dump, check, stage, ours, cli_s


def msprobe_compare(target: Path, golden_stage: Path, tmp: Path) -> None:
    """``msprobe compare`` (its CLI) on one rank's dump.json pair."""
    out = tmp / "cli_out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    tp, gp = next(target.glob("step0/rank*/dump.json")), next(golden_stage.glob("step0/rank*/dump.json"))
    cmd = [msprobe_cli(), "compare", "-tp", str(tp), "-gp", str(gp), "-o", str(out)]
    subprocess.run(cmd, capture_output=True, check=True, cwd=tmp)


def collection_section(paths: list[Path], tmp: Path, repeat: int) -> None:
    rows = [measure(path, tmp, repeat) for path in paths]
    print(
        f"{'scenario':<22}{'no-dump s':>10}{'dump s':>9}{'check s':>9}{'dump/no-dump':>14}{'check/dump':>12}"
        f"{'stage':>24}{'ours s':>8}{'CLI s':>8}{'speed-up':>10}"
    )
    for name, nodump, dump, check, stage, ours, cli_s in rows:
        print(
            f"{name:<22}{nodump:>10.2f}{dump:>9.2f}{check:>9.2f}{dump / nodump:>14.2f}{check / dump:>12.3f}"
            f"{stage:>24}{ours:>8.3f}{cli_s:>8.2f}{cli_s / ours:>9.1f}x"
        )


def gate_section(tmp: Path) -> None:
    """The full gate with warm workers against a fresh interpreter per run, back to back."""
    n_all = len(list((REPO / "scenarios").glob("*.yaml")))
    walls = {
        mode: pytest_wall(["scenarios", "precision_tests", "--precision-worker", mode], tmp / f"art_gate_{mode}")
        for mode in ("fresh", "warm")
    }
    print(
        f"gate (pytest scenarios precision_tests, all {n_all} scenarios): fresh {walls['fresh']:.1f} s, "
        f"warm {walls['warm']:.1f} s wall, warm/fresh {walls['warm'] / walls['fresh']:.2f}"
    )


def _kernels_variant(scenario: Scenario, kernels: str, tmp: Path) -> Scenario:
    return scenario.with_overrides({"trainer.cpu_kernels": kernels}, directory=tmp / "kernel_variants", tag=kernels)


def kernels_section(paths: list[Path], tmp: Path) -> None:
    """Each scenario's worker wall time with portable and with vendor CPU kernels, interleaved.

    One discarded run first warms the page cache; the order alternates from scenario to scenario,
    so neither side always runs first.
    """
    first = Scenario.load(paths[0])
    run_scenario(_kernels_variant(first, "vendor", tmp), out_dir=tmp / "k_warmup", device="cpu")
    totals = {"portable": 0.0, "vendor": 0.0}
    print(f"{'scenario':<28}{'portable s':>12}{'vendor s':>10}{'ratio':>8}")
    for i, path in enumerate(paths):
        scenario = Scenario.load(path)
        walls = {}
        for kernels in ("portable", "vendor")[:: 1 if i % 2 == 0 else -1]:
            run = run_scenario(
                _kernels_variant(scenario, kernels, tmp), out_dir=tmp / f"k_{scenario.name}_{kernels}", device="cpu"
            )
            walls[kernels] = run.wall_s
            totals[kernels] += run.wall_s
        print(
            f"{scenario.name:<28}{walls['portable']:>12.1f}{walls['vendor']:>10.1f}"
            f"{walls['portable'] / walls['vendor']:>8.2f}"
        )
    print(
        f"{'all scenarios':<28}{totals['portable']:>12.1f}{totals['vendor']:>10.1f}"
        f"{totals['portable'] / totals['vendor']:>8.2f}"
    )


DEEP = REPO / "benchmarks" / "scenarios" / "grpo_deep24.yaml"


def stage_seconds(run) -> float:
    """Seconds the run spent in its profiled stages (run.json timings), dump or not."""
    return sum(s for k, s in run.run_json["timings"]["stages"].items() if not k.endswith("/generate_sequences"))


def step_seconds(run) -> float:
    """Seconds the run spent in its steps: the rollout and every stage (run.json timings)."""
    return sum(run.run_json["timings"]["stages"].values())


#: what a dump is on disk: msprobe's files, and at ``level: auto`` the stage outputs beside them
DUMP_FILES = ("dump.json", "stack.json", "construct.json", "stage_outputs.json")


def dump_bytes(run_dir: Path) -> int:
    """Bytes on disk of the run's dumps (:data:`DUMP_FILES` under every ``step_*/<stage>/step0/rank*``)."""
    return sum(f.stat().st_size for f in run_dir.glob("step_*/*/step0/rank*/*") if f.name in DUMP_FILES)


QWEN2_05B = REPO / "benchmarks" / "scenarios" / "grpo_qwen2_05b.yaml"


def shape_section(tmp: Path) -> None:
    """Qwen2-0.5B's shapes, one step: wall, step time and dump size without msprobe and at L0, L1 and auto."""
    scenario = Scenario.load(QWEN2_05B)
    device = scenario.config["device"]
    steps = len(scenario.steps)
    rows = [
        ("no dump", run_scenario(scenario, out_dir=tmp / "sh_nodump", device=device, options=RunOptions(dump=False)))
    ]
    for level in ("L0", "L1", "auto"):
        variant = scenario.with_overrides({LEVEL_KEY: level}, directory=tmp / "sh_variants", tag=level)
        rows.append((level, run_scenario(variant, out_dir=tmp / f"sh_{level}", device=device)))
    step0, stages0 = step_seconds(rows[0][1]), stage_seconds(rows[0][1])
    print(f"{scenario.name}: {scenario.config['model']['num_hidden_layers']} layers, {steps} step(s), on {device}")
    print(
        f"{'level':<9}{'worker wall s':>14}{'step s':>8}{'x no dump':>10}{'profiled stages s':>19}{'x no dump':>10}"
        f"{'dump MB':>9}{'calls':>7}"
    )
    for level, run in rows:
        calls = sum(len(json.loads(f.read_text())["data"]) for f in run.run_dir.glob("step_*/*/step0/rank*/dump.json"))
        step, stages = step_seconds(run), stage_seconds(run)
        print(
            f"{level:<9}{run.wall_s:>14.1f}{step / steps:>8.1f}{step / step0:>9.2f}x{stages / steps:>19.1f}"
            f"{stages / stages0:>9.2f}x{dump_bytes(run.run_dir) / 1e6:>9.2f}{calls:>7}"
        )


def levels_section(tmp: Path) -> None:
    """The 24-layer scenario: check at auto against L1 (passing, failing), and dump/no-dump at L0, L1, auto."""
    project = tmp / "levels"
    (project / "scenarios").mkdir(parents=True)
    for level in ("L1", "auto"):
        text = DEEP.read_text().replace("level: auto", f"level: {level}")
        (project / "scenarios" / f"deep24_{level}.yaml").write_text(text)
    (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    art = project / ".precision"
    record = pytest_wall(["scenarios", "--precision-golden", "update"], art, cwd=project)
    walls = {}
    for level in ("L1", "auto"):
        path = f"scenarios/deep24_{level}.yaml"
        walls[level, "pass"] = pytest_wall([path], art, cwd=project)
        planted = {"PRECISION_TEST_PLANT": "advantages"}
        walls[level, "fail"] = pytest_wall([path], art, cwd=project, env=planted, expect=1)
    print(f"grpo_deep24 (24 layers), both goldens recorded in {record:.1f} s")
    for case in ("pass", "fail"):
        l1, auto = walls["L1", case], walls["auto", case]
        what = "passing" if case == "pass" else "failing (auto incl. L1 localisation)"
        print(f"  check {what:<38} L1 {l1:6.1f} s  auto {auto:6.1f} s  auto/L1 {auto / l1:.2f}")
    scenario = Scenario.load(project / "scenarios" / "deep24_auto.yaml")
    device = scenario.config["device"]
    base = run_scenario(scenario, out_dir=tmp / "lv_nodump", device=device, options=RunOptions(dump=False))
    print(f"  no-dump: wall {base.wall_s:.1f} s, stages {stage_seconds(base):.1f} s")
    for level in ("L0", "L1", "auto"):
        variant = scenario.with_overrides({LEVEL_KEY: level}, directory=project / "variants", tag=level)
        run = run_scenario(variant, out_dir=tmp / f"lv_{level}", device=device)
        print(
            f"  {level:<5} dump/no-dump: wall {run.wall_s:.1f} s ({run.wall_s / base.wall_s:.2f}x), "
            f"stages {stage_seconds(run):.1f} s ({stage_seconds(run) / stage_seconds(base):.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--sections",
        default="collection,goldens,levels,gate,kernels",
        help="comma list: collection, goldens, levels, shape, gate, kernels (shape: not by default, it takes minutes)",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    paths = [p.resolve() for p in args.scenarios] or sorted((REPO / "scenarios").glob("*.yaml"))
    tmp = Path(tempfile.mkdtemp(prefix="precision_bench_"))
    try:
        if "collection" in sections:
            collection_section(paths, tmp, args.repeat)
        if "goldens" in sections:
            goldens_section(tmp, args.repeat + 1)
        if "levels" in sections:
            levels_section(tmp)
        if "shape" in sections:
            shape_section(tmp)
        if "gate" in sections:
            gate_section(tmp)
        if "kernels" in sections:
            kernels_section(paths, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
