"""The verl CPU scenarios' cost to a user, as ratios measured within one run (these machines are noisy).

Compared, on the two-rank scenario ``grpo_dp2_bf16_cpu`` checked alone (``cd examples/verl_cpu && pytest
scenarios/grpo_dp2_bf16_cpu.yaml``, a fresh pytest each time, the wall time of the whole invocation):

- ``before``: the same check in a source tree of the commit before issue 31 (``--baseline``, e.g.
  ``git archive be718c3 | tar -x -C DIR``): L1, verl's own Ray per run, no profile;
- ``L1``: this tree at L1 (every cut, the scenario and its golden at L1: a throwaway copy of the example
  whose L1 golden this tree records first, untimed);
- ``auto``: this tree as committed (``level: auto``).

Sections (``--sections``, default all):

- ``check``: the passing check of each, and the start-up share of its wall time (``1 - steps / wall``, the
  steps from verl's ``timing_s/step``; this tree also prints its run's profile);
- ``failing``: the check with verl's advantage estimators planted (``PRECISION_TEST_PLANT=advantages``, each
  tree's tests/hooks): ``auto`` reruns ``actor_update`` to step 1 at L1 to localise it, ``L1`` and ``before``
  fail from their L1 dump;
- ``tests``: the verl part of ``make test`` (``tests/test_verl_*.py``, this tree's ``tests/test_shared_ray.py``)
  in this tree and in the baseline.

- ``tiny`` (``--tiny PATH``, a checkout of 04b106a): the issue's own pairing, ``grpo_tiny_cpu`` (one rank, fp32,
  rollouts pinned, the scenario the issue first measured at 121 s) checked alone in 04b106a (L1, verl's
  own Ray, 8 agent-loop and 8 reward workers) and in this tree at ``auto`` and at L1 (04b106a's scenario
  file in a throwaway copy of this tree's example, the gate-owned ``rollout.tensor_model_parallel_size``
  dropped; its golden recorded by this tree first, untimed).

Every tree runs with this
interpreter and its own source first on ``PYTHONPATH`` (the tree and its ``plugins/``), verl's processes
too. Runs alternate which tree goes first; each figure is the minimum of ``--repeat`` runs. Nothing is
asserted.

Usage: python benchmarks/verl_cpu.py --baseline /path/to/be718c3 [--tiny /path/to/04b106a] [--repeat N]
       [--sections check,failing,tests,tiny] (default check,failing; tiny needs --tiny)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from precision_harness.progress import profile_line  # noqa: E402

SCENARIO = "grpo_dp2_bf16_cpu"
RUN = Path(".precision") / "artifacts"


def _pytest(tree: Path, project: Path, *args: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall time (s) and output of ``pytest ARGS`` run in ``project`` on ``tree``'s source (``PYTHONPATH``, before
    ``env``'s own entries)."""
    shutil.rmtree(project / RUN.parent, ignore_errors=True)
    env = dict(env or {})
    path = [str(tree), str(tree / "plugins"), *filter(None, [env.pop("PYTHONPATH", "")])]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=project,
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return time.perf_counter() - t0, proc.stdout + proc.stderr


def _start_up_share(project: Path, scenario: str, wall: float) -> tuple[float, str]:
    """``1 - steps / wall`` of the scenario's run (verl's timing_s/step from its log), and its profile line."""
    run = project / RUN / scenario / "run"
    log = (run / "worker.log").read_text(errors="replace") if (run / "worker.log").is_file() else ""
    steps = {int(s): float(t) for s, t in re.findall(r"step:(\d+) - .*?timing_s/step:([0-9.]+)", log)}
    manifest = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    profile = manifest.get("timings", {}).get("profile")
    return 1 - sum(steps.values()) / wall, profile_line(profile) if profile else ""


def _passed(out: str) -> bool:
    """pytest's last line says passed, and nothing failed or errored."""
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return " passed" in last and not re.search(r"\b\d+ (failed|errors?)\b", last)


