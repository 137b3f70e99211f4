"""What pairing calls by alignment costs: the alignment at 10^5 calls a dump, and the gate's compare against a tree
that paired by name.

Usage (from the repository root, in the project's venv)::

    python benchmarks/alignment.py                              # the alignment alone
    python benchmarks/alignment.py --baseline /path/to/b9eb971  # and the compare, this tree against that checkout

Every dump is built from a committed L1 golden (``golden/grpo_tiny``, the real call mix; never random JSON):

- **Alignment at scale.** ``grpo_tiny``'s ``actor_update`` calls repeated (renumbered per API, as msprobe numbers
  them) to ``--calls`` calls; the run's copy has every RoPE ``Tensor.__matmul__`` replaced by a ``Tensor.__mul__``
  (transformers 5.23.0's change), so every later ``Tensor.__mul__`` is renamed. Printed: the time of
  ``pair_calls`` (best of ``--repeats``), its changed blocks, and its peak memory over a process that only
  loads the two dumps (``ru_maxrss`` of two child processes).
- **The compare, within one run.** Every stage dump of the committed goldens of ``scenarios/``, compared with
  ``compare_stage`` against a copy whose statistics moved by 1e-12 relative (the names are the golden's: the
  common failing-or-passing case) and against the upgrade-shaped copy (RoPE's matmul -> mul), in this tree and
  in ``--baseline`` (each tree in its own interpreter, arms alternating, best of ``--repeats``). Printed as
  ratios this tree / baseline.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE = ROOT / "golden" / "grpo_tiny" / "cpu"
ROPE = "Tensor.__matmul__"


def renumbered(entries: list[tuple[str, dict]]) -> dict:
    """A dump.json ``data`` of ``entries`` (``(api key, entry)``), each API renumbered as msprobe numbers calls."""
    from precision_harness.dumps.pairing import call_name

    counts: dict[str, int] = {}
    data = {}
    for api, entry in entries:
        name = call_name(api)
        head, direction = name.rsplit(".", 1)
        index = counts.get(name, 0)
        counts[name] = index + 1
        data[f"{head}.{index}.{direction}"] = entry
    return data


def upgraded(entries: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """``entries`` with RoPE's ``Tensor.__matmul__`` replaced by a ``Tensor.__mul__`` of transposed output."""
    out = []
    for api, entry in entries:
        if api.startswith(ROPE + "."):
            entry = copy.deepcopy(entry)
            for t in entry.get("output", []):
                t["shape"] = [t["shape"][0], t["shape"][2], t["shape"][1]]
            api = api.replace(ROPE, "Tensor.__mul__")
        out.append((api, entry))
    return out


def scaled_pair(calls: int) -> tuple[dict, dict]:
    """(run, golden) dumps of at least ``calls`` calls from grpo_tiny's actor_update (module docstring)."""
    from precision_harness.goldens.golden import Golden

    dump = Golden.from_dir(SOURCE).load_dump(1, "actor_update", "rank0")
    entries = list(dump["data"].items())
    repeats = -(-calls // len(entries))
    golden = {**dump, "data": renumbered(entries * repeats)}
    run = {**dump, "data": renumbered(upgraded(entries) * repeats)}
    return run, golden


def _child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(proc.stdout.strip().splitlines()[-1])


_ALIGN = """
import json, resource, sys, time
sys.path.insert(0, '.')
run, golden = (json.load(open(p)) for p in sys.argv[1:3])
best, blocks = float('inf'), 0
if sys.argv[3] == 'align':
    from precision_harness.dumps.pairing import pair_calls
    for _ in range(int(sys.argv[4])):
        t0 = time.perf_counter(); pairing = pair_calls(run, golden); best = min(best, time.perf_counter() - t0)
    blocks = len(pairing.blocks)
print(json.dumps({'s': best, 'blocks': blocks, 'rss_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def alignment(calls: int, repeats: int) -> None:
    run, golden = scaled_pair(calls)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / "run.json", Path(tmp) / "golden.json"]
        for path, dump in zip(paths, (run, golden), strict=True):
            path.write_text(json.dumps(dump))
        loaded = _child(_ALIGN, *map(str, paths), "load", "1")
        aligned = _child(_ALIGN, *map(str, paths), "align", str(repeats))
    extra = (aligned["rss_kb"] - loaded["rss_kb"]) / 1024
    print(
        f"alignment: {len(run['data'])} run calls against {len(golden['data'])} golden calls: "
        f"{aligned['s']:.3f} s (best of {repeats}), {aligned['blocks']} changed blocks, "
        f"peak memory {extra:+.1f} MB over loading the two dumps"
    )


_COMPARE = """
import json, sys, time
tree, listing, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
from pathlib import Path
from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.stage import DirStage
pairs = [(DirStage(Path(t)), DirStage(Path(g))) for t, g in json.load(open(listing))]
settings = CheckSettings(scenario='bench', policy=TolerancePolicy())
compare_stage(*pairs[0], settings)  # msprobe's parser imported outside the clock
best = float('inf')
for _ in range(repeats):
    t0 = time.perf_counter()
    for target, golden in pairs:
        compare_stage(target, golden, settings)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({'s': best}))
"""


def _write(stage_dir: Path, dump: dict) -> None:
    (stage_dir / "step0" / "rank0").mkdir(parents=True, exist_ok=True)
    (stage_dir / "step0" / "rank0" / "dump.json").write_text(json.dumps(dump))


def _moved(dump: dict) -> dict:
    """The dump with every float statistic moved by 1e-12 relative: other bytes, the same names."""
    moved = copy.deepcopy(dump)

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("Max", "Min", "Mean", "Norm") and isinstance(value, float):
                    node[key] = value * (1 + 1e-12)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(moved)
    return moved


def compare(baseline: Path, repeats: int) -> None:
    from precision_harness.goldens.golden import Golden

    with tempfile.TemporaryDirectory() as tmp:
        listings = {"same names": [], "upgrade-shaped": []}
        for manifest in sorted((ROOT / "golden").glob("*/cpu/manifest.json")):
            golden = Golden.from_dir(manifest.parent)
            for step, stage in sorted(golden.stages()):
                for rank in golden.stage(step, stage).ranks():
                    dump = golden.load_dump(step, stage, rank)
                    where = Path(tmp) / manifest.parent.parent.name / f"step_{step}" / stage / rank
                    _write(where / "golden", dump)
                    _write(where / "moved", _moved(dump))
                    _write(where / "upgrade", {**dump, "data": renumbered(upgraded(list(dump["data"].items())))})
                    listings["same names"].append((str(where / "moved"), str(where / "golden")))
                    listings["upgrade-shaped"].append((str(where / "upgrade"), str(where / "golden")))
        for name, pairs in listings.items():
            listing = Path(tmp) / f"{name}.json"
            listing.write_text(json.dumps(pairs))
            mine, theirs = float("inf"), float("inf")
            for _ in range(repeats):  # the arms alternate, so load drifts hit both
                mine = min(mine, _child(_COMPARE, str(ROOT), str(listing), "1")["s"])
                theirs = min(theirs, _child(_COMPARE, str(baseline), str(listing), "1")["s"])
            print(
                f"compare, {name} ({len(pairs)} stage dumps): this tree {mine:.2f} s, baseline {theirs:.2f} s, "
                f"ratio {mine / theirs:.3f} (best of {repeats})"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls a dump holds in the alignment benchmark")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a checkout that pairs calls by name (e.g. b9eb971)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    alignment(args.calls, args.repeats)
    if args.baseline is not None:
        compare(args.baseline.resolve(), args.repeats)
    print(f"benchmark wall: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
