"""GoldenStore: recorded runs under ``golden/<scenario>/<device>/``, in verl's dump layout, compressed.

A golden holds, per profiled (step, stage, rank), msprobe's ``dump.json`` and ``construct.json``
(``stack.json`` is dropped: it holds machine paths), the run's ``metrics.jsonl``, and a
``manifest.json`` (schema ``golden_manifest``) with the scenario hash, msprobe level, environment
fingerprint, numeric settings, per-stage statistics counts and, for every file, the sha256 and size
of what is stored and of its content.

Format 2 (written since goldens are compressed) stores each payload as ``<name>.zst``
(:mod:`precision_harness.goldens.golden_codec`); format 1 stores it plain and stays readable, so a
repository that has not run ``precision-harness golden migrate`` keeps passing. Either way the
gate reads a golden's payloads through :class:`Golden`, verified against the manifest: compare,
churn and calibration get a stage as a :class:`GoldenStage` (a
:class:`~precision_harness.dumps.stage.StageSource`) and never open golden files themselves. The
manifest stays plain, pretty-printed JSON for review.

Writes are atomic: :meth:`GoldenStore.promote` and :meth:`GoldenStore.migrate` build the new golden
in a sibling temporary folder, then swap it in with two renames under a file lock; a failure at any
point leaves the previous golden in place (a crash between the renames is rolled back on the next
access).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from filelock import FileLock

from precision_harness.dumps.files import (
    DUMP,
    METRICS,
    STAGE_OUTPUTS,
    load_dump,
    merged,
    parse_dump,
    parse_metrics,
    rank_digest,
    sha256_file,
)
from precision_harness.dumps.rows import count_statistics, tensors
from precision_harness.dumps.sampled_tokens import SAMPLED_TOKENS
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.errors import (
    GoldenCorruptError,
    GoldenError,
    GoldenMissingError,
    GoldenStaleError,
    SchemaError,
)
from precision_harness.goldens import golden_codec as codec
from precision_harness.paths import display_path, is_relative_inside, join_inside
from precision_harness.scenarios import identity
from precision_harness.scenarios.profiling import AUTO, LOCALIZE_LEVEL, ROLLOUT_GENERATE
from precision_harness.scenarios.scenario import Scenario
from precision_harness.schemas import validate

#: dtype -> largest finite value; a Mean/Norm of +-inf next to a Max/Min at half of it is the
#: overflow of an attention-mask constant (``finfo.min``), not a bad number.
_FINITE_MAX = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}

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


def update_command(scenario: Scenario, mode: str = "update") -> str:
    return f"pytest {display_path(scenario.path)} --precision-golden {mode}"


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


@dataclass(frozen=True)
class Golden:
    """A golden on disk: a verl-layout directory and its manifest (``sha256`` of every file).

    Build one with :meth:`from_dir` (a recorded golden, validated) or :meth:`from_run_dir` (any
    verl-layout directory, e.g. another run or verl's ``outputs/profile``, hashed as it is now).
    Files are named by their *content* name (``step_1/actor_update/step0/rank0/dump.json``); where
    the golden is compressed, the stored file is that name plus ``.zst``.
    """

    path: Path
    manifest: dict[str, Any]

    @classmethod
    def from_dir(cls, path: Path) -> Golden:
        """The recorded golden at ``path`` (``manifest.json`` read and validated by :func:`read_manifest`).

        Raises:
            GoldenMissingError: ``path`` has no manifest.
            GoldenCorruptError: the manifest is unreadable, invalid or names a path outside the golden.
        """
        path = Path(path)
        if not (path / MANIFEST).is_file():
            raise GoldenMissingError(f"{display_path(path)}/: no {MANIFEST}; not a recorded golden")
        return cls(path=path, manifest=read_manifest(path / MANIFEST))

    @classmethod
    def from_run_dir(cls, path: Path) -> Golden:
        """Any verl-layout directory as a golden: every file of :data:`GOLDEN_FILES` hashed now.

        ``run.json`` (written by our runner) supplies scenario, device and level where present;
        otherwise the scenario is the folder name and the level is read from the first dump.json.
        """
        path = Path(path)
        run = _read_json(path / "run.json") or {}
        files = sorted(
            {p.relative_to(path).as_posix() for pattern in GOLDEN_FILES for p in path.glob(pattern) if p.is_file()}
        )
        manifest = {
            "format": 1,
            "scenario": run.get("scenario", path.resolve().name),
            "device": run.get("device"),
            "level": run.get("level") or _dump_level(path, files),
            "numeric_settings": run.get("numeric_settings"),
            "env": run.get("env"),
            "metrics": METRICS,
            "files": {rel: {"sha256": sha256_file(path / rel), "bytes": (path / rel).stat().st_size} for rel in files},
        }
        return cls(path=path, manifest=manifest)

    # ------------------------------------------------------------------------------- manifest
    @property
    def scenario(self) -> str:
        return self.manifest["scenario"]

    @property
    def device(self) -> str | None:
        return self.manifest.get("device")

    @property
    def env(self) -> dict[str, Any] | None:
        """The recording run's environment (runner.devices.fingerprint), None for a directory without run.json."""
        return self.manifest.get("env")

    @property
    def level(self) -> str | None:
        """msprobe dump level (``L0``, ``L1``, ``mix``); None where no dump says."""
        return self.manifest.get("level")

    @property
    def numeric_settings(self) -> dict[str, Any] | None:
        return self.manifest.get("numeric_settings")

    @property
    def noise(self) -> dict[str, Any] | None:
        """Calibrated rerun noise (``precision-harness calibrate``), or None."""
        return self.manifest.get("noise")

    @property
    def compressed(self) -> bool:
        return self.manifest.get("codec") == codec.CODEC

    @property
    def size_bytes(self) -> int:
        """Bytes stored on disk (payloads; the manifest not counted)."""
        return sum(meta["bytes"] for meta in self.manifest["files"].values())

    @property
    def content_bytes(self) -> int:
        """Bytes of the plain payloads (what an export writes)."""
        return sum(meta.get("content_bytes", meta["bytes"]) for meta in self.manifest["files"].values())

    @cached_property
    def contents(self) -> dict[str, str]:
        """content name -> stored name, for every file of the golden."""
        suffix = codec.SUFFIX if self.compressed else ""
        return {stored.removesuffix(suffix): stored for stored in self.manifest["files"]}

    def content_sha256(self, name: str) -> str:
        meta = self.manifest["files"][self.contents[name]]
        return meta.get("content_sha256", meta["sha256"])

    # ---------------------------------------------------------------------------------- stages
    def stage_dir(self, step: int, stage: str) -> Path:
        return self.path / f"step_{step}" / stage

    def digests(self, step: int, stage: str) -> dict[str, str]:
        """``{"rank0": digest, ...}``: each rank's :func:`~precision_harness.dumps.files.rank_digest`
        (its dump.json content sha256, joined with its stage_outputs.json's where it has one).

        A run's rank with the same digest is identical to the golden: no decompression needed.
        """
        prefix = f"step_{step}/{stage}/step0/"
        digests = {}
        for name in self.contents:
            if name.startswith(prefix) and name.endswith("/dump.json"):
                rank_dir = name.removesuffix("/dump.json")
                extra = f"{rank_dir}/{STAGE_OUTPUTS}"
                outputs = self.content_sha256(extra) if extra in self.contents else None
                digests[rank_dir[len(prefix) :]] = rank_digest(self.content_sha256(name), outputs)
        return digests

    def statistics(self, step: int, stage: str) -> int | None:
        return self.manifest.get("statistics", {}).get(f"step_{step}/{stage}")

    def has_stage(self, step: int, stage: str) -> bool:
        return bool(self.digests(step, stage))

    def stages(self) -> set[tuple[int, str]]:
        """Every ``(step, stage)`` with a dump.json in the golden."""
        found = set()
        for name in self.contents:
            parts = name.split("/")
            if len(parts) == 5 and name.endswith("/dump.json") and parts[0][5:].isdigit():
                found.add((int(parts[0][5:]), parts[1]))
        return found

    def stage(self, step: int, stage: str) -> GoldenStage:
        """The stage as the compare reads it (a :class:`~precision_harness.dumps.stage.StageSource`)."""
        return GoldenStage(self, step, stage)

    def verify_stage(self, step: int, stage: str) -> None:
        """Check every rank's stored dump.json (and stage_outputs.json) against the manifest (:meth:`verify_file`)."""
        for rank in self.digests(step, stage):
            for file in (DUMP, STAGE_OUTPUTS):
                name = f"step_{step}/{stage}/step0/{rank}/{file}"
                if name in self.contents:
                    self.verify_file(self.contents[name])

    @property
    def localizes(self) -> bool:
        """True for a ``level: auto`` golden that holds its record at the localisation level."""
        return self.level == AUTO and any(name.startswith(f"{LOCALIZE_DIR}/") for name in self.contents)

    def localization(self) -> Golden:
        """The golden's record at the localisation level (``L1/`` inside it), as a golden of its own.

        Raises:
            GoldenMissingError: not a ``level: auto`` golden with that record.
        """
        if not self.localizes:
            raise GoldenMissingError(
                f"{display_path(self.path)}: no {LOCALIZE_LEVEL} record (not a level: auto golden)"
            )
        prefix = f"{LOCALIZE_DIR}/"
        files = {k[len(prefix) :]: v for k, v in self.manifest["files"].items() if k.startswith(prefix)}
        manifest = {
            **self.manifest,
            "level": LOCALIZE_LEVEL,
            "files": files,
            "statistics": self.manifest.get("localize_statistics", {}),
        }
        return Golden(path=self.path / LOCALIZE_DIR, manifest=manifest)

    # ---------------------------------------------------------------------------------- reading
    def has_metrics(self) -> bool:
        return self.manifest.get("metrics", METRICS) in self.contents

    def metrics(self) -> list[dict[str, Any]]:
        """The recorded ``metrics.jsonl`` rows, verified.

        Raises:
            GoldenCorruptError: the file is missing, corrupt or not JSON lines.
        """
        name = self.manifest.get("metrics", METRICS)
        return parse_metrics(self.read(name), shown=display_path(self.path / self.contents.get(name, name)))

    def load_dump(self, step: int, stage: str, rank: str) -> dict[str, Any]:
        """One rank's parsed dump.json, its stage_outputs.json merged in where it has one.

        Raises:
            GoldenCorruptError: missing, edited or corrupt.
        """
        rank_dir = f"step_{step}/{stage}/step0/{rank}"
        dump = self._parse(f"{rank_dir}/dump.json")
        extra = f"{rank_dir}/{STAGE_OUTPUTS}"
        return merged(dump, self._parse(extra) if extra in self.contents else None)

    def _parse(self, name: str) -> dict[str, Any]:
        return parse_dump(self.read(name), shown=display_path(self.path / self.contents.get(name, name)))

    def read(self, name: str) -> bytes:
        """The content of file ``name`` (its content name), checked against both recorded digests.

        Raises:
            GoldenCorruptError: not listed, missing, stored bytes or content differ from the
                manifest, or a corrupt, truncated or oversized compressed payload.
        """
        stored = self.contents.get(name)
        if stored is None:
            raise GoldenCorruptError(
                f"{display_path(self.path / name)}: not listed in {display_path(self.path / MANIFEST)}"
            )
        data = self._verified_bytes(stored)
        if not self.compressed:
            return data
        meta, shown = self.manifest["files"][stored], display_path(self.path / stored)
        content = codec.decompress(data, content_bytes=meta["content_bytes"], shown=shown)
        if hashlib.sha256(content).hexdigest() != meta["content_sha256"]:
            raise GoldenCorruptError(
                f"{shown}: content sha256 differs from {MANIFEST}; restore it from git or re-record the golden"
            )
        return content

    def export(self, out: Path, names: list[str] | None = None) -> Path:
        """Write the golden's payloads (or ``names``) as plain files under ``out``, verl's layout; return ``out``.

        The result opens in every msprobe tool. Raises GoldenCorruptError as :meth:`read`.
        """
        out = Path(out)
        for name in sorted(self.contents) if names is None else names:
            dest = out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self.read(name))
        return out

    def verify_file(self, stored: str) -> Path:
        """Return ``path/stored`` after checking the stored file against the manifest's sha256.

        Raises:
            GoldenCorruptError: the file is not listed, is missing, or its digest differs.
        """
        self._verified_bytes(stored)
        return self.path / stored

    def _verified_bytes(self, stored: str) -> bytes:
        meta = self.manifest["files"].get(stored)
        target = self.path / stored
        if meta is None:
            raise GoldenCorruptError(f"{display_path(target)}: not listed in {display_path(self.path / MANIFEST)}")
        try:
            data = target.read_bytes()
        except OSError:
            raise GoldenCorruptError(
                f"{display_path(target)}: listed in {MANIFEST} but missing; re-record the golden"
            ) from None
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            lfs = " (a Git LFS pointer: run git lfs pull)" if data.startswith(codec.LFS_POINTER) else ""
            raise GoldenCorruptError(
                f"{display_path(target)}: sha256 differs from {MANIFEST} (edited or truncated){lfs}; "
                "restore it from git or re-record the golden"
            )
        return data