def _example_copy(project: Path) -> Path:
    """A throwaway copy of this tree's example, without its goldens and artifacts."""
    shutil.copytree(REPO / "examples" / "verl_cpu", project, ignore=shutil.ignore_patterns("golden", ".precision"))
    return project


def _recorded(project: Path, scenario: str) -> Path:
    """``project`` once this tree has recorded ``scenario``'s golden there (untimed); exits if recording fails."""
    _, out = _pytest(REPO, project, f"scenarios/{scenario}.yaml", "--precision-golden", "update")
    if not _passed(out):
        sys.exit(f"recording {scenario}'s golden in {project} failed:\n{out[-3000:]}")
    return project


@functools.cache
def _l1_project(tmp: Path) -> Path:
    """This tree's example at L1, its L1 golden of the scenario recorded by this tree (untimed)."""
    project = _example_copy(tmp / "verl_cpu_l1")
    for path in (project / "scenarios").glob("*.yaml"):
        path.write_text(path.read_text().replace("level: auto", "level: L1"))
    return _recorded(project, SCENARIO)


def _baseline(args: argparse.Namespace) -> Path:
    if not args.baseline:
        sys.exit("the check, failing and tests sections need --baseline PATH (a source tree of be718c3)")
    return args.baseline


def _trees(args: argparse.Namespace, tmp: Path) -> dict[str, tuple[Path, Path]]:
    """``{name: (tree, project)}`` of the three checks."""
    baseline = _baseline(args)
    return {
        "before": (baseline, baseline / "examples" / "verl_cpu"),
        "L1": (REPO, _l1_project(tmp)),
        "auto": (REPO, REPO / "examples" / "verl_cpu"),
    }


def _alternating(names: list[str], repeat: int, run) -> dict[str, list]:
    results: dict[str, list] = {n: [] for n in names}
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            results[name].append(run(name))
    return results


TINY = "grpo_tiny_cpu"


def _tiny_project(tmp: Path, old_tree: Path, level: str) -> Path:
    """This tree's example with 04b106a's ``grpo_tiny_cpu`` at ``level``, its golden recorded by this tree (untimed)."""
    project = _example_copy(tmp / f"verl_cpu_tiny_{level}")
    for path in (project / "scenarios").glob("*.yaml"):
        path.unlink()
    text = (old_tree / "examples" / "verl_cpu" / "scenarios" / f"{TINY}.yaml").read_text()
    lines = [ln for ln in text.splitlines() if "rollout.tensor_model_parallel_size" not in ln]
    (project / "scenarios" / f"{TINY}.yaml").write_text("\n".join(lines).replace("level: L1", f"level: {level}") + "\n")
    return _recorded(project, TINY)


def _check_once(name: str, tree: Path, project: Path, scenario: str, *extra: str) -> tuple[float, float, str]:
    wall, out = _pytest(tree, project, f"scenarios/{scenario}.yaml", *extra)
    if not _passed(out):
        sys.exit(f"{name}: the check did not pass:\n{out[-3000:]}")
    share, line = _start_up_share(project, scenario, wall)
    print(f"[bench] check {name}: {wall:.1f} s, start-up share {share:.2f} {line}", flush=True)
    return wall, share, line


def tiny(args: argparse.Namespace, tmp: Path) -> None:
    if not args.tiny:
        sys.exit("the tiny section needs --tiny PATH (a source tree of 04b106a)")
    # 04b106a's example had no pytest.ini: its tests named the golden folder (and kept the default timeout)
    old = (args.tiny / "examples" / "verl_cpu").resolve()
    trees = {
        "04b106a": (args.tiny, old, "-o", f"precision_golden_dir={old / 'golden'}"),
        "this tree, L1": (REPO, _tiny_project(tmp, args.tiny, "L1")),
        "this tree, auto": (REPO, _tiny_project(tmp, args.tiny, "auto")),
    }

    def run(name: str) -> tuple[float, float, str]:
        tree, project, *extra = trees[name]
        return _check_once(name, tree, project, TINY, *extra)

    results = _alternating(list(trees), args.repeat, run)
    best = {n: min(r[0] for r in rs) for n, rs in results.items()}
    print(f"passing check of {TINY} alone (min of {args.repeat}):")
    for name, wall in best.items():
        print(f"  {name:<16} {wall:6.1f} s  start-up share {min(r[1] for r in results[name]):.2f}")
    print(
        f"  auto / 04b106a {best['this tree, auto'] / best['04b106a']:.2f}   "
        f"L1 / 04b106a {best['this tree, L1'] / best['04b106a']:.2f}"
    )


