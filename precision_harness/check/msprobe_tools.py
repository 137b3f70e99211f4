"""msprobe's own answers on a failing stage: its compare table, first-diff (DiffAnalyzer), the graph database.

:func:`msprobe_table` is the code behind ``msprobe compare`` (``Comparator.compare_statistics``), in
memory and torch-free; the gate writes it beside a failing verdict for reading, never to decide.

``msprobe compare -da`` builds its per-rank first-diff tables with ``pt_compare``, which imports
``msprobe.pytorch`` and torch (8 s here, and never allowed in the pytest process or the CLI's
compare path). :func:`first_diff` builds the same ``compare_result_rank<r>_*.json`` tables with the
torch-free pieces ``pt_compare`` itself uses for them (``ParseData`` -> ``compare_statistics`` ->
``FirstDiffAnalyze.check``, the ``first_diff_analyze`` branch of ``Comparator.compare_core``) and
then lets msprobe's ``DiffAnalyzer`` search them unchanged (docs/msprobe.md#first-diff-analysis). ``GraphBuilder``
(``msprobe.visualization``) is torch-free and writes the ``.vis.db`` tensorboard opens (docs/msprobe.md#graph).
:func:`analyze_failure` never raises: msprobe's answer is an opinion beside the gate's, so its own
failure becomes a line of the verdict, not an error.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from precision_harness.errors import ProbeUnavailableError

#: levels whose dumps carry a module tree in construct.json (a graph needs it; L1's is ``{}``)
GRAPH_LEVELS = ("L0", "mix")


@dataclass
class MsprobeAnswer:
    """What msprobe said about one failing stage."""

    first_diff: dict[str, str] = field(default_factory=dict)  #: rank -> first op DiffAnalyzer flags
    graphs: list[Path] = field(default_factory=list)  #: ``.vis.db`` files for tensorboard
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: what msprobe read, as the verdict says it (:attr:`~precision_harness.check.msprobe_window.Window.line`);
    #: empty where it read every failing rank whole
    scope: str = ""


def _import_msprobe_compare():
    try:
        from msprobe.core.common.utils import get_dump_mode
        from msprobe.core.compare.acc_compare import Comparator, ParseData
        from msprobe.core.compare.config import MappingConfig, ModeConfig
        from msprobe.core.compare.indicator_analysis.calculator import calculate_excel_result_df
    except ImportError as exc:
        raise ProbeUnavailableError(
            f"mindstudio-probe is not installed in this interpreter ({exc}); pip install mindstudio-probe"
        ) from None
    return get_dump_mode, Comparator, ParseData, MappingConfig, ModeConfig, calculate_excel_result_df


def msprobe_table(target: Path, golden: Path):
    """msprobe's compare table (a pandas DataFrame, one row per tensor) of two ``dump.json`` files.

    The code behind ``msprobe compare`` (``Comparator.compare_statistics``), in memory and without
    torch; its progress bars and INFO logs are swallowed. Raises ProbeUnavailableError without msprobe.
    """
    get_dump_mode, Comparator, ParseData, MappingConfig, ModeConfig, calculate_excel_result_df = (
        _import_msprobe_compare()
    )
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # msprobe's own pandas deprecations are not the user's concern
        mode = ModeConfig(dump_mode=get_dump_mode({"npu_path": str(target), "bench_path": str(golden)}))
        npu_df, bench_df = ParseData(mode, "", {"NPU": None, "Bench": None}).parse([str(target), str(golden), None])
        df = Comparator(None, mode, MappingConfig()).compare_statistics(npu_df, bench_df)
        calculate_excel_result_df(df, mode.dump_mode, "", False)
    return df


def write_msprobe_table(target: Path, golden: Path, path: Path) -> Path:
    """Write msprobe's compare table of two dump.json files (as ``msprobe compare`` would) to ``path``; return it."""
    df = msprobe_table(target, golden)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def first_diff(target_stage: Path, golden_stage: Path, out_dir: Path) -> dict[str, str]:
    """``{"rank0": op_name}``: the first op msprobe's DiffAnalyzer flags, per rank (empty: no diff).

    Args:
        target_stage, golden_stage: verl-layout stage directories (``.../<stage>``, holding ``step0/rank*``).
        out_dir: where msprobe's ``compare_result_rank*.json`` and ``diff_analyze_*.json`` go.
    """
    from msprobe.core.common.file_utils import save_json
    from msprobe.core.common.utils import get_dump_mode
    from msprobe.core.compare.acc_compare import Comparator, ParseData
    from msprobe.core.compare.config import MappingConfig, ModeConfig
    from msprobe.core.compare.diff_analyze.first_diff_analyze import FirstDiffAnalyze
    from msprobe.core.compare.find_first.analyzer import DiffAnalyzer

    class _Analyzer(DiffAnalyzer):
        def _pre_process(self) -> None:  # the tables are written below, without pt_compare
            self._resolve_input_path(self._output_path)

    out_dir.mkdir(parents=True, exist_ok=True)
    for old in list(out_dir.glob("compare_result_rank*.json")) + list(out_dir.glob("diff_analyze_*.json")):
        old.unlink()
    for t_dump in sorted(Path(target_stage).glob("step0/rank*/dump.json")):
        rank = t_dump.parent.name[4:] or "0"
        g_dump = Path(golden_stage) / "step0" / t_dump.parent.name / "dump.json"
        if not g_dump.is_file() or not rank.isdigit():
            continue
        mode = ModeConfig(
            dump_mode=get_dump_mode({"npu_path": str(t_dump), "bench_path": str(g_dump)}), first_diff_analyze=True
        )
        npu_df, bench_df = ParseData(mode, rank, {"NPU": None, "Bench": None}).parse([str(t_dump), str(g_dump), None])
        df = Comparator(None, mode, MappingConfig()).compare_statistics(npu_df, bench_df)
        for col in ("op", "peer"):
            df[f"NPU P2POp {col}"], df[f"Bench P2POp {col}"] = npu_df[col], bench_df[col]
        save_json(str(out_dir / f"compare_result_rank{rank}_0.json"), FirstDiffAnalyze(mode, rank).check(df), indent=1)
    _Analyzer(str(target_stage), str(golden_stage), str(out_dir)).analyze()
    found = sorted(out_dir.glob("diff_analyze_*.json"))
    if not found:
        return {}
    data = json.loads(found[-1].read_text(encoding="utf-8"))
    return {key.replace("rank_", "rank"): nodes[0]["op_name"] for key, nodes in sorted(data.items()) if nodes}


