"""The run's environment against the golden's: what differs, in the words a verdict prints.

Pure and torch-free. Both sides are ``env`` maps: a golden manifest's (copied from the recording
run's ``run.json``) and the checked run's, as :func:`precision_harness.runs.numerics.devices.fingerprint`
or a command scenario's ``run.json`` wrote them. :meth:`EnvironmentDiff.between` lists what
changed, package versions first, then the accelerator, the CPU (model and the ISA flags that
differ), BLAS, threads and determinism settings:

    torch 2.13.0+cpu -> 2.14.0+cpu; CPU AMD EPYC 7B13 (avx2) -> Intel Xeon (avx512_bf16, amx_bf16)

A field one side does not record (a golden recorded before the gate recorded the machine) reads
``not recorded`` and does not, alone, make the environment "differ": it is shown, not alarming.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from precision_harness.runs.host import stack
from precision_harness.runs.host.machine import ISA_FLAGS
from precision_harness.runs.host.rank_env import RAY_NODE
from precision_harness.runs.verl import fsdp2_buffers

NOT_RECORDED = "not recorded"

#: the rollout engines a golden's stack records (:data:`precision_harness.runs.host.stack.PACKAGES`)
ROLLOUT_ENGINES = ("vllm", "vllm-ascend", "sglang")

#: the combined CPU entry (cpu_vendor, cpu_model, cpu_flags) in :data:`ORDER`
_CPU = "<cpu>"
CPU_KEYS = ("cpu_vendor", "cpu_model", "cpu_flags")

#: fingerprint keys in the order a verdict names them, with their labels; other keys follow, sorted
ORDER: dict[str, str] = {
    # the device stack an upgrade moves, first: it is what a user upgrades and what explains a drift
    "torch": "torch",
    "torch_npu": "torch_npu",
    "cann": "CANN",
    "npu_driver": "NPU driver",
    "cuda": "CUDA",
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "cuda_driver": "CUDA driver",
    "nvidia_driver": "NVIDIA driver",
    # then the frameworks over it
    "transformers": "transformers",
    "verl": "verl",
    "vllm": "vllm",
    "vllm-ascend": "vllm-ascend",
    "sglang": "sglang",
    "mindstudio-probe": "mindstudio-probe",
    "numpy": "numpy",
    "ray": "ray",
    "python": "python",
    # then the hardware and the settings
    "device": "device",
    "gpu_count": "GPUs",
    "gpu_capability": "compute capability",
    "npu_count": "NPUs",
    _CPU: "CPU",
    "cpu_capability": "CPU capability",
    "machine": "machine",
    "blas": "BLAS",
    "onednn": "oneDNN",
    "cpu_kernels": "CPU kernels",
    "num_threads": "threads",
    "deterministic_algorithms": "deterministic algorithms",
    "tf32": "TF32",
    "determinism_env": "determinism env",
}

#: the software stack a code path comes from: an upgrade of one of these can insert, remove or replace calls
SOFTWARE = frozenset(
    ORDER[k]
    for k in ("torch", "torch_npu", "cann", "cuda", "cudnn", "transformers", "verl", "vllm", "vllm-ascend", "sglang")
)

#: the label of the accelerator model (:func:`precision_harness.runs.host.stack.model_of`), named before anything else:
#: a golden is not reused across models silently
MODEL = "accelerator model"

#: keys that are not the environment: a command scenario's argv is part of the scenario (its hash),
#: and it names this machine's interpreter path; a verl rank's FSDP2 fill follows from the torch named above, and the
#: compare reads it itself (:mod:`precision_harness.check.compare.unfilled`); the Ray node a rank ran on is where it
#: ran (a fresh id for every cluster), not what it ran with; each also as another rank's ``<key>@rank<r>``
IGNORED = frozenset({"command", fsdp2_buffers.ENV_MODULE, fsdp2_buffers.ENV_FILL, RAY_NODE})
#: the model's own key and each device's raw reading of it: one :data:`MODEL` change says them all
_MODEL_READINGS = frozenset({stack.MODEL_KEY, *stack.RAW_MODEL_KEYS.values()})


@dataclass(frozen=True)
class Change:
    """One field that differs: its label and each side's value (None: that side does not record it)."""

    what: str
    golden: str | None
    run: str | None

    @property
    def recorded(self) -> bool:
        """Both sides record the field (so the values really differ, rather than one being unknown)."""
        return self.golden is not None and self.run is not None

    def __str__(self) -> str:
        return f"{self.what} {self.golden or NOT_RECORDED} -> {self.run or NOT_RECORDED}"


