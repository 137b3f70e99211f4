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
from precision_harness.errors import GoldenCorruptError, GoldenMissingError, GoldenStaleError, ScenarioError
from precision_harness.scenario import Scenario, display_path, validate

#: Files of a run directory that a golden keeps (relative glob patterns).
#: dtype -> largest finite value; a Mean/Norm of +-inf next to a Max/Min at half of it is the
#: overflow of an attention-mask constant (``finfo.min``), not a bad number.
_FINITE_MAX = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}

GOLDEN_FILES = ("step_*/*/step0/rank*/dump.json", "step_*/*/step0/rank*/construct.json", "metrics.jsonl")
MANIFEST = "manifest.json"


def update_command(scenario: Scenario, mode: str = "update") -> str:
    return f"pytest {display_path(scenario.path)} --precision-golden {mode}"


@dataclass(frozen=True)
class Golden:
    """A validated golden on disk."""

    path: Path
    manifest: dict[str, Any]

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

    def verify_file(self, rel: str) -> Path:
        """Return ``path/rel`` after checking it against the manifest's sha256.

        Raises:
            GoldenCorruptError: the file is missing or its digest differs.
        """
        meta = self.manifest["files"].get(rel)
        target = self.path / rel
        if meta is None:
            raise GoldenCorruptError(f"{display_path(target)}: not listed in {display_path(self.path / MANIFEST)}")
        if not target.is_file():
            raise GoldenCorruptError(f"{display_path(target)}: listed in {MANIFEST} but missing; re-record the golden")
        if sha256_file(target) != meta["sha256"]:
            raise GoldenCorruptError(
                f"{display_path(target)}: sha256 differs from {MANIFEST} (edited or truncated); restore it from git or re-record the golden"
            )
        return target


class GoldenStore:
    """Goldens under ``root`` (default ``golden/`` next to the scenarios)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, scenario: str, device: str) -> Path:
        return self.root / scenario / device

    def _lock(self, scenario: str, device: str) -> FileLock:
        lock_path = self.root / scenario / f".{device}.lock"
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
            GoldenCorruptError: the manifest is unreadable or fails its schema.
            GoldenStaleError: recorded from another scenario structure or msprobe level.
        """
        self._recover(scenario.name, device)
        path = self.path(scenario.name, device)
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise GoldenMissingError(
                f"{display_path(path)}/: no golden for scenario {scenario.name} on {device}; record it with: {update_command(scenario, 'missing')}"
            )
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise GoldenCorruptError(
                f"{display_path(manifest_path)}: unreadable manifest ({exc}); restore it from git or re-record with: {update_command(scenario)}"
            ) from None
        try:
            validate(manifest, "golden_manifest", source=display_path(manifest_path))
        except ScenarioError as exc:
            raise GoldenCorruptError(f"{exc}; re-record with: {update_command(scenario)}") from None
        stale = []
        if manifest["scenario_hash"] != scenario.hash:
            stale.append(
                f"scenario hash {manifest['scenario_hash'][:12]} (now {scenario.hash[:12]}: model, data, batch or algorithm settings changed)"
            )
        if manifest["level"] != scenario.level:
            stale.append(f"msprobe level {manifest['level']} (now {scenario.level})")
        if stale:
            raise GoldenStaleError(
                f"{display_path(manifest_path)}: golden is stale, recorded under {' and '.join(stale)}; re-record with: {update_command(scenario)}"
            )
        return Golden(path=path, manifest=manifest)

    def previous(self, scenario: str, device: str) -> Golden | None:
        """The golden on disk as it is, unvalidated (for churn against a re-record); None if absent."""
        self._recover(scenario, device)
        path = self.path(scenario, device)
        try:
            return Golden(path=path, manifest=json.loads((path / MANIFEST).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None

    def unused(self, scenarios: set[str]) -> list[tuple[str, str]]:
        """Every ``(scenario, device)`` golden whose scenario is not in ``scenarios``."""
        return [(name, device) for name, device in self.list() if name not in scenarios]

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
        """Record calibrated ``noise`` in a golden's manifest (atomic rewrite); False if unchanged."""
        path = self.path(scenario, device) / MANIFEST
        with self._lock(scenario, device):
            manifest = json.loads(path.read_text(encoding="utf-8"))
            if manifest.get("noise") == noise:
                return False
            manifest["noise"] = noise
            validate(manifest, "golden_manifest", source=display_path(path))
            tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)
        return True

    def list(self) -> list[tuple[str, str]]:
        """Every ``(scenario, device)`` with a manifest under ``root``."""
        return sorted((p.parent.parent.name, p.parent.name) for p in self.root.glob(f"*/*/{MANIFEST}"))

    # -------------------------------------------------------------------------------- writing
    def build_manifest(self, run_dir: Path, scenario: Scenario, device: str) -> tuple[dict[str, Any], list[str]]:
        """Manifest for a finished run directory and the relative files it lists."""
        run_dir = Path(run_dir)
        try:
            run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise GoldenCorruptError(f"{run_dir / 'run.json'}: cannot promote an unfinished run ({exc})") from None
        files = sorted({str(p.relative_to(run_dir)) for pattern in GOLDEN_FILES for p in run_dir.glob(pattern)})
        statistics = {}
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
            "metrics": "metrics.jsonl",
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
            OSError: the copy failed; the previous golden is untouched.
        """
        manifest, files = self.build_manifest(run_dir, scenario, device)
        final = self.path(scenario.name, device)
        with self._lock(scenario.name, device):
            self._recover(scenario.name, device)
            old_manifest = final / MANIFEST
            if old_manifest.is_file():
                try:
                    old = json.loads(old_manifest.read_text(encoding="utf-8"))
                    # calibrated noise stays valid while the scenario structure and level do
                    if isinstance(old.get("noise"), dict) and (old.get("scenario_hash"), old.get("level")) == (
                        manifest["scenario_hash"],
                        manifest["level"],
                    ):
                        manifest["noise"] = old["noise"]
                    if old == manifest:
                        return False
                except (ValueError, AttributeError):
                    pass  # corrupt: replace it
            tmp = final.parent / f".{device}.tmp-{os.getpid()}"
            backup = final.parent / f".{device}.old-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                for rel in files:
                    dest = tmp / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(run_dir / rel, dest)
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
                if _fail_after_copy:  # test hook: an interruption after the copy, before the swap
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
        return True


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
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        validate(manifest, "golden_manifest", source=display_path(manifest_path))
    except (OSError, ValueError) as exc:
        return [f"{display_path(manifest_path)}: unreadable manifest ({exc})"]
    except ScenarioError as exc:
        return [str(exc)]
    golden = Golden(path=path, manifest=manifest)
    problems = []
    for rel in sorted(manifest["files"]):
        try:
            golden.verify_file(rel)
        except GoldenCorruptError as exc:
            problems.append(str(exc))
            continue
        if rel.endswith("/dump.json"):
            try:
                problems += lint_dump(path / rel)
            except GoldenCorruptError as exc:
                problems.append(str(exc))
    listed = set(manifest["files"]) | {MANIFEST}
    for extra in sorted(p for p in path.rglob("*") if p.is_file() and str(p.relative_to(path)) not in listed):
        problems.append(f"{display_path(extra)}: not listed in {MANIFEST}; remove it or re-record the golden")
    return problems
