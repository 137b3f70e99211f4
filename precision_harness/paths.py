"""Paths built from user input (scenario names, devices, manifest entries) stay inside their root."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from precision_harness.errors import UnsafePathError


def display_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (for messages)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def is_relative_inside(rel: str) -> bool:
    """True if ``rel`` is a relative POSIX path that cannot leave its base (no ``..``, not absolute)."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and ".." not in p.parts and "." not in rel.split("/")


def join_inside(root: Path, *parts: str, what: str) -> Path:
    """``root/part/...`` after checking that each part is one plain folder or file name.

    Raises:
        UnsafePathError: a part is empty, ``.``, ``..``, or holds a path separator, so the result
            would not be a child of ``root`` (``what`` names the field it came from).
    """
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\\" in part or "\x00" in part:
            raise UnsafePathError(f"{display_path(root)}: {what}: {part!r} would leave {display_path(root)}/")
    joined = Path(root).joinpath(*parts)
    if os.path.commonpath([os.path.normpath(joined), os.path.normpath(root)]) != os.path.normpath(root):
        raise UnsafePathError(f"{display_path(root)}: {what}: {'/'.join(parts)!r} would leave {display_path(root)}/")
    return joined
