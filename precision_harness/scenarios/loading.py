"""Loading a scenario file: YAML, the JSON Schema, the merge over defaults, the msprobe config, variants.

What :meth:`precision_harness.scenarios.scenario.Scenario.load` does before the kind's own checks,
as functions over the file's raw mapping. Every error is one line naming the file and the field.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from precision_harness.errors import ScenarioError, SchemaError
from precision_harness.paths import display_path
from precision_harness.scenarios.settings import canonical_json
from precision_harness.schemas import validate


def validate_schema(instance: Any, *, source: str | Path) -> None:
    """Validate against ``scenario.schema.json``; raise :class:`ScenarioError` naming the field."""
    try:
        validate(instance, "scenario", source=source)
    except SchemaError as exc:
        raise ScenarioError(str(exc)) from None


def read_yaml(path: Path) -> dict[str, Any]:
    """A scenario file's top-level mapping (``{}`` for an empty file).

    Raises:
        ScenarioError: unreadable file, malformed YAML (line and column), or not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario file: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}: malformed YAML: {where}{problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ScenarioError(
            f"{path}: expected a mapping of verl config keys at the top level, got {type(raw).__name__}"
        )
    return raw


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid over a deep copy of ``base``, mapping by mapping (a scenario file over its kind's defaults)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: a scenario name is one folder under golden/ and the artifacts folder: no separators, no leading dot
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def check_name(name: Any, *, source: str | Path, field_name: str = "name") -> str:
    """Return ``name`` if it is a safe folder name, else raise ScenarioError naming ``source`` and the field.

    ``.``, ``..``, a path separator or a leading dot would place the golden or the run outside
    ``golden/`` and the artifacts folder (or hide it).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ScenarioError(
            f"{source}: {field_name}: {name!r} is not a valid scenario name; expected letters, digits, '_', '-' "
            "and '.', not starting with '.' (it names the folders golden/<name>/ and <artifacts>/<name>/)"
        )
    return name


def load_msprobe_config(scenario_path: Path, config_path: str, raw: dict[str, Any]) -> dict[str, Any]:
    """Read an msprobe ``config.json``; inline keys in the scenario win over the file."""
    p = (scenario_path.parent / config_path).resolve()
    field_name = "global_profiler.global_tool_config.precision_debugger.config_path"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{scenario_path}: {field_name}: cannot read {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{scenario_path}: {field_name}: {p} is not valid JSON: {exc.msg} (line {exc.lineno})"
        ) from None
    if data.get("dump_path"):
        raise ScenarioError(f"{p}: dump_path: must not be set; the harness controls the dump path (as verl does)")
    task = data.get("task", "statistics")
    section = data.get(task, {}) if isinstance(data.get(task), dict) else {}
    merged = {"task": task, "level": data.get("level", "L1")}
    if "rank" in data:
        merged["rank"] = data["rank"]
    for key in ("scope", "list", "data_mode", "summary_mode"):
        if key in section:
            merged[key] = section[key]
    inline = raw.get("global_profiler", {}).get("global_tool_config", {}).get("precision_debugger", {})
    merged = {k: v for k, v in merged.items() if k not in inline}
    # re-validate the combined profiler section so a bad config.json value is reported too
    validate_schema({"global_profiler": {"global_tool_config": {"precision_debugger": merged}}}, source=p)
    return merged


def set_dotted(raw: dict[str, Any], dotted: str, value: Any, *, source: Path) -> None:
    """Set ``dotted`` (``"a.b.c"``) in ``raw``, making the mappings on the way.

    Raises:
        ScenarioError: a key on the way holds something other than a mapping (names ``source``).
    """
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ScenarioError(f"{display_path(source)}: {dotted}: {key} is not a mapping; cannot override")
    node[leaf] = value


def write_variant(source: Path, overrides: Mapping[str, Any], *, path: Path, name: str) -> Path:
    """Write ``source`` with ``overrides`` (``{"dotted.key": value}``) applied and named ``name`` to ``path``.

    A ``config_path`` stays the file the original names. The file is rewritten only when its text
    changes, and starts with a comment naming the original and the overrides.

    Raises:
        ScenarioError: an override crosses a key that is not a mapping.
    """
    raw = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    for dotted, value in overrides.items():
        set_dotted(raw, dotted, value, source=source)
    raw["name"] = name
    pd = raw.get("global_profiler", {}).get("global_tool_config", {}).get("precision_debugger", {})
    if pd.get("config_path"):  # keep it relative to the original scenario file
        pd["config_path"] = str((source.parent / pd["config_path"]).resolve())
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# variant of {display_path(source)}: {canonical_json(dict(overrides))}\n"
    text = header + yaml.safe_dump(raw, sort_keys=False)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path
