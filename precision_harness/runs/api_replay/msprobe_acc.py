"""Everything the replay takes from msprobe's internals, in one module, behind one version guard.

Why reach in: msprobe's acc_check (``msprobe.pytorch.api_accuracy_checker``) already rebuilds an API
call from a ``task: tensor`` dump (``data_generate.gen_api_params``), runs a named API without its
hooks (``acc_check_utils.exec_api``), upcasts a bench input (``raise_bench_data_dtype``), ships CPU
bench functions for fused NPU ops (``msprobe.pytorch.dump.function_factory.get_npu_custom_functions``)
and holds the precision standards (``precision_standard``: the benchmark, ULP and absolute-threshold
compares and their NPU-against-GPU status rules, ``api_precision_compare.record_*_result``). None of
it is a public API: its command line (``msprobe acc_check``) compares a device with the CPU, not a
captured tensor with a float64 replay, and takes files, not tensors. Rewriting them would drift from
msprobe's own standards; so this module calls them, and only for the releases read (:data:`CHECKED`).

Read against mindstudio-probe 26.0.0, 26.1.0.post1 and 26.2.0 (torch 2.13.0, CPU): ``data_generate``,
``acc_check_utils``, ``compare_utils``, ``compare_column``, ``compare_input``, ``precision_standard`` and the
``record_*_result`` rules are the same code in all three (their syntax trees compared function by function), but
for two points: 26.2.0's ``BasePrecisionCompare`` reads an empty metric as 0.0 where 26.0.0's raises (the replay
never hands it an empty one), and the fused NPU ops' bench functions are a module-level ``npu_custom_functions``
before 26.2.0 and ``get_npu_custom_functions()`` from it (:func:`bench_function` reads either). The 8.x line has
no ``acc_check`` (its ``run_ut`` predates it). Another release is refused (:func:`version_problem`): the judgement
is then ``undecided`` with that reason, in one line, never a guess.
"""

from __future__ import annotations

import contextlib
import copy
import io
from importlib import metadata
from pathlib import Path
from typing import Any

from precision_harness.runs.host.package_versions import release

#: the mindstudio-probe releases whose internals this module was read against: ``(first, beyond)`` (release tuples)
CHECKED = ((26, 0, 0), (26, 3, 0))
#: that range as a reason says it, and the install line that gives it
CHECKED_RANGE = "26.0.0 to 26.2.x"
INSTALL = "pip install 'mindstudio-probe>=26.0.0,<26.3'"
#: msprobe's API-type prefixes that ``exec_api`` runs (msprobe's ``Const.*_API_TYPE_PREFIX``)
EXEC_API_PREFIXES = ("Functional", "Tensor", "Torch")
#: the msprobe standards an output is held to, by which list of ``api_precision_standard.yaml`` names it
BENCHMARK, ULP, ABSOLUTE = "benchmark", "ulp", "absolute_threshold"


def version_problem() -> str | None:
    """Why the installed msprobe cannot be used by the replay, or None."""
    try:
        found = metadata.version("mindstudio-probe")
    except metadata.PackageNotFoundError:
        return "mindstudio-probe is not installed in the replay's interpreter"
    if not CHECKED[0] <= release(found) < CHECKED[1]:
        return (
            f"mindstudio-probe {found}: the replay reads msprobe's acc_check internals of {CHECKED_RANGE} "
            f"(precision_harness/runs/api_replay/msprobe_acc.py): {INSTALL}, or read them and widen CHECKED"
        )
    return None


