"""Gate wall time with the ``rollout_generate`` stage on against off, printed as a ratio within one run.

``scenarios/grpo_bf16_rollout.yaml`` (stages ``rollout_generate, actor_compute_log_prob,
actor_update``) and the same scenario without ``rollout_generate`` are copied into a throwaway
project and recorded; then ``pytest scenarios/<x>.yaml`` checks each against its golden, alternating
which goes first, ``--repeat`` times. Printed: the gate's wall time on over off, and the run's own
rollout time (``generate_sequences`` in ``run.json``: sync, sampling and, when on, the dump) on over
off, the part the stage adds to. Each figure is the minimum over the repeats. Nothing is asserted:
this is a measurement, not a test.

Usage: python benchmarks/rollout_generate.py [--repeat N] [--scenario scenarios/x.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from pytest_timing import timed_pytest

REPO = Path(__file__).resolve().parent.parent
STAGE = "rollout_generate"


def _pytest(project: Path, *args: str) -> float:
    """Wall time of ``pytest ARGS`` in ``project``; exits on a failing run."""
    return timed_pytest(project, list(args), paths=[], env={}, expect=0, timeout=900)


def _rollout_seconds(project: Path, name: str) -> float:
    """The run's summed ``step_<n>/generate_sequences`` time, from the check run's ``run.json``."""
    run = json.loads((project / ".precision" / "artifacts" / name / "run" / "run.json").read_text())
    stages = run["timings"]["stages"]
    return sum(v for k, v in stages.items() if k.endswith("/generate_sequences"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "grpo_bf16_rollout.yaml")
    args = parser.parse_args()
    text = args.scenario.read_text(encoding="utf-8")
    if STAGE not in text:
        sys.exit(f"{args.scenario}: lists no {STAGE} stage")
    with tempfile.TemporaryDirectory(prefix="rollout_generate_bench_") as tmp:
        project = Path(tmp)
        (project / "scenarios").mkdir()
        (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        files = {"on": project / "scenarios" / "gen_on.yaml", "off": project / "scenarios" / "gen_off.yaml"}
        files["on"].write_text(text, encoding="utf-8")
        files["off"].write_text(text.replace(f"{STAGE}, ", "").replace(f"- {STAGE}\n", ""), encoding="utf-8")
        assert STAGE not in files["off"].read_text().split("stages:", 1)[1].split("\n", 1)[0]
        for path in files.values():
            _pytest(project, str(path.relative_to(project)), "--precision-golden", "update")
        times: dict[str, list[float]] = {"on": [], "off": []}
        rollout: dict[str, list[float]] = {"on": [], "off": []}
        for i in range(args.repeat):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for which in order:
                times[which].append(_pytest(project, str(files[which].relative_to(project))))
                rollout[which].append(_rollout_seconds(project, files[which].stem))
    on, off = min(times["on"]), min(times["off"])
    r_on, r_off = min(rollout["on"]), min(rollout["off"])
    print(f"scenario: {args.scenario.name} (min of {args.repeat})")
    print(f"gate check with {STAGE}:    {on:6.1f} s   (rollout {r_on:5.2f} s)")
    print(f"gate check without {STAGE}: {off:6.1f} s   (rollout {r_off:5.2f} s)")
    print(f"gate wall time on/off: {on / off:.2f}x; rollout time on/off: {r_on / r_off:.2f}x")


if __name__ == "__main__":
    main()
