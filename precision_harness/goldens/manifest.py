"""A golden's ``manifest.json`` (schema ``golden_manifest``): its layout constants, reading it, building it
from a finished run, and writing it.

The manifest records the scenario hash and identity, msprobe level, environment fingerprint,
numeric settings, per-stage statistics counts and, for every file, the sha256 and size of what is
stored and of its content (docs/goldens.md). :func:`read_manifest` is the one place a manifest is
read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from precision_harness.dumps import dump_index
from precision_harness.dumps.dump_index import index_name, indexable
from precision_harness.dumps.files import DUMP, METRICS, STAGE_OUTPUTS, load_dump, parse_dump, read_metrics
from precision_harness.dumps.rows import count_statistics
from precision_harness.dumps.sampled_tokens import SAMPLED_TOKENS
from precision_harness.errors import GoldenCorruptError, SchemaError
from precision_harness.goldens import golden_codec as codec
from precision_harness.paths import display_path, is_relative_inside
from precision_harness.scenarios import fresh_steps
from precision_harness.scenarios.profiling import LOCALIZE_LEVEL, ROLLOUT_GENERATE
from precision_harness.scenarios.scenario import Scenario
from precision_harness.schemas import validate

#: where an ``auto`` golden keeps its record at the localisation level (the run writes it there too)
LOCALIZE_DIR = LOCALIZE_LEVEL
#: Files of a run directory that a golden keeps (relative glob patterns).
GOLDEN_FILES = (
    "step_*/*/step0/rank*/dump.json",
    "step_*/*/step0/rank*/construct.json",
    f"step_*/*/step0/rank*/{STAGE_OUTPUTS}",  # level: auto, beside the L0 dump
    f"step_*/{ROLLOUT_GENERATE}/step0/rank*/{SAMPLED_TOKENS}",  # the tokens rollout_generate sampled
    METRICS,
    "rollouts/**/*",  # a verl scenario's pinned rollouts (skip.rollout_tq), loaded by check runs
    # level: auto: the same stages at the localisation level, for the rerun of a failing stage
    f"{LOCALIZE_DIR}/step_*/*/step0/rank*/dump.json",
    f"{LOCALIZE_DIR}/step_*/*/step0/rank*/construct.json",
)
MANIFEST = "manifest.json"
#: the manifest format :meth:`GoldenStore.promote` writes (1: plain payloads, 2: compressed)
FORMAT = 2


def read_manifest(manifest_path: Path) -> dict[str, Any]:
    """Parse and validate a golden's ``manifest.json``: the one place a manifest is read.

    Every file the manifest names (``files`` keys, ``metrics``) must be a relative path inside the
    golden, so no later read can leave it.

    Raises:
        GoldenCorruptError: unreadable JSON, a schema violation, or a path that is absolute or holds
            ``..`` (the message names the manifest and the field).
    """
    shown = display_path(manifest_path)
    try:
        manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GoldenCorruptError(f"{shown}: unreadable manifest ({exc})") from None
    try:
        validate(manifest, "golden_manifest", source=shown)
    except SchemaError as exc:
        raise GoldenCorruptError(str(exc)) from None
    named = [("files", rel) for rel in manifest["files"]] + [("metrics", manifest.get("metrics", METRICS))]
    for field_name, rel in named:
        if not is_relative_inside(rel):
            raise GoldenCorruptError(
                f"{shown}: {field_name}: {rel!r} is not a relative path inside the golden (absolute, or holds '..'); "
                "the golden is corrupt: restore it from git or re-record it"
            )
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any], *, validate_first: bool = True) -> None:
    """Write ``manifest.json`` pretty-printed (reviewable in a pull request), through a temporary file."""
    if validate_first:
        validate(manifest, "golden_manifest", source=display_path(path))
    tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def golden_files(root: Path) -> list[str]:
    """The files of a run directory (or any verl layout) that a golden keeps (:data:`GOLDEN_FILES`), sorted."""
    return sorted(
        {p.relative_to(root).as_posix() for pattern in GOLDEN_FILES for p in root.glob(pattern) if p.is_file()}
    )


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file (``run.json``), None where it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


#: msprobe writes ``task``, ``level``, ``framework`` and ``dump_data_dir`` before ``data``: the level is in the head
_LEVEL = re.compile(
    rb'^\s*\{\s*(?:"(?:task|framework|dump_data_dir)"\s*:\s*(?:"[^"\\]*"|null)\s*,\s*)*"level"\s*:\s*"([^"\\]*)"'
)


def dump_level(root: Path, files: list[str]) -> str | None:
    """The ``level`` msprobe wrote into the first dump.json of ``files``: read from its first kilobytes where the
    level comes before ``data`` (as msprobe writes it), else from the whole file parsed (a 7B rank's dump is
    50 MB). Raises GoldenCorruptError where that parse fails."""
    dump = next((rel for rel in files if rel.endswith("/dump.json")), None)
    if dump is None:
        return None
    try:
        with open(root / dump, "rb") as fh:
            head = _LEVEL.match(fh.read(4096))
    except OSError:
        head = None
    if head is not None:
        return head.group(1).decode("utf-8", "replace")
    # raw: the level is all that is read, and restoring a large dump's non-finite values costs more than its parse
    return load_dump(root / dump, raw=True).get("level")


def statistics_counts(contents: dict[str, bytes], prefix: str) -> dict[str, int]:
    """``{"step_<n>/<stage>": count}`` of the statistics the gate checks, every rank and stage_outputs.json included."""
    statistics: dict[str, int] = {}
    for name, content in contents.items():
        rest = name[len(prefix) :]
        if not name.startswith(prefix) or rest.count("/") != 4:
            continue
        if rest.endswith(f"/{DUMP}") or rest.endswith(f"/{STAGE_OUTPUTS}"):
            key = "/".join(rest.split("/")[:2])
            statistics[key] = statistics.get(key, 0) + count_statistics(parse_dump(content, shown=name))
    return statistics


def payloads(contents: dict[str, bytes]) -> tuple[dict[str, dict[str, Any]], dict[str, bytes]]:
    """The manifest ``files`` section and the stored bytes of compressed payloads, by stored name."""
    files, stored = {}, {}
    for name, content in sorted(contents.items()):
        data = codec.compress(content)
        stored[name + codec.SUFFIX] = data
        files[name + codec.SUFFIX] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "content_sha256": hashlib.sha256(content).hexdigest(),
            "content_bytes": len(content),
        }
    return files, stored


def indexes(contents: dict[str, bytes]) -> dict[str, bytes]:
    """The :mod:`~precision_harness.dumps.dump_index` of every dump.json of ``contents`` (a golden's files by content
    name) that has one: not beside a stage_outputs.json, and one the skeleton read takes. Equal dumps (the ranks of a
    stage often are) are indexed once.

    Raises:
        ProbeUnavailableError: msprobe (its row parser) is not installed and a dump needs it.
    """
    built: dict[str, bytes | None] = {}
    found = {}
    for name, content in contents.items():
        if not indexable(name, contents):
            continue
        digest = hashlib.sha256(content).hexdigest()
        if digest not in built:
            built[digest] = dump_index.build(content, shown=name)
        if built[digest] is not None:
            found[index_name(name)] = built[digest]
    return found


def recorded(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a golden records, whatever its storage and whether it lists its identity components:
    equal records mean an unchanged golden."""
    suffix = codec.SUFFIX if manifest.get("codec") == codec.CODEC else ""
    files = {k.removesuffix(suffix): v.get("content_sha256", v["sha256"]) for k, v in manifest["files"].items()}
    rest = {k: v for k, v in manifest.items() if k not in ("files", "format", "codec", "identity")}
    return {**rest, "files": files}


