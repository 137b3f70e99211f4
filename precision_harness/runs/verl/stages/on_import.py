"""Run a function on a module right after it is first imported (now, if it already was): deferred set-up.

verl starts many processes (the driver, the TaskRunner, the ranks, the rollout server, agent-loop and
reward workers), and ``import verl`` runs the gate's modules in each (``VERL_USE_EXTERNAL_MODULES``: the CPU
support, :mod:`.extension`, the rank stack, FSDP2's buffers). Most of
them never import the modules the patches replace parts of (the FSDP engine, the engine workers, the
rollout replica); importing those only to patch them cost about 2.5 s of CPU per process. Each patch
is therefore applied when its module is imported, by whoever imports it, before the importer reads
a name from it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_LOCK = threading.Lock()
_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a module with a pending callback as the path finder does, and runs the callbacks once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _PENDING:
            return None
        spec = _next_spec(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        exec_module = spec.loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            with _LOCK:
                callbacks = _PENDING.pop(name, [])
            for callback in callbacks:
                callback(module)

        spec.loader.exec_module = exec_then_call  # type: ignore[method-assign]
        return spec


def _next_spec(me: Any, name: str, path: Any, target: Any) -> importlib.machinery.ModuleSpec | None:
    """The spec the finders after ``me`` give: another finder that wraps the same module keeps its wrapper."""
    finders = sys.meta_path[sys.meta_path.index(me) + 1 :] if me in sys.meta_path else [importlib.machinery.PathFinder]
    for finder in finders:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None


_FINDER = _Finder()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import."""
    with _LOCK:
        module = sys.modules.get(name)
        if module is None:
            _PENDING.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
    if module is not None:
        callback(module)


def apply_checked(version: str, supported: tuple[str, ...], refusal: str, patches: tuple[tuple[str, Any], ...]) -> None:
    """Apply each ``(module, patch)`` of ``patches`` when its module is first imported (now if it already is), after
    checking ``version`` is one of ``supported``.

    Raises:
        RuntimeError: ``refusal`` (one line), when ``version`` is not supported.
    """
    if version not in supported:
        raise RuntimeError(refusal)
    for module, patch in patches:
        when_imported(module, patch)
