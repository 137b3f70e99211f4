"""Items that share a finding, said once: their count and a compact list of their names.

An upgrade usually moves every stage dump the same way: 74 failing items with one first divergence, or
one changed code path seen in every stage. report.md (a pull-request comment, capped by GitHub at 65,536
characters) names such a finding once, with the items it concerns in the compact form of
:func:`compact`; report.json and report.html keep every item's own record.

Records here are report.json's ``items`` (:meth:`~precision_harness.report.item_record.ItemRecord.to_json`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from precision_harness.scenarios.profiling import STAGES

#: the name of a scenario's metrics.jsonl item (its record's ``stage`` is None)
METRICS = "metrics"


def item_name(record: dict[str, Any]) -> str:
    """``"grpo_tiny actor_update[step_1]"``: the scenario and the pytest item's name (``"grpo_tiny metrics"``)."""
    stage, step = record["stage"], record["step"]
    name = METRICS if stage is None else (stage if step is None else f"{stage}[step_{step}]")
    return f"{record['scenario']} {name}"


def step_ranges(steps: Iterable[int]) -> str:
    """``"step_1..3, step_5"``: sorted steps, each run of consecutive ones as ``first..last``."""
    ordered = sorted(set(steps))
    runs: list[list[int]] = []
    for step in ordered:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"step_{r[0]}" if len(r) == 1 else f"step_{r[0]}..{r[-1]}" for r in runs)


def compact(records: Sequence[dict[str, Any]]) -> str:
    """The records' items in few characters, by scenario; the stages that share their steps in one pair of
    braces, in execution order (:data:`~precision_harness.scenarios.profiling.STAGES`), other items after:

        grpo_tiny {actor_update, critic_update}[step_1..2], ref_compute_log_prob[step_2], metrics; ppo_gae_tiny ...
    """
    by_scenario: dict[str, dict[str | None, set[int]]] = {}
    for r in records:
        steps = by_scenario.setdefault(r["scenario"], {}).setdefault(r["stage"], set())
        if r["step"] is not None:
            steps.add(r["step"])
    return "; ".join(f"{name} {_stages(stages)}" for name, stages in sorted(by_scenario.items()))


def _stages(stages: dict[str | None, set[int]]) -> str:
    """``{a, b}[step_1..2], c[step_1], metrics`` of one scenario's ``stage -> steps``."""
    order = {s: i for i, s in enumerate(STAGES)}
    shared: dict[str, list[str]] = {}
    plain = []
    for stage in sorted((s for s in stages if s is not None), key=lambda s: (order.get(s, len(order)), s)):
        if stages[stage]:
            shared.setdefault(step_ranges(stages[stage]), []).append(stage)
        else:
            plain.append(stage)
    parts = [
        (f"{{{', '.join(names)}}}" if len(names) > 1 else names[0]) + f"[{steps}]" for steps, names in shared.items()
    ]
    return ", ".join(parts + plain + ([METRICS] if None in stages else []))


def group_by(
    records: Iterable[dict[str, Any]], key: Callable[[dict[str, Any]], Hashable]
) -> list[list[dict[str, Any]]]:
    """``records`` in groups of equal ``key``, each in the records' order, the groups in order of first sight."""
    groups: dict[Hashable, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    return list(groups.values())


def counted(records: Sequence[dict[str, Any]]) -> str:
    """``"grpo_tiny actor_update[step_1]"`` for one record; ``"74 items: grpo_tiny {...}[step_1..2]; ..."`` else."""
    if len(records) == 1:
        return item_name(records[0])
    return f"{len(records)} items: {compact(records)}"
