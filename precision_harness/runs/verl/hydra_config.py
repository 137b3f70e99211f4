"""verl's Hydra config, as ``main_ppo`` reads it: a value in Hydra's override grammar, a verl command line, and
verl's ``ppo_trainer`` config composed with overrides (the check a scenario's overrides get before any run)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from precision_harness.errors import ScenarioError
from precision_harness.runs.verl.release import VERL_FIX

ENTRYPOINT = ("-m", "verl.trainer.main_ppo")
_SIMPLE = re.compile(r"^[A-Za-z0-9_./:+-]+$")


def hydra_value(value: Any) -> str:
    """A Python value as Hydra's override grammar reads it (``True`` -> ``true``, lists as ``[a,b]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _SIMPLE.match(text) and text.lower() not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def argv(entrypoint: list[str] | None, overrides: dict[str, Any]) -> list[str]:
    """``python -m verl.trainer.main_ppo key=value ...`` (this interpreter unless ``entrypoint`` says otherwise)."""
    head = list(entrypoint) if entrypoint else [sys.executable, *ENTRYPOINT]
    return head + [f"{key}={hydra_value(value)}" for key, value in overrides.items()]


def config_dir() -> Path:
    """verl's own ``trainer/config`` folder, found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise ScenarioError(f"verl is not installed: {VERL_FIX}")
    return Path(spec.origin).parent / "trainer" / "config"


def compose(overrides: dict[str, Any], *, source: Path | str = "verl.overrides") -> Any:
    """Compose verl's ``ppo_trainer`` config with ``overrides`` through Hydra, as ``main_ppo`` does.

    Raises:
        ScenarioError: Hydra rejects an override (a key verl's config does not have, a bad value);
            the message is Hydra's first line, naming ``source``.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    items = [f"{key}={hydra_value(value)}" for key, value in overrides.items()]
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            return hydra_compose(config_name="ppo_trainer", overrides=items)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ScenarioError(f"{source}: {first}") from None
