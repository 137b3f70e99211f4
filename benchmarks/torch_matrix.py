"""The stack matrix's torch rows (the hook benchmarks/stack_matrix.py calls): the gate under real torch releases.

A torch release is a whole environment, not a few wheels on ``PYTHONPATH``: each one is installed in a venv of its
own (:func:`torch_releases.venv_python`: the registry's default wheel, whose CUDA libraries load on a machine
without a GPU and run on the CPU), and the pinned environment then runs the gate with that release's torch, and
only it, first on ``PYTHONPATH`` (:func:`torch_releases.overlay`). So a row shows what that torch alone changes
against the committed goldens, as the msprobe and transformers rows do for theirs. Where the pinned transformers
cannot run under a release, the row runs with the transformers a team on that torch runs (:data:`COMPANIONS`: a
cheap row's folder, ``.venv/stacks/<stem>``, after the torch folder), and its label says so.

Each release has two rows: ``torch-X``, the gate the matrix runs (``--gate``), and ``torch-X-verl``, verl's 2-rank
bf16 scenario (``examples/verl_cpu/scenarios/grpo_dp2_bf16_cpu.yaml``) against its committed goldens, run where
verl's own requirements (its installed metadata, extras left out) allow the row's stack (:func:`verl_conflicts`);
elsewhere it is listed as not run, with the requirement the stack does not meet.

The releases are those whose FSDP2 all-gather fill benchmarks/torch_releases.py ran on (docs/scenarios.md):
one before ``DefaultAllocMixin`` (2.6.0, whose fill patches the copy-in kernel), one between (2.8.0,
``allocate_memory``) and the newest the registry serves here (2.14.1). Each pulls about 3 GB: they run from
``python benchmarks/stack_matrix.py``, never in ``make test``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stack_matrix
import torch_releases

#: the torch releases of the matrix's torch rows
TORCH_VERSIONS = ("2.6.0", "2.8.0", "2.14.1")
#: release -> the cheap rows (constraints/stacks/ stems) its rows run with, and why. transformers 5.10.4
#: (constraints/cpu.txt) declares torch>=2.4 but reads torch.float8_e8m0fnu when modeling_utils is imported
#: (transformers/integrations/finegrained_fp8.py), a dtype torch 2.7 added: under 2.6 no model class imports.
COMPANIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "2.6.0": (
        ("transformers-4.57",),
        "transformers 5.10.4 (constraints/cpu.txt) reads torch.float8_e8m0fnu at import, which torch 2.7 added, so no"
        " model class imports under 2.6 (its torch>=2.4 requirement notwithstanding); a team on torch 2.6 runs 4.x",
    ),
}
#: verl's 2-rank bf16 scenario, run from the repository's root (examples/verl_cpu/pytest.ini is its ini file)
VERL_GATE = ("examples/verl_cpu/scenarios/grpo_dp2_bf16_cpu.yaml",)
VERL_LABEL = "verl grpo_dp2_bf16_cpu (2 ranks, bf16)"


@dataclass(frozen=True)
class TorchStack(stack_matrix.Stack):
    """A torch row's stack: the folder that puts that release's torch first on ``PYTHONPATH``, then the folders of
    the cheap rows it runs with (:data:`COMPANIONS`)."""

    overlay: Path | None = None
    companions: tuple[Path, ...] = ()

    @property
    def target(self) -> Path | None:
        return self.overlay

    @property
    def paths(self) -> tuple[Path, ...]:
        return (*super().paths, *self.companions)


def companion_pins(version: str) -> dict[str, str]:
    """The releases (canonical name -> version) that torch ``version``'s companions pin, from their constraints
    files' ``name==version`` lines.

    Raises:
        FileNotFoundError: a companion's constraints file is absent.
    """
    found = {}
    for stem in COMPANIONS.get(version, ((), ""))[0]:
        found.update(stack_matrix.file_pins(stack_matrix.STACKS / f"{stem}.txt"))
    return found


def verl_conflicts(versions: dict[str, str]) -> list[str]:
    """verl's own requirements (its installed distribution's ``Requires-Dist``, extras left out) that ``versions``
    (canonical name -> release: what a row moves) do not meet, each as ``requirement (name version here)``.

    Raises:
        importlib.metadata.PackageNotFoundError: verl is not installed.
    """
    conflicts = []
    for text in importlib.metadata.requires("verl") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = versions.get(canonicalize_name(req.name))
        if have is not None and not req.specifier.contains(have, prereleases=True):
            conflicts.append(f"{req.name}{req.specifier} ({req.name} {have} here)")
    return conflicts


def _companions_text(version: str) -> str:
    return ", ".join(f"{name} {v}" for name, v in companion_pins(version).items())


def describe(version: str) -> str:
    """torch ``version``'s rows in words: what they put on ``PYTHONPATH``, and whether verl's scenario runs."""
    text = f"torch {version} (`/tmp/torch-overlay-{version}`) first on `PYTHONPATH`"
    stems, why = COMPANIONS.get(version, ((), ""))
    if stems:
        folders = ", ".join(f"`.venv/stacks/{stem}`" for stem in stems)
        text += f", then {_companions_text(version)} ({folders}): {why}"
    why_not = verl_not_run(version)
    return text + f". {why_not or f'{_verl_torch()}; the row runs {VERL_LABEL}'}"


def _verl_torch() -> str:
    """What verl's requirements say of torch: without extras (what the stack must meet) and in its extras."""
    reqs = [Requirement(text) for text in importlib.metadata.requires("verl") or []]
    torch = [r for r in reqs if canonicalize_name(r.name) == "torch"]
    base = [str(r.specifier) or "(any)" for r in torch if r.marker is None or r.marker.evaluate({"extra": ""})]
    extras = sorted({str(r.specifier) for r in torch if r.marker is not None} - set(base))
    where = f" (its extras pin torch{', '.join(extras)})" if extras else ""
    verl = f"verl {importlib.metadata.version('verl')}"
    said = f"{verl} requires torch{', '.join(base)}" if base else f"{verl}'s own requirements name no torch"
    return f"{said}{where}, and the rest hold at constraints/cpu.txt's pins"