@dataclass(frozen=True)
class EnvironmentDiff:
    """What differs between a golden's environment and a run's, recorded changes first."""

    changes: tuple[Change, ...] = ()

    @classmethod
    def between(cls, golden_env: Mapping[str, Any] | None, run_env: Mapping[str, Any] | None) -> EnvironmentDiff:
        """The changes from ``golden_env`` to ``run_env``; none when either side records no environment
        at all (a directory without run.json: nothing is known, so nothing is claimed)."""
        if not golden_env or not run_env:
            return cls()
        changes = list(_changes(golden_env, run_env))
        return cls(tuple(sorted(changes, key=lambda c: not c.recorded)))  # stable: order kept within each group

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]] | None) -> EnvironmentDiff:
        """The inverse of :meth:`to_json` (report records)."""
        return cls(tuple(Change(r["what"], r["golden"], r["run"]) for r in rows or ()))

    def to_json(self) -> list[dict[str, Any]]:
        """``[{"what", "golden", "run"}, ...]``, as report.json keeps it."""
        return [{"what": c.what, "golden": c.golden, "run": c.run} for c in self.changes]

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def differs(self) -> bool:
        """Some field both sides record has another value (``not recorded`` alone does not count)."""
        return any(c.recorded for c in self.changes)

    @property
    def summary(self) -> str:
        """``"torch 2.13.0+cpu -> 2.14.0+cpu; CPU not recorded -> AMD EPYC 7B13 (avx2)"``."""
        return "; ".join(map(str, self.changes))

    @property
    def device_model(self) -> Change | None:
        """The accelerator model change (GPU or NPU) on the same device type, else None.

        A golden that does not record its model (older goldens) cannot be told apart: None.
        """
        if any(c.what == ORDER["device"] for c in self.changes):
            return None  # another device type: cross-device already
        return next((c for c in self.changes if c.what == MODEL and c.recorded), None)

    @property
    def model_line(self) -> str | None:
        """``"recorded on H100 80GB HBM3, checked on H200 (another accelerator model)"``: another model of the same
        device, said before anything else (None: the same model, or one side does not record it)."""
        model = self.device_model
        return f"recorded on {model.golden}, checked on {model.run} (another {MODEL})" if model is not None else None

    @property
    def besides_model(self) -> EnvironmentDiff:
        """The changes other than :attr:`device_model`'s."""
        model = self.device_model
        return EnvironmentDiff(tuple(c for c in self.changes if c is not model))

    @property
    def software(self) -> list[Change]:
        """The recorded changes of the software stack (:data:`SOFTWARE`): what can change a code path."""
        return [c for c in self.changes if c.recorded and c.what in SOFTWARE]

    def headline(self) -> str | None:
        """The line a failing verdict puts first after its headline (None: nothing differs); another accelerator
        model leads it (:attr:`model_line`)."""
        rest = self.besides_model
        if rest.differs:
            line = f"environment differs from the golden's: {rest.summary}"
        else:
            line = f"environment not fully recorded: {rest.summary}" if rest.changes else None
        return "; ".join(filter(None, (self.model_line, line))) or None


def grouped(rows_by_scenario: Iterable[tuple[str, list[dict[str, Any]]]]) -> list[tuple[EnvironmentDiff, list[str]]]:
    """Scenarios grouped by the same environment difference (:meth:`EnvironmentDiff.to_json` rows), first
    seen first; scenarios without one are left out. A report says each difference once, not per item."""
    groups: dict[str, list[str]] = {}
    for name, rows in rows_by_scenario:
        if rows:
            groups.setdefault(json.dumps(rows, sort_keys=True), []).append(name)
    return [(EnvironmentDiff.from_json(json.loads(key)), names) for key, names in groups.items()]


