"""Where in the code a recorded call was made: its module (``construct.json``) or its stack frame (``stack.json``).

msprobe writes both beside each rank's ``dump.json``. ``construct.json`` maps a call to the module
that made it at ``mix`` and L0 (``{}`` at L1); ``stack.json`` maps an id to ``[[call keys], [frames]]``
with frames as ``"File <path>, line <n>, in <function>, \\n <code>"``, innermost first. A changed code
path is named by the first frame outside torch's module machinery (``torch/nn/modules/module.py``
and the like): the model code that made the call. Goldens keep no ``stack.json``, so this reads the
run's side only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

CONSTRUCT, STACK = "construct.json", "stack.json"
#: characters of the frame's source line a verdict shows
MAX_CODE = 60
#: frames of the machinery between the model code and the call, never the place a reader wants
_MACHINERY = ("/torch/nn/modules/", "/torch/utils/", "/torch/_", "/msprobe/", "/transformers/utils/")
_FRAME = re.compile(r"File (?P<path>.+?), line (?P<line>\d+), in (?P<func>[^,]+),\s*\n?\s*(?P<code>.*)", re.S)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def call_sites(rank_dir: Path, apis: list[str]) -> dict[str, str]:
    """``{call key: where it was made}`` for the ``apis`` that ``rank_dir``'s files place; others are left out.

    The module from ``construct.json`` where it names one (``in Module.model.layers.0.self_attn...``),
    else the first model-code frame of ``stack.json`` (``transformers/models/qwen2/modeling_qwen2.py:94 in
    forward: freqs = ...``). Unreadable or absent files place nothing.
    """
    wanted, found = set(apis), {}
    construct = _read(rank_dir / CONSTRUCT)
    if isinstance(construct, dict):
        found.update({api: f"in {construct[api]}" for api in wanted if construct.get(api)})
    stack = _read(rank_dir / STACK)
    if isinstance(stack, dict):
        for entry in stack.values():
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)):
                continue
            site = _model_frame(entry[1])
            for api in wanted.intersection(entry[0]) - found.keys():
                if site is not None:
                    found[api] = site
    return found


def calls_made_in(rank_dir: Path, api: str, functions: re.Pattern[str]) -> frozenset[str]:
    """The calls of ``api`` (``Tensor.narrow``: its keys ``Tensor.narrow.<n>.forward``) that ``rank_dir``'s
    ``stack.json`` places directly in a function whose name ``functions`` matches in full: the innermost frame that is
    not msprobe's own is that function's. Unreadable or absent files place nothing (empty)."""
    stack, found = _read(rank_dir / STACK), set()
    for entry in stack.values() if isinstance(stack, dict) else ():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)):
            continue
        calls = [c for c in entry[0] if isinstance(c, str) and c.startswith(f"{api}.")]
        name = _innermost_function(entry[1]) if calls else None
        if name is not None and functions.fullmatch(name):
            found.update(calls)
    return frozenset(found)


def _innermost_function(frames: Any) -> str | None:
    """The function of the innermost frame outside msprobe (msprobe filters its own; an older release may not)."""
    for frame in frames if isinstance(frames, list) else ():
        match = _FRAME.match(str(frame))
        if match is not None and "/msprobe/" not in match["path"]:
            return match["func"].strip()
    return None


def _model_frame(frames: Any) -> str | None:
    """``"transformers/models/qwen2/modeling_qwen2.py:94 in forward: freqs = ..."``: the innermost model-code frame."""
    for frame in frames if isinstance(frames, list) else ():
        match = _FRAME.match(str(frame))
        if match is None or any(part in match["path"] for part in _MACHINERY):
            continue
        path = re.split(r"(?:site|dist)-packages/", match["path"])[-1]
        path = "/".join(path.split("/")[-4:])  # the package's own path, not where it is installed
        code = " ".join(match["code"].split())
        code = code if len(code) <= MAX_CODE else code[: MAX_CODE - 3] + "..."
        return f"{path}:{match['line']} in {match['func'].strip()}" + (f": {code}" if code else "")
    return None
