"""runs/inspect_cache.py: msprobe's per-call ``inspect.stack()`` (releases before 26.1) from a process started by
``python -c`` or ``python -m`` takes the cached lookup, not a walk of ``sys.modules``, and returns the same records.

Each case runs in a fresh interpreter started as the warm workers are (``-c``, multiprocessing's forkserver) or as
``python -m`` starts a module. ``getmodule``'s walk calls ``inspect.ismodule`` once per entry of ``sys.modules``;
counting those calls shows whether the walk ran, with no timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent(
    """
    import inspect, json, sys
    from precision_harness.runs import inspect_cache

    def records():
        return [(f.filename, f.lineno, f.function, f.code_context) for f in inspect.stack()]

    def walked():
        calls = 0
        real = inspect.ismodule
        def counting(obj):
            nonlocal calls
            calls += 1
            return real(obj)
        inspect.ismodule = counting
        try:
            depth = len(inspect.stack())
        finally:
            inspect.ismodule = real
        return calls, depth

    def main():
        taken, entered = [], []
        for seeded in (False, True):
            if seeded:
                entered = inspect_cache.seed()
            taken.append((records(), walked()))
        (before, (walked_before, depth)), (after, (walked_after, _)) = taken
        print(json.dumps(dict(entered=entered, same=before == after, depth=depth, modules=len(sys.modules),
                              walked_before=walked_before, walked_after=walked_after)))

    main()
    """
)


def _probe(how: str, tmp_path: Path) -> dict:
    if how == "-c":
        argv = [sys.executable, "-c", PROBE]
    else:
        (tmp_path / "stack_probe.py").write_text(PROBE)
        argv = [sys.executable, "-m", "stack_probe"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(proc.stdout)


@pytest.mark.parametrize(("how", "pseudo"), [("-c", "<string>"), ("-m", "<frozen runpy>")])
def test_a_stack_from_no_file_is_looked_up_in_the_cache_with_the_same_records(
    how: str, pseudo: str, tmp_path: Path
) -> None:
    probe = _probe(how, tmp_path)
    assert pseudo in probe["entered"], probe
    assert probe["same"], probe
    # unseeded: at least one walk of sys.modules; seeded: getmodule's own first check, a few calls a frame
    assert probe["walked_after"] <= 8 * probe["depth"] < probe["modules"] <= probe["walked_before"], probe


def test_a_python_it_was_not_read_against_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from precision_harness.runs import inspect_cache

    monkeypatch.setattr(inspect_cache, "CHECKED_PYTHON", ())
    monkeypatch.setattr(inspect, "modulesbyfile", {})
    assert inspect_cache.seed() == []
    assert inspect.modulesbyfile == {}
