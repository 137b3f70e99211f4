"""Which goldens a run used: unused goldens are listed, and pruned only after a full, unfiltered run.

syrupy reports snapshots unused whenever a run did not reach them, so a partial run (``-k``, one
file, an xdist shard) "finds" unused snapshots that are not. Here a golden is unused only when the
run is provably full:

- no ``-k``/``-m``, nothing deselected (``--deselect``, ``--lf``, plugins), no ``--ignore``;
- every scenario file under rootdir (directories named in ``precision_scenario_dirs``, skipping
  hidden directories, virtualenvs and ``norecursedirs``) was collected without error;
- under xdist, the union of what every worker collected (each collects everything, then runs a share).

Otherwise :attr:`GoldenUsage.partial` says why, and nothing is listed or pruned.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.goldens.store import GoldenStore

#: pytest's default ``norecursedirs``
DEFAULT_NORECURSE = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}")


@dataclass
class GoldenUsage:
    """Scenario names and files this run collected, and why it is not a full run (empty: full)."""

    names: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)  #: resolved paths of collected scenario files
    partial: list[str] = field(default_factory=list)

    def merge(self, other: dict[str, Any]) -> None:
        """Add an xdist worker's :meth:`to_json`."""
        self.names |= set(other.get("names", ()))
        self.files |= set(other.get("files", ()))
        self.partial += [p for p in other.get("partial", ()) if p not in self.partial]

    def to_json(self) -> dict[str, Any]:
        return {"names": sorted(self.names), "files": sorted(self.files), "partial": list(self.partial)}

    def mark_partial(self, reason: str) -> None:
        if reason not in self.partial:
            self.partial.append(reason)

    def check_complete(self, discovered: Iterable[Path], *, rootdir: Path) -> None:
        """Mark the run partial if a scenario file under rootdir was not collected."""
        missing = sorted(
            str(p.relative_to(rootdir)) if p.is_relative_to(rootdir) else str(p)
            for p in discovered
            if str(p.resolve()) not in self.files
        )
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            self.mark_partial(f"scenario files not collected: {', '.join(missing[:3])}{more}")


def discover_scenarios(
    rootdir: Path, dir_names: Iterable[str], norecurse: Iterable[str] = DEFAULT_NORECURSE
) -> list[Path]:
    """Every ``*.yaml``/``*.yml`` in a directory named in ``dir_names`` below ``rootdir``."""
    dir_names, norecurse = set(dir_names), tuple(norecurse)
    found = []
    for current, dirs, files in os.walk(rootdir):
        here = Path(current)
        dirs[:] = sorted(
            d
            for d in dirs
            if not any(fnmatch.fnmatch(d, pat) for pat in norecurse) and not (here / d / "pyvenv.cfg").exists()
        )
        if here.name in dir_names:
            found += [here / f for f in sorted(files) if f.endswith((".yaml", ".yml"))]
    return found


@dataclass
class Settled:
    """What the end of a run did with the goldens no collected scenario uses."""

    unused: list[dict[str, str]] = field(default_factory=list)  #: listed: ``{"scenario", "device", "path"}``
    pruned: list[str] = field(default_factory=list)  #: removed (``--precision-prune``): their paths as shown
    note: str = ""  #: why nothing was pruned (a partial run)


def settle(usage: GoldenUsage, store: GoldenStore, *, prune: bool, shown: Callable[[Path], Path]) -> Settled:
    """List the goldens ``usage`` did not use, or remove them under ``prune``; neither after a partial run."""
    out = Settled()
    if usage.partial:
        if prune:
            out.note = f"precision-prune: nothing removed, not a full run ({'; '.join(usage.partial)})"
        return out
    for name, device in store.unused(usage.names):
        path = str(shown(store.path(name, device)))
        if prune:
            store.remove(name, device)
            out.pruned.append(path)
        else:
            out.unused.append({"scenario": name, "device": device, "path": path})
    return out