def verl_not_run(version: str) -> str | None:
    """Why verl's scenario does not run under torch ``version``'s stack (None: verl's requirements allow it)."""
    try:
        conflicts = verl_conflicts({"torch": version, **companion_pins(version)})
    except importlib.metadata.PackageNotFoundError:
        return "verl is not installed: pip install 'pytest-precision[verl]'"
    if not conflicts:
        return None
    verl = f"verl {importlib.metadata.version('verl')}"
    return f"{verl}'s own requirements do not allow this stack: {'; '.join(conflicts)}"


def run_torch_rows(
    version: str, settings: stack_matrix.MatrixSettings, how: Callable[[str], str | None]
) -> list[stack_matrix.Row]:
    """torch ``version``'s rows: ``settings.gate`` (``torch-X``) and verl's scenario (``torch-X-verl``) against the
    committed goldens, each run, read from an earlier run (``how(name)``: ``run``, ``reuse``) or left out (None).

    Raises:
        subprocess.CalledProcessError: the release's venv could not be built (pip, the registry).
    """
    stack = TorchStack(f"torch-{version}", "torch", "torch", version)
    verl = f"{stack.name}-verl"
    if "run" in (how(stack.name), how(verl)):
        overlay = torch_releases.overlay(torch_releases.venv_python(version))
        folders = tuple(stack_matrix.TARGETS / stem for stem in COMPANIONS.get(version, ((), ""))[0])
        stack = dataclasses.replace(stack, overlay=overlay, companions=folders)
    rows = []
    if how(stack.name) is not None:
        rows.append(_row(stack, settings, how(stack.name) == "run"))
    if how(verl) is not None:
        rows.append(_verl_row(dataclasses.replace(stack, name=verl), settings, how(verl) == "run"))
    for row in rows:
        row.companions = _companions_text(version)
    return rows


def _row(stack: TorchStack, settings: stack_matrix.MatrixSettings, run: bool) -> stack_matrix.Row:
    return stack_matrix.run_gate(stack, settings) if run else stack_matrix.reused(stack, settings)


def _verl_row(stack: TorchStack, settings: stack_matrix.MatrixSettings, run: bool) -> stack_matrix.Row:
    why_not = verl_not_run(stack.version)
    if why_not:
        row = stack_matrix.Row(stack.name, stack.kind, stack.version, "not run", why_not)
    else:
        row = _row(stack, dataclasses.replace(settings, gate=VERL_GATE), run)
    row.gate = VERL_LABEL
    return row
