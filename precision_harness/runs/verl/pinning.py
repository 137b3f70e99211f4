"""The gate's side of a verl run with pinned rollouts: the reward scored again in verl's trainer, or said not to be.

verl's rollout cache replays the recorded reward with the rollouts; :mod:`.rescore` (loaded by verl through
:data:`MODULE`) scores the loaded trajectories again with the scenario's reward function, under the verl it was
checked with. Imports neither torch nor verl (the pytest process builds the run's environment).
"""

from __future__ import annotations

from precision_harness.runs.verl.release import SUPPORTED_VERSIONS, installed_version

#: the module verl imports in each of its processes when rollouts are pinned (``VERL_USE_EXTERNAL_MODULES``)
MODULE = "precision_harness.runs.verl.rescore_pinned"


def gate_env(variables: dict[str, str], version: str | None = None) -> str:
    """For a run with pinned rollouts: add :data:`MODULE` to ``variables``' ``VERL_USE_EXTERNAL_MODULES`` under a
    verl it was checked with (``version``, default: the installed one), and return the run log's line saying what
    the check does with the reward. Under another verl the module is not loaded, and the line says the recorded
    rewards are replayed: an edit to the reward function is not seen."""
    version = installed_version() if version is None else version
    if version in SUPPORTED_VERSIONS:
        own = [m for m in variables.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != MODULE]
        variables["VERL_USE_EXTERNAL_MODULES"] = ",".join([*own, MODULE])
        return (
            "precision gate: rollouts pinned: verl's cache replays the recorded rewards; the gate scores the pinned "
            "responses again with the scenario's reward function (precision_harness/runs/verl/rescore.py)"
        )
    return (
        f"precision gate: rollouts pinned under verl {version}: its cache replays the recorded rewards, which the gate "
        f"scores again only under verl {', '.join(SUPPORTED_VERSIONS)}: an edit to the reward function is not seen"
    )