def build_graphs(stage_dir: Path, out_dir: Path) -> list[Path]:
    """One ``<rank>.vis.db`` per rank of an L0/mix stage dump (``GraphBuilder.build`` + ``to_db``)."""
    from msprobe.visualization.builder.graph_builder import GraphBuilder, GraphExportConfig

    paths = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for rank_dir in sorted(Path(stage_dir).glob("step0/rank*")):
        stack = rank_dir / "stack.json"
        graph = GraphBuilder.build(
            str(rank_dir / "construct.json"), str(rank_dir / "dump.json"), str(stack) if stack.is_file() else None
        )
        db = out_dir / f"{rank_dir.name}.vis.db"
        db.unlink(missing_ok=True)
        GraphBuilder.to_db(str(db), GraphExportConfig(graph, rank=int(rank_dir.name[4:] or 0), step=0))
        paths.append(db)
    return paths


def analyze_failure(
    target_stage: Path, golden_stage: Path, out_dir: Path, *, graph: bool, graph_of: Path | None = None
) -> MsprobeAnswer:
    """DiffAnalyzer's first diff, and (``graph``: L0/mix) the graph database, for one failing stage.

    ``graph_of`` is the stage folder the graph is built from (default ``target_stage``): the whole run stage,
    where the first diff reads a window of it.

    Writes under ``out_dir/first_diff/`` and ``out_dir/graph/``; msprobe's logs go to ``out_dir/msprobe.log``.
    """
    answer = MsprobeAnswer()
    t0 = time.perf_counter()
    log = io.StringIO()
    steps = [
        (
            "DiffAnalyzer",
            lambda: setattr(answer, "first_diff", first_diff(target_stage, golden_stage, out_dir / "first_diff")),
        )
    ]
    if graph:
        steps.append(
            (
                "GraphBuilder",
                lambda: setattr(answer, "graphs", build_graphs(graph_of or target_stage, out_dir / "graph")),
            )
        )
    for tool, fn in steps:
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except Exception as exc:
            message = str(exc).splitlines()[0] if str(exc) else ""
            answer.errors.append(f"{tool}: {type(exc).__name__}: {message} (log: {out_dir / 'msprobe.log'})")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "msprobe.log").write_text(log.getvalue(), encoding="utf-8")
    answer.seconds = time.perf_counter() - t0
    return answer
