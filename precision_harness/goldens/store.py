"""GoldenStore: the goldens under ``golden/<scenario>/<device>/`` (and ``<device>@<model>/``, one per accelerator
model where a team keeps several: docs/goldens.md): layout, loading (stale or not), atomic
promote and migrate, recovery, noise, prune.

Writes are atomic: :meth:`GoldenStore.promote` and :meth:`GoldenStore.migrate` build the new golden
in a sibling temporary folder, then swap it in with two renames under a file lock; a failure at any
point leaves the previous golden in place (a crash between the renames is rolled back on the next
access).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from filelock import FileLock

from precision_harness.dumps.dump_index import index_name, indexable
from precision_harness.errors import GoldenCorruptError, GoldenError, GoldenMissingError, GoldenStaleError
from precision_harness.goldens import golden_codec as codec
from precision_harness.goldens.golden import Golden, gates_at_recorded_level, update_command
from precision_harness.goldens.manifest import (
    FORMAT,
    MANIFEST,
    build_manifest,
    indexes,
    payloads,
    read_manifest,
    recorded,
    write_manifest,
)
from precision_harness.paths import display_path, join_inside
from precision_harness.scenarios import identity
from precision_harness.scenarios.scenario import Scenario


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
            write_manifest(path, manifest)
        return True

    def promote(self, run_dir: Path, scenario: Scenario, device: str, *, folder: str | None = None) -> bool:
        """Make ``run_dir`` the golden of ``scenario`` on ``device``, atomically, in ``<scenario>/<folder>/``
        (default ``device``; a golden per accelerator model is ``<device>@<model>``, its manifest's device ``device``).

        Returns False when the existing golden already records the same content and settings: an
        unchanged re-record writes nothing, except that a golden recorded before manifests kept
        ``identity`` gains it (its manifest only; payloads and format stay as they are).

        Raises:
            GoldenCorruptError: ``run_dir`` has no ``run.json`` (unfinished run).
            UnsafePathError: the scenario name or device would leave the golden root.
            OSError: the write failed; the previous golden is untouched.
        """
        manifest, stored = build_manifest(run_dir, scenario, device)
        folder = folder or device
        final = self.path(scenario.name, folder)
        with self._lock(scenario.name, folder):
            self._recover(scenario.name, folder)
            old = self.previous(scenario.name, folder)
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
            if old is not None and recorded(old.manifest) == recorded(manifest):
                if "identity" in manifest and old.manifest.get("identity") != manifest["identity"]:
                    write_manifest(final / MANIFEST, {**old.manifest, "identity": manifest["identity"]})
                return False
            _swap_in(final, stored, manifest)
        return True

    def migrate(self, scenario: str, device: str) -> bool:
        """Rewrite a golden in the current format, atomically: a plain (format 1) golden compressed (format 2), and
        each dump.json given the index an update writes (:func:`~precision_harness.goldens.manifest.indexes`) where
        it has none; False where there is nothing to do.

        Nothing is re-recorded: every payload is checked to decompress to the very bytes it had, and an index is
        built from the golden's own dump.json (verified against its sha256).

        Raises:
            GoldenCorruptError: the golden is corrupt (its files do not match their sha256).
            ProbeUnavailableError: msprobe (its row parser) is not installed and a dump needs it.
            OSError: the write failed; the golden is untouched.
        """
        with self._lock(scenario, device):
            self._recover(scenario, device)
            golden = Golden.from_dir(self.path(scenario, device))
            names = set(golden.contents)
            unindexed = [n for n in sorted(names) if indexable(n, names) and index_name(n) not in names]
            dumps = {name: golden.read(name) for name in unindexed}
            added = indexes(dumps)
            if golden.compressed and not added:
                return False
            contents = {name: dumps[name] if name in dumps else golden.read(name) for name in golden.contents}
            contents |= added
            files, stored = payloads(contents)
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
        write_manifest(tmp / MANIFEST, manifest, validate_first=False)
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