@dataclass(frozen=True)
class GoldenStage:
    """One (step, stage) of a golden, read through :class:`Golden` (plain or compressed).

    A :class:`~precision_harness.dumps.stage.StageSource`: digests and the statistics count come
    from the manifest, so an identical run is known without opening a payload.
    """

    golden: Golden
    step: int
    name: str

    @property
    def level(self) -> str | None:
        return self.golden.level

    def __str__(self) -> str:
        return display_path(self.golden.stage_dir(self.step, self.name))

    @cached_property
    def _digests(self) -> dict[str, str]:
        return self.golden.digests(self.step, self.name)

    def ranks(self) -> list[str]:
        return sorted(self._digests)

    def load(self, rank: str) -> dict[str, Any]:
        return self.golden.load_dump(self.step, self.name, rank)

    def digest(self, rank: str) -> str:
        return self._digests[rank]

    def statistics(self) -> int | None:
        return self.golden.statistics(self.step, self.name)

    def plain_dir(self, scratch: Path) -> Path:
        """The stage as plain files msprobe's tools can open: the folder itself, or an export into ``scratch``."""
        if not self.golden.compressed:
            return self.golden.stage_dir(self.step, self.name)
        prefix = f"step_{self.step}/{self.name}/"
        self.golden.export(scratch, [n for n in sorted(self.golden.contents) if n.startswith(prefix)])
        return Path(scratch) / f"step_{self.step}" / self.name


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _dump_level(root: Path, files: list[str]) -> str | None:
    """The ``level`` msprobe wrote into the first dump.json of ``files``."""
    dump = next((rel for rel in files if rel.endswith("/dump.json")), None)
    return load_dump(root / dump).get("level") if dump else None