def check(args: argparse.Namespace, tmp: Path) -> None:
    trees = _trees(args, tmp)

    def run(name: str) -> tuple[float, float, str]:
        tree, project = trees[name]
        return _check_once(name, tree, project, SCENARIO)

    results = _alternating(list(trees), args.repeat, run)
    best = {n: min(r[0] for r in rs) for n, rs in results.items()}
    print(f"passing check of {SCENARIO} alone (min of {args.repeat}):")
    for name, wall in best.items():
        share = min(r[1] for r in results[name])
        print(f"  {name:<24} {wall:6.1f} s  start-up share {share:.2f}")
    print(
        f"  auto / before {best['auto'] / best['before']:.2f}   L1 / before {best['L1'] / best['before']:.2f}   "
        f"auto / L1 {best['auto'] / best['L1']:.2f}"
    )


def failing(args: argparse.Namespace, tmp: Path) -> None:
    trees = _trees(args, tmp)

    def run(name: str) -> float:
        tree, project = trees[name]
        env = {"PYTHONPATH": str(tree / "tests" / "hooks"), "PRECISION_TEST_PLANT": "advantages"}
        wall, out = _pytest(tree, project, f"scenarios/{SCENARIO}.yaml", "-k", "step_1", env=env)
        localized = re.search(r"localized at L1 \(rerun to step_1, ([0-9.]+) s\)", out)
        caught = "FAILED scenarios/grpo_dp2_bf16_cpu.yaml::actor_update[step_1]" in out
        note = f", localised in {localized.group(1)} s" if localized else ""
        print(f"[bench] failing {name}: {wall:.1f} s (actor_update[step_1] caught: {caught}{note})", flush=True)
        return wall

    best = {n: min(rs) for n, rs in _alternating(list(trees), args.repeat, run).items()}
    print(f"failing check (advantages planted, items of step 1; min of {args.repeat}):")
    for name, wall in best.items():
        print(f"  {name:<8} {wall:6.1f} s")
    print(f"  auto / before {best['auto'] / best['before']:.2f}   auto / L1 {best['auto'] / best['L1']:.2f}")


def tests(args: argparse.Namespace, tmp: Path) -> None:
    baseline = _baseline(args)

    def run(name: str) -> float:
        tree = REPO if name == "this tree" else baseline
        files = sorted(str(p.relative_to(tree)) for p in (tree / "tests").glob("test_verl_*.py"))
        files += ["tests/test_shared_ray.py"] if name == "this tree" else []
        wall, out = _pytest(tree, tree, *files, "-q")
        print(f"[bench] verl tests {name}: {wall:.1f} s: {out.strip().splitlines()[-1]}", flush=True)
        return wall

    best = {n: min(rs) for n, rs in _alternating(["before", "this tree"], args.repeat, run).items()}
    print(
        f"the verl part of make test: before {best['before']:.0f} s, this tree {best['this tree']:.0f} s: "
        f"{best['this tree'] / best['before']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a source tree of be718c3 (check, failing, tests)")
    parser.add_argument("--tiny", type=Path, help="a source tree of 04b106a (grpo_tiny_cpu)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sections", default="check,failing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verl-bench-") as tmp:
        for section in args.sections.split(","):
            {"check": check, "failing": failing, "tests": tests, "tiny": tiny}[section](args, Path(tmp))


if __name__ == "__main__":
    main()
