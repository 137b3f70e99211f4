"""msprobe's own answers on a failing stage: its compare table, first-diff (DiffAnalyzer), the graph database.

:func:`msprobe_table` is the code behind ``msprobe compare`` (``Comparator.compare_statistics``), in
memory and torch-free; the gate writes it beside a failing verdict for reading, never to decide.

``msprobe compare -da`` builds its per-rank first-diff tables with ``pt_compare``, which imports
``msprobe.pytorch`` and torch (8 s here, and never allowed in the pytest process or the CLI's
compare path). :func:`first_diff` builds the same ``compare_result_rank<r>_*.json`` tables with the
torch-free pieces ``pt_compare`` itself uses for them (``ParseData`` -> ``compare_statistics`` ->
``FirstDiffAnalyze.check``, the ``first_diff_analyze`` branch of ``Comparator.compare_core``) and
then lets msprobe's ``DiffAnalyzer`` search them unchanged (docs/msprobe.md#first-diff-analysis); a rank's compare
table beside it comes from the same parse and compare where msprobe's mode reads it alike. ``GraphBuilder``
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.check.localize import msprobe_release
from precision_harness.errors import ProbeUnavailableError

#: levels whose dumps carry a module tree in construct.json (a graph needs it; L1's is ``{}``)
GRAPH_LEVELS = ("L0", "mix")


@dataclass
class MsprobeAnswer:
    """What msprobe said about one failing stage."""

    first_diff: dict[str, str] = field(default_factory=dict)  #: rank -> first op DiffAnalyzer flags
    graphs: list[Path] = field(default_factory=list)  #: ``.vis.db`` files for tensorboard
    tables: list[Path] = field(default_factory=list)  #: msprobe's compare tables (``compare_result_rank<r>.csv``)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: what msprobe read, as the verdict says it (:attr:`~precision_harness.check.localize.msprobe_window.Window.line`);
    #: empty where it read every failing rank whole
    scope: str = ""


def _import_msprobe_compare():
    try:
        from msprobe.core.common.utils import get_dump_mode
        from msprobe.core.compare.acc_compare import Comparator, ParseData
        from msprobe.core.compare.config import MappingConfig, ModeConfig
    except ImportError as exc:
        raise ProbeUnavailableError(
            f"mindstudio-probe is not installed in this interpreter ({exc}); pip install mindstudio-probe"
        ) from None
    return get_dump_mode, Comparator, ParseData, MappingConfig, ModeConfig


def preload() -> None:
    """Import what :func:`analyze_failure` runs of msprobe (its compare, first diff and result columns: pandas among
    them), quietly; nothing where msprobe is not installed (:func:`analyze_failure` then says so in its answer).
    A worker process ahead of its stage calls it (:mod:`~precision_harness.check.localize.msprobe_worker`)."""
    with contextlib.suppress(ImportError, ProbeUnavailableError), _quiet(io.StringIO()):
        _import_msprobe_compare()
        from msprobe.core.compare.diff_analyze.first_diff_analyze import FirstDiffAnalyze  # noqa: F401
        from msprobe.core.compare.find_first.analyzer import DiffAnalyzer  # noqa: F401
        from msprobe.core.compare.indicator_analysis.calculator import calculate_excel_result_df  # noqa: F401


@dataclass
class _Compared:
    """One rank pair through msprobe's compare: its mode, its two parses and ``compare_statistics``' table."""

    dump_mode: str  #: ``get_dump_mode``'s, as read (``compare_statistics`` may change the mode's for a first diff)
    mode: Any  #: ``ModeConfig``
    npu_df: Any  #: pandas DataFrames, one row per tensor
    bench_df: Any
    table: Any

    @property
    def summary(self) -> bool:
        """Whether msprobe's compare table reads the same with first-diff analysis on as off: statistics and md5
        dumps (``compare_statistics`` turns a tensor dump's mode into SUMMARY for the first diff)."""
        from msprobe.core.common.const import Const

        return self.dump_mode in (Const.SUMMARY, Const.MD5)


def _compare(target: Path, golden: Path, rank: str, *, first_diff: bool) -> _Compared:
    """``ParseData`` then ``Comparator.compare_statistics`` of two dump.json files, as ``msprobe compare`` (and, with
    ``first_diff``, ``msprobe compare -da``: the parse keeps the P2P columns FirstDiffAnalyze reads) runs them."""
    get_dump_mode, Comparator, ParseData, MappingConfig, ModeConfig = _import_msprobe_compare()
    dump_mode = get_dump_mode({"npu_path": str(target), "bench_path": str(golden)})
    mode = ModeConfig(dump_mode=dump_mode, first_diff_analyze=first_diff)
    parse = msprobe_release.parse_data(ParseData, mode, rank)  # its signature changed in 26.1.0
    npu_df, bench_df = parse.parse([str(target), str(golden), None])
    table = Comparator(None, mode, MappingConfig()).compare_statistics(npu_df, bench_df)
    return _Compared(dump_mode, mode, npu_df, bench_df, table)


def _with_results(compared: _Compared):
    """msprobe's compare table with its Result and Err_message columns filled (``calculate_excel_result_df``)."""
    from msprobe.core.compare.indicator_analysis.calculator import calculate_excel_result_df

    table = compared.table.copy()
    calculate_excel_result_df(table, compared.dump_mode, "", False)
    return table


@contextlib.contextmanager
def _quiet(log: io.StringIO):
    """msprobe's progress bars, INFO logs and its own pandas deprecations into ``log``, not the user's terminal."""
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def msprobe_table(target: Path, golden: Path):
    """msprobe's compare table (a pandas DataFrame, one row per tensor) of two ``dump.json`` files.

    The code behind ``msprobe compare`` (``Comparator.compare_statistics``), in memory and without
    torch; its progress bars and INFO logs are swallowed. Raises ProbeUnavailableError without msprobe.
    """
    with _quiet(io.StringIO()):
        return _with_results(_compare(target, golden, "", first_diff=False))


def write_msprobe_table(target: Path, golden: Path, path: Path) -> Path:
    """Write msprobe's compare table of two dump.json files (as ``msprobe compare`` would) to ``path``; return it."""
    return _write_csv(msprobe_table(target, golden), path)


def _write_csv(table, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return path


def first_diff(target_stage: Path, golden_stage: Path, out_dir: Path) -> dict[str, str]:
    """``{"rank0": op_name}``: the first op msprobe's DiffAnalyzer flags, per rank (empty: no diff).

    Args:
        target_stage, golden_stage: verl-layout stage directories (``.../<stage>``, holding ``step0/rank*``).
        out_dir: where msprobe's ``compare_result_rank*.json`` and ``diff_analyze_*.json`` go.
    """
    answer = MsprobeAnswer()
    with _quiet(io.StringIO()):
        _first_diff(_Stages(target_stage, golden_stage, out_dir), answer)
    return answer.first_diff


@dataclass(frozen=True)
class _Stages:
    """What :func:`analyze_failure` reads and writes: the two stage folders, ``out_dir``, and ``tables`` (rank
    folder name -> where that rank's msprobe compare table goes)."""

    target: Path
    golden: Path
    out_dir: Path  #: where msprobe's ``compare_result_rank*.json`` and ``diff_analyze_*.json`` go
    tables: Mapping[str, Path] = field(default_factory=dict)


def _first_diff(stages: _Stages, answer: MsprobeAnswer) -> None:
    """:func:`first_diff` into ``answer.first_diff``, and each rank in ``stages.tables`` its compare table from the
    same parse and compare (a table that fails is a line of ``answer.errors``, the first diff goes on)."""
    from msprobe.core.compare.diff_analyze.first_diff_analyze import FirstDiffAnalyze
    from msprobe.core.compare.find_first.analyzer import DiffAnalyzer

    class _Analyzer(DiffAnalyzer):
        def _pre_process(self) -> None:  # the tables are written below, without pt_compare
            self._resolve_input_path(self._output_path)

    out_dir = stages.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in list(out_dir.glob("compare_result_rank*.json")) + list(out_dir.glob("diff_analyze_*.json")):
        old.unlink()
    for t_dump in sorted(Path(stages.target).glob("step0/rank*/dump.json")):
        rank = t_dump.parent.name[4:] or "0"
        g_dump = Path(stages.golden) / "step0" / t_dump.parent.name / "dump.json"
        if not g_dump.is_file() or not rank.isdigit():
            continue
        compared = _compare(t_dump, g_dump, rank, first_diff=True)
        if t_dump.parent.name in stages.tables:
            _table_of(compared, (t_dump, g_dump), stages.tables[t_dump.parent.name], answer)
        df = compared.table
        for col in ("op", "peer"):
            df[f"NPU P2POp {col}"], df[f"Bench P2POp {col}"] = compared.npu_df[col], compared.bench_df[col]
        # json.dumps (C encoder): json.dump, as msprobe's save_json calls it, encodes in Python at 0.2 s a window
        (out_dir / f"compare_result_rank{rank}_0.json").write_text(
            json.dumps(FirstDiffAnalyze(compared.mode, rank).check(df)), encoding="utf-8"
        )
    _Analyzer(str(stages.target), str(stages.golden), str(out_dir)).analyze()
    found = sorted(out_dir.glob("diff_analyze_*.json"))
    data = json.loads(found[-1].read_text(encoding="utf-8")) if found else {}
    answer.first_diff = {
        key.replace("rank_", "rank"): nodes[0]["op_name"] for key, nodes in sorted(data.items()) if nodes
    }


def _table_of(compared: _Compared, dumps: tuple[Path, Path], path: Path, answer: MsprobeAnswer) -> None:
    """msprobe's compare table of one rank to ``path``: from the first diff's compare where it reads the same
    (:attr:`_Compared.summary`), else compared again as ``msprobe compare`` compares."""
    try:
        table = _with_results(compared) if compared.summary else _with_results(_compare(*dumps, "", first_diff=False))
        answer.tables.append(_write_csv(table, path))
    except Exception as exc:  # msprobe's opinion, never the verdict's error
        answer.errors.append(f"compare table: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


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
    target_stage: Path,
    golden_stage: Path,
    out_dir: Path,
    *,
    graph: bool,
    graph_of: Path | None = None,
    tables: Mapping[str, Path] | None = None,
) -> MsprobeAnswer:
    """DiffAnalyzer's first diff, msprobe's compare table of the ranks in ``tables``, and (``graph``: L0/mix) the
    graph database, for one failing stage.

    ``graph_of`` is the stage folder the graph is built from (default ``target_stage``): the whole run stage,
    where the first diff reads a window of it. ``tables`` maps a rank folder (``rank0``) to its table's csv path;
    a rank's table comes from the same parse and ``compare_statistics`` as its first diff (one each, not two).

    Writes under ``out_dir/first_diff/`` and ``out_dir/graph/``; msprobe's logs go to ``out_dir/msprobe.log`` (none
    where it logged nothing). A release the analyses do not support
    (:mod:`~precision_harness.check.localize.msprobe_release`) gets one line in ``errors``, and nothing is run.
    """
    answer = MsprobeAnswer()
    t0 = time.perf_counter()
    unsupported = msprobe_release.analyses_problem()
    if unsupported is not None:  # one line, and nothing of msprobe's run
        answer.errors.append(unsupported)
        return answer
    log = io.StringIO()
    stages = _Stages(target_stage, golden_stage, out_dir / "first_diff", dict(tables or {}))
    steps = [("DiffAnalyzer", lambda: _first_diff(stages, answer))]
    if graph:
        steps.append(
            (
                "GraphBuilder",
                lambda: setattr(answer, "graphs", build_graphs(graph_of or target_stage, out_dir / "graph")),
            )
        )
    failed = []
    for tool, fn in steps:
        try:
            with _quiet(log):
                fn()
        except Exception as exc:
            message = str(exc).splitlines()[0] if str(exc) else ""
            failed.append(f"{tool}: {type(exc).__name__}: {message}{msprobe_release.unread()}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "msprobe.log"
    path.unlink(missing_ok=True)
    if log.getvalue():  # a log is named only where msprobe wrote one
        path.write_text(log.getvalue(), encoding="utf-8")
    answer.errors += [f"{line} (log: {path})" if path.is_file() else line for line in failed]
    answer.seconds = time.perf_counter() - t0
    return answer