def gates_at_recorded_level(recorded: str | None, level: str) -> bool:
    """A ``level: auto`` scenario whose golden predates auto (recorded at the localisation level) gates at it."""
    return level == AUTO and recorded == LOCALIZE_LEVEL


def _statistics(contents: dict[str, bytes], prefix: str) -> dict[str, int]:
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


def _payloads(contents: dict[str, bytes]) -> tuple[dict[str, dict[str, Any]], dict[str, bytes]]:
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


def _recorded(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a golden records, whatever its storage and whether it lists its identity components:
    equal records mean an unchanged golden."""
    suffix = codec.SUFFIX if manifest.get("codec") == codec.CODEC else ""
    files = {k.removesuffix(suffix): v.get("content_sha256", v["sha256"]) for k, v in manifest["files"].items()}
    rest = {k: v for k, v in manifest.items() if k not in ("files", "format", "codec", "identity")}
    return {**rest, "files": files}


def _what_changed(recorded: dict[str, Any] | None, scenario: Scenario) -> str:
    """The identity components that differ (``model.hidden_size: 16 -> 24``), or why they cannot be named."""
    generic = scenario.unnamed_change
    if recorded is None:
        # goldens recorded before the manifest kept its identity: only the hash can be compared
        return f"{generic}; the golden does not record its identity components, so the change cannot be named"
    lines = identity.changes(recorded, scenario.identity)
    return identity.summary(lines) if lines else generic


class GoldenStore:
    """Goldens under ``root`` (default ``golden/`` next to the scenarios)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, scenario: str, device: str) -> Path:
        """``root/<scenario>/<device>``.

        Raises:
            UnsafePathError: either name would leave ``root`` (``.``, ``..``, a separator).
        """
        return join_inside(self.root, scenario, device, what="golden <scenario>/<device>")

    def _lock(self, scenario: str, device: str) -> FileLock:
        lock_path = self.path(scenario, device).parent / f".{device}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock_path))

    def _recover(self, scenario: str, device: str) -> None:
        """Roll back a swap interrupted between its two renames."""
        final = self.path(scenario, device)
        if final.exists():
            return
        backups = sorted(final.parent.glob(f".{device}.old-*"))
        if backups:
            os.replace(backups[-1], final)

    def exists(self, scenario: str, device: str) -> bool:
        self._recover(scenario, device)
        return (self.path(scenario, device) / MANIFEST).is_file()

    # -------------------------------------------------------------------------------- reading
    def load(self, scenario: Scenario, device: str) -> Golden:
        """Load and validate the golden of ``scenario`` on ``device``.

        Raises:
            GoldenMissingError: no golden recorded (the message gives the command that records it).
            GoldenCorruptError: the manifest is unreadable, fails its schema, or names a path outside the golden.
            GoldenStaleError: recorded from another scenario structure or msprobe level; the message
                names each identity component that changed where the golden records them.
        """
        self._recover(scenario.name, device)
        path = self.path(scenario.name, device)
        if not (path / MANIFEST).is_file():
            raise GoldenMissingError(
                f"{display_path(path)}/: no golden for scenario {scenario.name} on {device}; "
                f"record it with: {update_command(scenario, 'missing')}"
            )
        try:
            golden = Golden.from_dir(path)
        except GoldenCorruptError as exc:
            raise GoldenCorruptError(f"{exc}; re-record with: {update_command(scenario)}") from None
        stale = []
        if golden.manifest["scenario_hash"] != scenario.hash:
            stale.append(
                f"scenario hash {golden.manifest['scenario_hash'][:12]} (now {scenario.hash[:12]}: "
                f"{_what_changed(golden.manifest.get('identity'), scenario)})"
            )
        if golden.level != scenario.level and not gates_at_recorded_level(golden.level, scenario.level):
            stale.append(f"msprobe level {golden.level} (now {scenario.level})")
        if stale:
            raise GoldenStaleError(
                f"{display_path(path / MANIFEST)}: golden is stale, recorded under {' and '.join(stale)}; "
                f"re-record with: {update_command(scenario)}"
            )
        return golden

    def previous(self, scenario: str, device: str) -> Golden | None:
        """The golden on disk as it is (for churn against a re-record); None if absent or unreadable."""
        self._recover(scenario, device)
        try:
            return Golden.from_dir(self.path(scenario, device))
        except GoldenError:
            return None

    def list(self) -> list[tuple[str, str]]:
        """Every ``(scenario, device)`` with a manifest under ``root``."""
        return sorted((p.parent.parent.name, p.parent.name) for p in self.root.glob(f"*/*/{MANIFEST}"))

    def unused(self, scenarios: set[str]) -> list[tuple[str, str]]:
        """Every ``(scenario, device)`` golden whose scenario is not in ``scenarios``."""
        return [(name, device) for name, device in self.list() if name not in scenarios]

    # -------------------------------------------------------------------------------- writing
    def remove(self, scenario: str, device: str) -> Path:
        """Delete one golden (and its scenario folder once empty); return the removed path."""
        path = self.path(scenario, device)
        with self._lock(scenario, device):
            shutil.rmtree(path)
        (path.parent / f".{device}.lock").unlink(missing_ok=True)
        if path.parent.is_dir() and not any(path.parent.iterdir()):
            path.parent.rmdir()
        return path

    def set_noise(self, scenario: str, device: str, noise: dict[str, Any]) -> bool:
        """Record calibrated ``noise`` in a golden's manifest (atomic rewrite); False if unchanged.

        Raises:
            GoldenCorruptError: the manifest on disk is unreadable or invalid.
            SchemaError: ``noise`` does not fit the manifest schema (nothing is written).
        """
        path = self.path(scenario, device) / MANIFEST
        with self._lock(scenario, device):
            manifest = read_manifest(path)
            if manifest.get("noise") == noise:
                return False
            manifest["noise"] = noise
            _write_manifest(path, manifest)
        return True

    def build_manifest(self, run_dir: Path, scenario: Scenario, device: str) -> tuple[dict[str, Any], dict[str, bytes]]:
        """Manifest (format 2) for a finished run directory, and the stored bytes of its payloads.

        Raises:
            GoldenCorruptError: ``run_dir`` has no readable ``run.json`` (an unfinished run).
        """
        run_dir = Path(run_dir)
        run = _read_json(run_dir / "run.json")
        if run is None:
            raise GoldenCorruptError(f"{run_dir / 'run.json'}: cannot promote an unfinished run (no readable run.json)")
        names = sorted(
            {
                p.relative_to(run_dir).as_posix()
                for pattern in GOLDEN_FILES
                for p in run_dir.glob(pattern)
                if p.is_file()
            }
        )
        contents = {name: (run_dir / name).read_bytes() for name in names}
        files, stored = _payloads(contents)
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
            "statistics": _statistics(contents, ""),
            "files": files,
        }
        if run["scenario_hash"] == scenario.hash:  # the identity describes the hash the run was made under
            manifest["identity"] = scenario.identity
        if any(name.startswith(f"{LOCALIZE_DIR}/") for name in names):
            manifest["localize_statistics"] = _statistics(contents, f"{LOCALIZE_DIR}/")
        validate(manifest, "golden_manifest", source=run_dir / "run.json")
        return manifest, stored

    def promote(self, run_dir: Path, scenario: Scenario, device: str) -> bool:
        """Make ``run_dir`` the golden of ``scenario`` on ``device``, atomically.

        Returns False when the existing golden already records the same content and settings: an
        unchanged re-record writes nothing, except that a golden recorded before manifests kept
        ``identity`` gains it (its manifest only; payloads and format stay as they are).

        Raises:
            GoldenCorruptError: ``run_dir`` has no ``run.json`` (unfinished run).
            UnsafePathError: the scenario name or device would leave the golden root.
            OSError: the write failed; the previous golden is untouched.
        """
        manifest, stored = self.build_manifest(run_dir, scenario, device)
        final = self.path(scenario.name, device)
        with self._lock(scenario.name, device):
            self._recover(scenario.name, device)
            old = self.previous(scenario.name, device)
            # calibrated noise stays valid while the scenario structure and level do
            if (
                old is not None
                and old.noise
                and (old.manifest["scenario_hash"], old.level)
                == (
                    manifest["scenario_hash"],
                    manifest["level"],
                )
            ):
                manifest["noise"] = old.noise
            if old is not None and _recorded(old.manifest) == _recorded(manifest):
                if "identity" in manifest and old.manifest.get("identity") != manifest["identity"]:
                    _write_manifest(final / MANIFEST, {**old.manifest, "identity": manifest["identity"]})
                return False
            _swap_in(final, stored, manifest)
        return True

    def migrate(self, scenario: str, device: str) -> bool:
        """Rewrite a plain (format 1) golden compressed (format 2), atomically; False if already compressed.

        Nothing is re-recorded: every payload is checked to decompress to the very bytes it had.

        Raises:
            GoldenCorruptError: the golden is corrupt (its files do not match their sha256).
            OSError: the write failed; the plain golden is untouched.
        """
        with self._lock(scenario, device):
            self._recover(scenario, device)
            golden = Golden.from_dir(self.path(scenario, device))
            if golden.compressed:
                return False
            contents = {name: golden.read(name) for name in golden.contents}
            files, stored = _payloads(contents)
            for name, content in contents.items():
                meta = files[name + codec.SUFFIX]
                back = codec.decompress(stored[name + codec.SUFFIX], content_bytes=meta["content_bytes"], shown=name)
                if back != content:  # pragma: no cover - a codec bug; never write a lossy golden
                    raise GoldenCorruptError(f"{display_path(golden.path / name)}: compressed copy does not round-trip")
            manifest = {**golden.manifest, "format": FORMAT, "codec": codec.CODEC, "files": files}
            _swap_in(golden.path, stored, manifest)
        return True


