"""GoldenStore: recorded runs under ``golden/<scenario>/<device>/``, in verl's dump layout.

A golden holds, per profiled (step, stage, rank), msprobe's ``dump.json`` and ``construct.json``
(``stack.json`` is dropped: it holds machine paths), the run's ``metrics.jsonl``, and a
``manifest.json`` (schema ``golden_manifest``) with the scenario hash, msprobe level, environment
fingerprint, numeric settings, per-stage statistics counts and the sha256 of every file.

Writes are atomic: :meth:`GoldenStore.promote` builds the new golden in a sibling temporary folder,
then swaps it in with two renames under a file lock; a failure at any point leaves the previous
golden in place (a crash between the two renames is rolled back on the next access).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from precision_harness.compare import count_statistics, load_dump, sha256_file
from precision_harness.errors import (
    GoldenCorruptError,
    GoldenError,
    GoldenMissingError,
    GoldenStaleError,
    ScenarioError,
)
from precision_harness.paths import display_path, is_relative_inside, join_inside
from precision_harness.scenario import Scenario, validate

#: dtype -> largest finite value; a Mean/Norm of +-inf next to a Max/Min at half of it is the
#: overflow of an attention-mask constant (``finfo.min``), not a bad number.
_FINITE_MAX = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}

METRICS = "metrics.jsonl"
#: Files of a run directory that a golden keeps (relative glob patterns).
GOLDEN_FILES = ("step_*/*/step0/rank*/dump.json", "step_*/*/step0/rank*/construct.json", METRICS)
MANIFEST = "manifest.json"


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
    except ScenarioError as exc:
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
        files = sorted({p.relative_to(path).as_posix() for pattern in GOLDEN_FILES for p in path.glob(pattern)})
        manifest = {
            "scenario": run.get("scenario", path.name),
            "device": run.get("device"),
            "level": run.get("level") or _dump_level(path, files),
            "numeric_settings": run.get("numeric_settings"),
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
    def size_bytes(self) -> int:
        return sum(meta.get("bytes", 0) for meta in self.manifest["files"].values())

    # ---------------------------------------------------------------------------------- stages
    def stage_dir(self, step: int, stage: str) -> Path:
        return self.path / f"step_{step}" / stage

    def sha256(self, step: int, stage: str) -> dict[str, str]:
        """``{"rank0": sha256, ...}`` of the stage's dump.json files."""
        prefix = f"step_{step}/{stage}/step0/"
        return {
            rel[len(prefix) :].split("/", 1)[0]: meta["sha256"]
            for rel, meta in self.manifest["files"].items()
            if rel.startswith(prefix) and rel.endswith("/dump.json")
        }

    def statistics(self, step: int, stage: str) -> int | None:
        return self.manifest.get("statistics", {}).get(f"step_{step}/{stage}")

    def has_stage(self, step: int, stage: str) -> bool:
        return bool(self.sha256(step, stage))

    def stages(self) -> set[tuple[int, str]]:
        """Every ``(step, stage)`` with a dump.json in the golden."""
        found = set()
        for rel in self.manifest["files"]:
            parts = rel.split("/")
            if len(parts) == 5 and rel.endswith("/dump.json") and parts[0][5:].isdigit():
                found.add((int(parts[0][5:]), parts[1]))
        return found

    def verify_stage(self, step: int, stage: str) -> None:
        """Check every rank's dump.json of the stage against the manifest (see :meth:`verify_file`)."""
        for rank in self.sha256(step, stage):
            self.verify_file(f"step_{step}/{stage}/step0/{rank}/dump.json")

    def metrics_path(self) -> Path | None:
        """``metrics.jsonl`` after :meth:`verify_file`, or None when the golden has none."""
        rel = self.manifest.get("metrics", METRICS)
        return self.verify_file(rel) if rel in self.manifest["files"] else None

    def verify_file(self, rel: str) -> Path:
        """Return ``path/rel`` after checking it against the manifest's sha256.

        Raises:
            GoldenCorruptError: the file is not listed, is missing, or its digest differs.
        """
        meta = self.manifest["files"].get(rel)
        target = self.path / rel
        if meta is None:
            raise GoldenCorruptError(f"{display_path(target)}: not listed in {display_path(self.path / MANIFEST)}")
        if not target.is_file():
            raise GoldenCorruptError(f"{display_path(target)}: listed in {MANIFEST} but missing; re-record the golden")
        if sha256_file(target) != meta["sha256"]:
            raise GoldenCorruptError(
                f"{display_path(target)}: sha256 differs from {MANIFEST} (edited or truncated); "
                "restore it from git or re-record the golden"
            )
        return target


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
            GoldenStaleError: recorded from another scenario structure or msprobe level.
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
                "model, data, batch or algorithm settings changed)"
            )
        if golden.level != scenario.level:
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
            ScenarioError: ``noise`` does not fit the manifest schema (nothing is written).
        """
        path = self.path(scenario, device) / MANIFEST
        with self._lock(scenario, device):
            manifest = read_manifest(path)
            if manifest.get("noise") == noise:
                return False
            manifest["noise"] = noise
            _write_manifest(path, manifest)
        return True

    def build_manifest(self, run_dir: Path, scenario: Scenario, device: str) -> tuple[dict[str, Any], list[str]]:
        """Manifest for a finished run directory and the relative files it lists.

        Raises:
            GoldenCorruptError: ``run_dir`` has no readable ``run.json`` (an unfinished run).
        """
        run_dir = Path(run_dir)
        run = _read_json(run_dir / "run.json")
        if run is None:
            raise GoldenCorruptError(f"{run_dir / 'run.json'}: cannot promote an unfinished run (no readable run.json)")
        files = sorted({p.relative_to(run_dir).as_posix() for pattern in GOLDEN_FILES for p in run_dir.glob(pattern)})
        statistics: dict[str, int] = {}
        for rel in files:
            if rel.endswith("/dump.json"):
                key = "/".join(rel.split("/")[:2])
                statistics[key] = statistics.get(key, 0) + count_statistics(load_dump(run_dir / rel))
        manifest = {
            "format": 1,
            "scenario": scenario.name,
            "scenario_hash": run["scenario_hash"],
            "device": device,
            "level": run["level"],
            "env": run["env"],
            "steps": run["steps"],
            "stages": run["stages"],
            "numeric_settings": run["numeric_settings"],
            "metrics": METRICS,
            "statistics": statistics,
            "files": {
                rel: {"sha256": sha256_file(run_dir / rel), "bytes": (run_dir / rel).stat().st_size} for rel in files
            },
        }
        validate(manifest, "golden_manifest", source=run_dir / "run.json")
        return manifest, files

    def promote(self, run_dir: Path, scenario: Scenario, device: str, *, _fail_after_copy: bool = False) -> bool:
        """Make ``run_dir`` the golden of ``scenario`` on ``device``, atomically.

        Returns False (and writes nothing) when the existing golden already has the same manifest,
        so an unchanged re-record does not touch git.

        Raises:
            GoldenCorruptError: ``run_dir`` has no ``run.json`` (unfinished run).
            UnsafePathError: the scenario name or device would leave the golden root.
            OSError: the copy failed; the previous golden is untouched.
        """
        manifest, files = self.build_manifest(run_dir, scenario, device)
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
            if old is not None and old.manifest == manifest:
                return False
            self._swap_in(final, run_dir, files, manifest, fail_after_copy=_fail_after_copy)
        return True

    @staticmethod
    def _swap_in(
        final: Path, run_dir: Path, files: list[str], manifest: dict[str, Any], *, fail_after_copy: bool
    ) -> None:
        """Build the golden beside ``final``, then swap it in with two renames (rolled back on failure)."""
        device = final.name
        tmp = final.parent / f".{device}.tmp-{os.getpid()}"
        backup = final.parent / f".{device}.old-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for rel in files:
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(run_dir / rel, dest)
            _write_manifest(tmp / MANIFEST, manifest, validate_first=False)
            if fail_after_copy:  # test hook: an interruption after the copy, before the swap
                raise OSError("simulated interruption before the swap")
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


def lint_dump(path: Path) -> list[str]:
    """NaN/Inf lint of one ``dump.json``: one line per offending tensor statistic.

    NaN anywhere, and +-Inf in Max or Min, are errors (a golden must be made of numbers). An
    infinite Mean or Norm is allowed where Max or Min holds a masking constant (at least half the
    dtype's largest finite value), whose sum overflows in msprobe's own statistics.
    """
    import math

    problems = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "Max" in node and "dtype" in node:
                dtype = str(node["dtype"]).rsplit(".", 1)[-1]
                extreme = 0.5 * _FINITE_MAX.get(dtype, math.inf)
                masked = any(isinstance(node.get(k), (int, float)) and abs(node[k]) >= extreme for k in ("Max", "Min"))
                for stat in ("Max", "Min", "Mean", "Norm"):
                    v = node.get(stat)
                    if not isinstance(v, (int, float)) or math.isfinite(v):
                        continue
                    if math.isnan(v) or stat in ("Max", "Min") or not masked:
                        problems.append(f"{display_path(path)}: {where} {stat} is {v}")
                return
            for key, value in node.items():
                walk(value, f"{where}.{key}" if where else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}.{i}")

    walk(load_dump(path)["data"], "")
    return problems


def verify_golden(path: Path) -> list[str]:
    """Every problem of the golden at ``path``: manifest schema, sha256 of each file, unlisted files, NaN/Inf lint.

    Returns one line per problem (empty: the golden is sound); never raises for a bad golden.
    """
    path = Path(path)
    try:
        golden = Golden.from_dir(path)
    except GoldenError as exc:
        return [str(exc)]
    problems = []
    for rel in sorted(golden.manifest["files"]):
        try:
            golden.verify_file(rel)
            if rel.endswith("/dump.json"):
                problems += lint_dump(path / rel)
        except GoldenCorruptError as exc:
            problems.append(str(exc))
    listed = set(golden.manifest["files"]) | {MANIFEST}
    for extra in sorted(p for p in path.rglob("*") if p.is_file() and p.relative_to(path).as_posix() not in listed):
        problems.append(f"{display_path(extra)}: not listed in {MANIFEST}; remove it or re-record the golden")
    return problems