def diff(golden_env: Mapping[str, Any] | None, run_env: Mapping[str, Any] | None) -> list[str]:
    """``["torch 2.13.0+cpu -> 2.14.0+cpu", "CPU not recorded -> AMD EPYC 7B13 (avx2)", ...]``."""
    return [str(c) for c in EnvironmentDiff.between(golden_env, run_env).changes]


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _changes(golden: Mapping[str, Any], run: Mapping[str, Any]) -> Iterator[Change]:
    yield from _plain(MODEL, stack.model_of(golden), stack.model_of(run))  # first: a golden per model
    for key, label in ORDER.items():
        if key == _CPU:
            yield from _cpu(golden, run)
        elif key == "determinism_env":
            yield from _determinism(_text(golden.get(key)), _text(run.get(key)))
        else:
            yield from _plain(label, golden.get(key), run.get(key))
    for key in sorted((set(golden) | set(run)) - set(ORDER) - set(CPU_KEYS) - _MODEL_READINGS):
        if key.partition("@")[0] not in IGNORED:  # ``<key>@rank<r>``: where another rank records another value
            yield from _plain(key, golden.get(key), run.get(key))


def _plain(label: str, golden: Any, run: Any) -> Iterator[Change]:
    g, r = _text(golden), _text(run)
    if g != r:
        yield Change(label, g, r)


def _flags(env: Mapping[str, Any]) -> set[str] | None:
    flags = _text(env.get("cpu_flags"))
    return None if flags is None or flags == "unknown" else set(flags.split())


def _cpu_side(env: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    """``"AMD EPYC 7B13 (avx2)"``: the model and the ISA flags the other side lacks (all, if it records none)."""
    model = _text(env.get("cpu_model"))
    mine, theirs = _flags(env), _flags(other)
    if model is None and mine is None:
        return None
    shown = sorted(mine - (theirs or set()), key=_flag_order) if mine else []
    return f"{model or 'unknown'}" + (f" ({', '.join(shown)})" if shown else "")


def _flag_order(flag: str) -> tuple[int, str]:
    return (ISA_FLAGS.index(flag) if flag in ISA_FLAGS else len(ISA_FLAGS), flag)


def _cpu(golden: Mapping[str, Any], run: Mapping[str, Any]) -> Iterator[Change]:
    if all(_text(golden.get(k)) == _text(run.get(k)) for k in CPU_KEYS):
        return
    g, r = _cpu_side(golden, run), _cpu_side(run, golden)
    if g == r and g is not None:  # same model and flags, another vendor string: say which
        g, r = f"{g} [{golden.get('cpu_vendor')}]", f"{r} [{run.get('cpu_vendor')}]"
    yield Change(ORDER[_CPU], g, r)


def _variables(settings: str) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in settings.split())


def _determinism(golden: str | None, run: str | None) -> Iterator[Change]:
    """One change per determinism variable that differs; the whole setting where one side has none."""
    if golden == run:
        return
    if golden is None or run is None:
        yield Change(ORDER["determinism_env"], golden, run)
        return
    g, r = _variables(golden), _variables(run)
    for name in sorted(set(g) | set(r)):
        if g.get(name) != r.get(name):
            yield Change(name, g.get(name), r.get(name))


def rollout_engine_line(env: EnvironmentDiff, run_env: Mapping[str, Any] | None, name: str) -> str:
    """The first line of a verdict about the rollout engine ``name`` (``actor_rollout_ref.rollout.name``): its
    version change since the golden, else its version, unchanged (:data:`ROLLOUT_ENGINES` as the run's stack
    recorded them), else that the run's stack holds none of them (the gate's CPU server is this checkout's code)."""
    changed = [str(c) for c in env.changes if c.what in ROLLOUT_ENGINES]
    if changed:
        return f"rollout engine {name}: {'; '.join(changed)} since the golden"
    versions = [f"{p} {run_env[p]}" for p in ROLLOUT_ENGINES if run_env and run_env.get(p)]
    if versions:
        return f"rollout engine {name}: {', '.join(versions)}, unchanged since the golden"
    return f"rollout engine {name}: no version of {', '.join(ROLLOUT_ENGINES)} in the run's stack"