def _swap_in(final: Path, stored: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """Build the golden beside ``final``, then swap it in with two renames (rolled back on failure)."""
    device = final.name
    tmp = final.parent / f".{device}.tmp-{os.getpid()}"
    backup = final.parent / f".{device}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, data in stored.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        _write_manifest(tmp / MANIFEST, manifest, validate_first=False)
        if final.exists():
            os.replace(final, backup)
        try:
            os.replace(tmp, final)
        except BaseException:
            if backup.exists() and not final.exists():
                os.replace(backup, final)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(backup, ignore_errors=True)


def _write_manifest(path: Path, manifest: dict[str, Any], *, validate_first: bool = True) -> None:
    """Write ``manifest.json`` pretty-printed (reviewable in a pull request), through a temporary file."""
    if validate_first:
        validate(manifest, "golden_manifest", source=display_path(path))
    tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def lint_dump(dump: dict[str, Any], *, shown: str) -> list[str]:
    """NaN/Inf lint of one parsed ``dump.json`` (named ``shown``): one line per offending tensor statistic.

    NaN anywhere, and +-Inf in Max or Min, are errors (a golden must be made of numbers). An
    infinite Mean or Norm is allowed where Max or Min holds a masking constant (at least half the
    dtype's largest finite value), whose sum overflows in msprobe's own statistics.
    """
    problems = []
    for where, tensor in tensors(dump["data"]):
        dtype = str(tensor["dtype"]).rsplit(".", 1)[-1]
        extreme = 0.5 * _FINITE_MAX.get(dtype, math.inf)
        masked = any(isinstance(tensor.get(k), (int, float)) and abs(tensor[k]) >= extreme for k in ("Max", "Min"))
        for stat in STATISTICS:
            v = tensor.get(stat)
            if not isinstance(v, (int, float)) or math.isfinite(v):
                continue
            if math.isnan(v) or stat in ("Max", "Min") or not masked:
                problems.append(f"{shown}: {where} {stat} is {v}")
    return problems


def verify_golden(path: Path) -> list[str]:
    """Every problem of the golden at ``path``: manifest schema, both digests of each file, unlisted
    files, NaN/Inf lint.

    Returns one line per problem (empty: the golden is sound); never raises for a bad golden.
    """
    path = Path(path)
    try:
        golden = Golden.from_dir(path)
    except GoldenError as exc:
        return [str(exc)]
    problems = []
    for name, stored in sorted(golden.contents.items()):
        try:
            content = golden.read(name)
            if name.endswith("/dump.json"):
                shown = display_path(path / stored)
                problems += lint_dump(parse_dump(content, shown=shown), shown=shown)
        except GoldenCorruptError as exc:
            problems.append(str(exc))
    listed = set(golden.manifest["files"]) | {MANIFEST}
    for extra in sorted(p for p in path.rglob("*") if p.is_file() and p.relative_to(path).as_posix() not in listed):
        problems.append(f"{display_path(extra)}: not listed in {MANIFEST}; remove it or re-record the golden")
    return problems
