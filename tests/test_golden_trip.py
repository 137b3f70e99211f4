"""A golden's trip through a check stays on the checking floor (issue 54, item 3): followed from ``check_items`` through
every call it is passed to, a failing stage's golden goes back up to a higher floor at most 4 times.

How it is followed: ``precision-harness compare`` of a committed golden against its own export with one statistic
moved (a failing stage: compare, msprobe's window, where the change entered), under ``sys.setprofile``. Each call of a
``precision_harness`` function given the :class:`Golden` or one of its :class:`GoldenStage` objects as an argument
(not as ``self``) is a stop, consecutive stops in one module merged; a climb is a stop on a higher floor than the one
before, the floors being pyproject.toml's layers contracts (check/'s phases inside check/'s floor). An item's trip
runs from its ``check_items`` stop to the next.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import tomllib
from harness_testing import export_golden

from precision_harness import cli
from precision_harness.goldens.golden import Golden, GoldenStage

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden" / "grpo_tiny" / "cpu"
STAGE = "step_1/actor_update"
#: the issue's bound on the climbs of one item's trip
MOST_CLIMBS = 4


def _floors() -> tuple[list[list[str]], list[list[str]]]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (top,) = [c["layers"] for c in contracts if c["type"] == "layers" and "containers" not in c]
    (check,) = [c["layers"] for c in contracts if c.get("containers") == ["precision_harness.check"]]
    split = lambda layers: [[m.strip(" ()") for m in layer.split(":")] for layer in layers]  # noqa: E731
    return split(top), split(check)


TOP, CHECK = _floors()


def floor(module: str) -> tuple[int, int]:
    """``(floor, phase)`` of a module: its layer in the top contract, and inside check/ its phase."""
    for i, layer in enumerate(TOP):
        for room in layer:
            if module == room or module.startswith(room + "."):
                if room != "precision_harness.check":
                    return i, 0
                part = module.split(".")[2] if module.count(".") >= 2 else ""
                return i, next(j for j, phase in enumerate(CHECK) if any(p.split(".")[-1] == part for p in phase))
    raise AssertionError(f"{module}: in no layer of pyproject.toml's contracts")


def _trip(target: Path, out: Path) -> list[str]:
    """The modules the golden stops in, in order, consecutive stops in one module merged."""
    stops: list[str] = []

    def follow(frame, event, arg) -> None:
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("precision_harness"):
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        given = any(n != "self" and isinstance(frame.f_locals.get(n), (Golden, GoldenStage)) for n in names)
        if given and (not stops or stops[-1] != module or code.co_name == "check_items"):
            stops.append(module if code.co_name != "check_items" else f"{module}:check_items")

    sys.setprofile(follow)
    try:
        assert cli.main(["compare", str(target), str(GOLDEN), "--artifacts", str(out)]) == 1
    finally:
        sys.setprofile(None)
    return stops


def _climbs(trip: list[str]) -> int:
    at = [floor(stop.split(":")[0]) for stop in trip]
    return sum(1 for before, after in itertools.pairwise(at) if after < before)


def test_a_failing_stages_golden_climbs_at_most_4_times(tmp_path: Path) -> None:
    target = export_golden(GOLDEN, tmp_path / "run")
    dump = target / STAGE / "step0" / "rank0" / "dump.json"
    data = json.loads(dump.read_text())
    (entry,) = [v for k, v in data["data"].items() if k == "Functional.linear.0.forward"]
    entry["output"][0]["Norm"] *= 1.001
    dump.write_text(json.dumps(data, indent=1))
    trip = _trip(target, tmp_path / "artifacts")
    items = [i for i, stop in enumerate(trip) if stop.endswith(":check_items")] + [len(trip)]
    trips = [trip[a:b] for a, b in itertools.pairwise(items)]
    failing = [t for t in trips if any("check.localize" in stop for stop in t)]
    assert len(failing) == 1, trips  # actor_update @ step_1 alone: its window and where its change entered
    assert {"precision_harness.check.compare.rank", "precision_harness.goldens.golden"} <= set(failing[0]), failing
    assert all(_climbs(t) <= MOST_CLIMBS for t in trips), [(_climbs(t), t) for t in trips]