@contextlib.contextmanager
def _quiet():
    """msprobe logs each step at INFO on stdout: the worker's own output stays its JSON."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def api_params(entry: dict[str, Any], api_name: str, data_dir: Path) -> tuple[list[Any], dict[str, Any]]:
    """The ``(args, kwargs)`` of a captured call: ``gen_api_params`` over a dump.json entry (copied: it
    rewrites kwargs in place), tensors loaded from ``data_dir`` (``dump_tensor_data``), none requiring grad.

    Raises:
        Exception: msprobe's own (a missing or unreadable tensor file, an unsupported argument type).
    """
    from msprobe.pytorch.api_accuracy_checker.acc_check.data_generate import gen_api_params

    with _quiet():
        args, kwargs, _ = gen_api_params(
            copy.deepcopy(entry), api_name, need_grad=False, convert_type=None, real_data_path=str(data_dir)
        )
    return args, kwargs


def upcast(api_name: str, tensor: Any, dtype: Any) -> Any:
    """``tensor`` as a bench input of ``dtype`` (``raise_bench_data_dtype``: fp8 decoded, conv's HF32 kept)."""
    from msprobe.pytorch.api_accuracy_checker.acc_check.acc_check_utils import raise_bench_data_dtype

    return raise_bench_data_dtype(api_name, tensor, raise_dtype=dtype)


def bench_function(api_name: str) -> Any | None:
    """msprobe's CPU bench function of a fused NPU op (``npu_rms_norm`` ...), or None where it ships none."""
    from msprobe.pytorch.dump import function_factory

    # 26.2.0 registers them from its fusion_operator_config.yaml on first use; 26.0.0 and 26.1.x at import
    registered = getattr(function_factory, "get_npu_custom_functions", None)
    with _quiet():
        functions = registered() if registered is not None else function_factory.npu_custom_functions
    # msprobe's Register keeps its items beside the dict it subclasses: its .get() finds none
    return functions[api_name] if api_name in functions else None  # noqa: SIM401


def run_api(prefix: str, api_name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Call one API on the CPU without msprobe's hooks, as acc_check does (``exec_api``; NPU ops through
    their bench function, ``aten``/``_VF`` ops through torch itself).

    Raises:
        LookupError: no such API, or a fused NPU op without a bench function.
        Exception: the API's own error on these arguments.
    """
    import torch

    if prefix in EXEC_API_PREFIXES:
        from msprobe.pytorch.api_accuracy_checker.acc_check.acc_check_utils import ExecParams, exec_api

        with _quiet():
            return exec_api(ExecParams(prefix, api_name, "cpu", args, kwargs, False, None))
    if prefix == "NPU":
        bench = bench_function(api_name)
        if bench is None:
            release = metadata.version("mindstudio-probe")
            raise LookupError(f"mindstudio-probe {release} ships no CPU bench function for {api_name}")
        return bench(*args, **kwargs)
    if prefix == "VF":
        return getattr(torch._VF, api_name)(*args, **kwargs)
    if prefix == "Aten":
        op = torch.ops.aten
        for part in api_name.split("."):
            op = getattr(op, part)
        return op(*args, **kwargs)
    raise LookupError(f"no replay for {prefix} APIs")


def standards(api_name: str, reference: Any, outputs: tuple[Any, Any], dtype: Any) -> dict[str, str]:
    """msprobe's standards for one output: ``{"benchmark": "pass"|"error", "ulp": ..., "absolute_threshold": ...}``.

    msprobe's acc_check judges a device (NPU) output against a bench by the ratio of its error to a
    GPU's error on the same bench. Here the device is the new output and the GPU the same op replayed
    in the output's dtype: the baseline of what the op costs in that dtype. The benchmark standard
    (small-value error, RMSE, max and mean relative error ratios, ``BenchmarkPrecisionCompare``)
    applies to every float output; the ULP standard (``UlpPrecisionCompare``) to the APIs msprobe's
    ``api_precision_standard.yaml`` lists under ``ULPStandard`` (matmul, linear, ...); the absolute
    threshold (``record_absolute_threshold_result``) to those under ``AbsoluteThreshStandard``
    (element-wise ``add``, ``mul``, ...).

    Args:
        api_name: the API without prefix or call number (``linear``).
        reference: the float64 replay, a numpy float64 array.
        outputs: ``(new, baseline)``, numpy float32 arrays (bf16/fp16 widened exactly) of the reference's shape.
        dtype: the output's torch dtype.
    """
    from msprobe.pytorch.api_accuracy_checker.compare import api_precision_compare as apc
    from msprobe.pytorch.api_accuracy_checker.compare.compare_utils import absolute_standard_api, ulp_standard_api
    from msprobe.pytorch.api_accuracy_checker.precision_standard.absolute_threshold import AbsolutethdCompare
    from msprobe.pytorch.api_accuracy_checker.precision_standard.benchmark_compare import BenchmarkCompare
    from msprobe.pytorch.api_accuracy_checker.precision_standard.ulp_compare import UlpCompare

    chosen = {BENCHMARK: (BenchmarkCompare, apc.record_benchmark_compare_result)}
    if api_name in ulp_standard_api:
        chosen[ULP] = (UlpCompare, apc.record_ulp_compare_result)
    if api_name in absolute_standard_api:
        chosen[ABSOLUTE] = (AbsolutethdCompare, apc.record_absolute_threshold_result)
    with _quiet():
        return {
            name: _status(compare, record, api_name, reference, outputs, dtype)
            for name, (compare, record) in chosen.items()
        }


def _status(compare: Any, record: Any, api_name: str, reference: Any, outputs: tuple[Any, Any], dtype: Any) -> str:
    """One standard's status: the metrics of each side against the reference (msprobe's ``*Compare``),
    then its device-against-GPU rule (``record_*_result``) over the two detail rows."""
    from msprobe.pytorch.api_accuracy_checker.compare.compare_column import ApiPrecisionOutputColumn
    from msprobe.pytorch.api_accuracy_checker.compare.compare_input import PrecisionCompareInput

    new_row, baseline_row = (_detail_row(compare, api_name, reference, side, dtype) for side in outputs)
    column = ApiPrecisionOutputColumn()
    status = record(PrecisionCompareInput(new_row, baseline_row, str(dtype), column, api_name=api_name))
    return str(status).lower()


def _detail_row(compare: Any, api_name: str, reference: Any, side: Any, dtype: Any) -> dict[str, Any]:
    """One side's row of msprobe's ``accuracy_checking_details`` table (its header, ``DETAIL_TEST_ROWS``)."""
    from msprobe.pytorch.api_accuracy_checker.compare.algorithm import (
        get_abs_bench_with_eps,
        get_abs_err,
        get_rel_err_origin,
    )
    from msprobe.pytorch.api_accuracy_checker.compare.compare_column import CompareColumn
    from msprobe.pytorch.api_accuracy_checker.compare.compare_input import CompareInput
    from msprobe.pytorch.api_accuracy_checker.compare.compare_utils import DETAIL_TEST_ROWS

    column = CompareColumn()
    column.bench_type, column.npu_type, column.shape = str(reference.dtype), str(dtype), str(tuple(side.shape))
    _, abs_bench_with_eps = get_abs_bench_with_eps(reference, dtype)
    rel_err = get_rel_err_origin(get_abs_err(reference, side), abs_bench_with_eps)
    compare(CompareInput(reference, side, column, dtype, rel_err)).compare()
    return dict(zip(DETAIL_TEST_ROWS[0], [api_name, *column.to_column_value("pass", "")], strict=True))
