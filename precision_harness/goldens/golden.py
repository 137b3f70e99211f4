"""Golden: one recorded run under ``golden/<scenario>/<device>/``, in verl's dump layout, compressed.

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
manifest stays plain, pretty-printed JSON for review (:mod:`precision_harness.goldens.manifest`).

Where goldens live and how one is written atomically: :mod:`precision_harness.goldens.store`; what
``precision-harness golden verify`` finds wrong with one: :mod:`precision_harness.goldens.verification`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from precision_harness.dumps.dump_index import INDEX, DumpIndex, index_name, indexable
from precision_harness.dumps.files import (
    DUMP,
    METRICS,
    STAGE_OUTPUTS,
    merged,
    parse_dump,
    parse_dump_raw,
    parse_metrics,
    rank_digest,
    sha256_file,
)
from precision_harness.errors import GoldenCorruptError, GoldenMissingError
from precision_harness.goldens import golden_codec as codec
from precision_harness.goldens.manifest import (
    LOCALIZE_DIR,
    MANIFEST,
    dump_level,
    golden_files,
    read_json,
    read_manifest,
)
from precision_harness.paths import display_path
from precision_harness.scenarios.profiling import AUTO, LOCALIZE_LEVEL
from precision_harness.scenarios.scenario import Scenario


def update_command(scenario: Scenario, mode: str = "update") -> str:
    """The pytest command that records ``scenario``'s golden (``mode``: ``update``, or ``missing``)."""
    return f"pytest {display_path(scenario.path)} --precision-golden {mode}"


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
        run = read_json(path / "run.json") or {}
        files = golden_files(path)
        manifest = {
            "format": 1,
            "scenario": run.get("scenario", path.resolve().name),
            "device": run.get("device"),
            "level": run.get("level") or dump_level(path, files),
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
        """The recording run's environment (numerics.devices.fingerprint), None for a directory without run.json."""
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
        """Bytes of the plain payloads (what an export writes, and the dumps' indexes)."""
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

    def load_dump(self, step: int, stage: str, rank: str, *, raw: bool = False) -> dict[str, Any]:
        """One rank's parsed dump.json, its stage_outputs.json merged in where it has one (with ``raw``, its
        non-finite values as :func:`~precision_harness.dumps.files.parse_dump_raw` reads them).

        Raises:
            GoldenCorruptError: missing, edited or corrupt.
        """
        rank_dir = f"step_{step}/{stage}/step0/{rank}"
        dump = self._parse(f"{rank_dir}/dump.json", raw)
        extra = f"{rank_dir}/{STAGE_OUTPUTS}"
        return merged(dump, self._parse(extra, raw) if extra in self.contents else None)

    def _parse(self, name: str, raw: bool = False) -> dict[str, Any]:
        parse = parse_dump_raw if raw else parse_dump
        return parse(self.read(name), shown=display_path(self.path / self.contents.get(name, name)))

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
        """Write the golden's payloads (or those of ``names``) as plain files under ``out``, verl's layout; return
        ``out``.

        The result opens in every msprobe tool (the indexes, ours, are left out). Raises GoldenCorruptError as
        :meth:`read`.
        """
        out = Path(out)
        for name in sorted(self.contents) if names is None else names:
            if name.endswith(f"/{INDEX}"):
                continue
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

    def load(self, rank: str, *, raw: bool = False) -> dict[str, Any]:
        return self.golden.load_dump(self.step, self.name, rank, raw=raw)

    def content(self, rank: str) -> bytes | None:
        rank_dir = f"step_{self.step}/{self.name}/step0/{rank}"
        if f"{rank_dir}/{STAGE_OUTPUTS}" in self.golden.contents:
            return None
        return self.golden.read(f"{rank_dir}/{DUMP}")

    def digest(self, rank: str) -> str:
        return self._digests[rank]

    def index(self, rank: str) -> DumpIndex | None:
        """The rank's :class:`~precision_harness.dumps.dump_index.DumpIndex`, where the golden lists one of this dump
        (not of a rank with a stage_outputs.json, nor of another version). Raises GoldenCorruptError as
        :meth:`Golden.read`, and where the file is not an index."""
        if not self.indexed(rank):
            return None
        dump = f"step_{self.step}/{self.name}/step0/{rank}/{DUMP}"
        name = index_name(dump)
        shown = display_path(self.golden.path / self.golden.contents[name])
        return DumpIndex.of(self.golden.read(name), dump_sha256=self.golden.content_sha256(dump), shown=shown)

    def indexed(self, rank: str) -> bool:
        dump, contents = f"step_{self.step}/{self.name}/step0/{rank}/{DUMP}", self.golden.contents
        return indexable(dump, contents) and index_name(dump) in contents

    def statistics(self) -> int | None:
        return self.golden.statistics(self.step, self.name)

    def plain_dir(self, scratch: Path) -> Path:
        """The stage as plain files msprobe's tools can open: the folder itself, or an export into ``scratch``."""
        if not self.golden.compressed:
            return self.golden.stage_dir(self.step, self.name)
        prefix = f"step_{self.step}/{self.name}/"
        self.golden.export(scratch, [n for n in sorted(self.golden.contents) if n.startswith(prefix)])
        return Path(scratch) / f"step_{self.step}" / self.name


def gates_at_recorded_level(recorded: str | None, level: str) -> bool:
    """A ``level: auto`` scenario whose golden predates auto (recorded at the localisation level) gates at it."""
    return level == AUTO and recorded == LOCALIZE_LEVEL