def fresh_rollouts(run_dir: Path) -> dict[str, dict[str, float]] | None:
    """The manifest's ``fresh_rollouts`` as a run logged them: step (as text) -> the mismatch metrics
    (:func:`~precision_harness.scenarios.fresh_steps.mismatch_values`) of each row of its
    :data:`~precision_harness.scenarios.fresh_steps.FRESH_METRICS`; None where the run wrote none (no fresh step).

    Raises:
        GoldenCorruptError: a line that is not a JSON object, or a step logged twice (:func:`read_metrics`).
    """
    path = Path(run_dir) / fresh_steps.FRESH_METRICS
    if not path.is_file():
        return None
    return {str(row["training/global_step"]): fresh_steps.mismatch_values(row) for row in read_metrics(path)}


def build_manifest(run_dir: Path, scenario: Scenario, device: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Manifest (format 2) for a finished run directory, and the stored bytes of its payloads.

    Raises:
        GoldenCorruptError: ``run_dir`` has no readable ``run.json`` (an unfinished run).
    """
    run_dir = Path(run_dir)
    run = read_json(run_dir / "run.json")
    if run is None:
        raise GoldenCorruptError(f"{run_dir / 'run.json'}: cannot promote an unfinished run (no readable run.json)")
    names = golden_files(run_dir)
    contents = {name: (run_dir / name).read_bytes() for name in names}
    files, stored = payloads({**contents, **indexes(contents)})
    manifest = {
        "format": FORMAT,
        "codec": codec.CODEC,
        "scenario": scenario.name,
        "scenario_hash": run["scenario_hash"],
        "device": device,
        "level": run["level"],
        "env": run["env"],
        "steps": run["steps"],
        "stages": run["stages"],
        "numeric_settings": run["numeric_settings"],
        "metrics": METRICS,
        "statistics": statistics_counts(contents, ""),
        "files": files,
    }
    if run["scenario_hash"] == scenario.hash:  # the identity describes the hash the run was made under
        manifest["identity"] = scenario.identity
    fresh = fresh_rollouts(run_dir)
    if fresh is not None:  # verl.fresh_steps: the recording's mismatch, the first observation of each bound
        manifest["fresh_rollouts"] = fresh
    if any(name.startswith(f"{LOCALIZE_DIR}/") for name in names):
        manifest["localize_statistics"] = statistics_counts(contents, f"{LOCALIZE_DIR}/")
    validate(manifest, "golden_manifest", source=run_dir / "run.json")
    return manifest, stored
