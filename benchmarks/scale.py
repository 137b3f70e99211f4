"""A compare at a real size: ``precision-harness compare`` over verl-layout trees of 60k, 240k and 3.1 M calls.

Usage (from the repository root, in the project's venv)::

    python benchmarks/scale.py --baseline /tmp/base-b9eb971          # 240k passing and 60k failing, both trees
    python benchmarks/scale.py --baseline /tmp/base-b9eb971 --7b     # and the 7B shape, this tree only

Every tree is built from a committed L1 golden (``golden/grpo_tiny/cpu``: the real call mix, never random
JSON): each (step, stage) dump's calls repeated and renumbered per API as msprobe numbers calls
(``alignment.renumbered``), cut to the shape's calls per rank, stage and step, and written for every rank
(the ranks of a stage share one file's content, hard-linked, so the 7B shape takes 2 GB of disk a tree, not
16). Three trees per shape: the golden, a passing run (every float statistic of a floating-point tensor
times ``1 + 5e-10`` or ``1 - 5e-10``, alternating) and a failing run (``1 +- 5e-4``). They are cached under
``--cache`` (default: the system's temp dir), keyed by the shape and the source golden's manifest.

Shapes (issue 38's targets, 2 cores):

- ``240k``: 4 ranks x 1 stage (actor_update) x 1 step x 60,000 calls, passing; target at most 0.1x b9eb971.
- ``60k``: 2 ranks x 1 stage x 1 step x 30,000 calls, failing; target at most 0.02x b9eb971.
- ``7b`` (``--7b``): 8 ranks x 3 stages x 2 steps x 65,000 calls = 3.12 M calls, passing and failing;
  targets within 90 s and 180 s, peak memory under 2 GB each. b9eb971 is not run there (hours).

Each compare is ``python -m precision_harness.cli compare RUN GOLDEN`` in its own interpreter, with its
tree's source first on ``PYTHONPATH`` (this checkout, or ``--baseline``), artifacts in a fresh folder. Each tree's
source is compiled to bytecode first (``compileall``), as an installed package is: where ``PYTHONDONTWRITEBYTECODE``
is set, every compare would otherwise compile its tree's 70 modules again (0.1-0.2 s here). Wall
time is the child's; peak memory is the largest sum of the resident sets of the child and its descendants
(its rank pool), sampled every 0.1 s with psutil. Printed: one line per compare, and the ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from alignment import renumbered  # noqa: E402

SOURCE = ROOT / "golden" / "grpo_tiny" / "cpu"
FACTORS = {"golden": 0.0, "passing": 5e-10, "failing": 5e-4}
STAGES_7B = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update")


@dataclass(frozen=True)
class Shape:
    """How a tree is laid out: ranks x stages x steps, ``calls`` per rank, stage and step."""

    name: str
    ranks: int
    stages: tuple[str, ...]
    steps: tuple[int, ...]
    calls: int

    @property
    def total(self) -> int:
        return self.ranks * len(self.stages) * len(self.steps) * self.calls


SHAPES = {
    "240k": Shape("240k", 4, ("actor_update",), (1,), 60_000),
    "60k": Shape("60k", 2, ("actor_update",), (1,), 30_000),
    "7b": Shape("7b", 8, STAGES_7B, (1, 2), 65_000),
}


def _perturbed(node, factor: float, count: list[int]) -> None:
    """Every float statistic of a floating-point tensor below ``node`` times ``1 +- factor``, alternating."""
    if isinstance(node, dict):
        floating = "float" in str(node.get("dtype", ""))
        for key, value in node.items():
            if floating and key in ("Max", "Min", "Mean", "Norm") and isinstance(value, float):
                count[0] += 1
                node[key] = value * (1 + factor if count[0] % 2 else 1 - factor)
            elif isinstance(value, (dict, list)):
                _perturbed(value, factor, count)
    elif isinstance(node, list):
        for value in node:
            _perturbed(value, factor, count)


def build(shape: Shape, cache: Path) -> dict[str, Path]:
    """``{"golden" | "passing" | "failing": tree}`` of ``shape``, built once into ``cache``; the golden is recorded
    as ``pytest --precision-golden update`` records one (:func:`_record`)."""
    from precision_harness.dumps.dump_index import INDEX, VERSION
    from precision_harness.goldens.golden import Golden

    recorded = f"recorded, {INDEX} {VERSION}".encode()
    key = hashlib.sha256(((SOURCE / "manifest.json").read_bytes()) + repr(shape).encode() + recorded).hexdigest()
    base = cache / f"precision-scale-{shape.name}-{key[:12]}"
    trees = {kind: base / kind for kind in FACTORS}
    trees["golden"] = base / "store" / "grpo_tiny" / "cpu"
    if (base / "done").is_file():
        return trees
    source = Golden.from_dir(SOURCE)
    for step in shape.steps:
        for stage in shape.stages:
            dump = source.load_dump(step, stage, "rank0")
            entries = list(dump["data"].items())
            data = dict(list(renumbered(entries * -(-shape.calls // len(entries))).items())[: shape.calls])
            for kind, factor in FACTORS.items():
                body = json.loads(json.dumps({**dump, "data": data}))
                if factor:
                    _perturbed(body["data"], factor, [0])
                _write_ranks(base / kind / f"step_{step}" / stage, json.dumps(body, indent=1), shape.ranks)
    _record(source, shape, base)
    shutil.rmtree(base / "golden")
    (base / "done").write_text("")
    return trees


def _record(source, shape: Shape, base: Path) -> None:
    """Record ``base/golden`` (a run's layout) into the golden store ``base/store`` as ``--precision-golden update``
    does (:meth:`GoldenStore.promote`: compressed payloads, each rank's ``dump.index``, the manifest), with the
    source golden's scenario, level and environment."""
    from precision_harness.goldens.store import GoldenStore
    from precision_harness.scenarios.scenario import Scenario

    run = {k: source.manifest[k] for k in ("scenario_hash", "level", "env", "numeric_settings")}
    run |= {"steps": list(shape.steps), "stages": list(shape.stages)}
    (base / "golden" / "run.json").write_text(json.dumps(run))
    scenario = Scenario.load(ROOT / "scenarios" / "grpo_tiny.yaml")
    GoldenStore(base / "store").promote(base / "golden", scenario, "cpu")


def _write_ranks(stage_dir: Path, text: str, ranks: int) -> None:
    first = stage_dir / "step0" / "rank0" / "dump.json"
    for rank in range(ranks):
        path = stage_dir / "step0" / f"rank{rank}" / "dump.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "construct.json").write_text("{}")
        if rank == 0:
            path.write_text(text)
        else:
            os.link(first, path)


def timed_compare(tree: Path, run: Path, golden: Path, artifacts: Path) -> dict:
    """Wall seconds, peak memory (MB, the process tree's resident sets) and exit code of one compare."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [
        sys.executable,
        "-m",
        "precision_harness.cli",
        "compare",
        str(run),
        str(golden),
        "--artifacts",
        str(artifacts),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    watched = psutil.Process(proc.pid)
    while proc.poll() is None:
        peak = max(peak, _tree_rss(watched))
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        raise SystemExit(f"compare in {tree} exited {proc.returncode}: {err.strip()[-2000:]}")
    return {"s": wall, "mb": peak / 2**20, "rc": proc.returncode}


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            total += p.memory_info().rss
    except psutil.Error:
        pass
    return total


def measure(shape: Shape, kind: str, trees: dict[str, Path], source: Path, scratch: Path) -> dict:
    artifacts = Path(tempfile.mkdtemp(dir=scratch))
    result = timed_compare(source, trees[kind], trees["golden"], artifacts)
    want = 0 if kind == "passing" else 1
    verdict = "as expected" if result["rc"] == want else f"UNEXPECTED exit {result['rc']}"
    print(
        f"{shape.name} {kind} ({shape.total:,} calls, {shape.ranks} ranks) [{source.name}]: "
        f"{result['s']:.1f} s, peak {result['mb']:.0f} MB, exit {result['rc']} {verdict}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of b9eb971 (git worktree add /tmp/base-b9eb971 b9eb971)"
    )
    parser.add_argument("--7b", dest="seven_b", action="store_true", help="also the 7B shape (3.1 M calls), this tree")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()), help="where the trees are kept")
    parser.add_argument("--only", choices=sorted(SHAPES), action="append", help="run only these shapes")
    parser.add_argument("--kind", choices=("passing", "failing"), action="append", help="run only these compares")
    args = parser.parse_args(argv)
    shapes = args.only or ["240k", "60k"] + (["7b"] if args.seven_b else [])
    plan = {"240k": ("passing",), "60k": ("failing",), "7b": ("passing", "failing")}
    for tree in [ROOT] + ([args.baseline.resolve()] if args.baseline is not None else []):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "precision_harness")], check=True)
    with tempfile.TemporaryDirectory() as scratch:
        for name in shapes:
            shape = SHAPES[name]
            t0 = time.perf_counter()
            trees = build(shape, args.cache)
            print(f"{name}: trees ready in {time.perf_counter() - t0:.1f} s under {trees['golden'].parent}", flush=True)
            for kind in [k for k in plan[name] if not args.kind or k in args.kind]:
                mine = measure(shape, kind, trees, ROOT, Path(scratch))
                if args.baseline is not None and name != "7b":
                    theirs = measure(shape, kind, trees, args.baseline.resolve(), Path(scratch))
                    print(
                        f"{name} {kind}: ratio this tree / baseline {mine['s'] / theirs['s']:.3f} wall, "
                        f"{mine['mb'] / theirs['mb']:.2f} peak memory",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
