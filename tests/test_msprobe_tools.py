"""msprobe's own first-diff (DiffAnalyzer) and graph database, beside our verdict, without torch."""

from __future__ import annotations

import hashlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_testing import base_data, write_dump

from precision_harness.check.localize.drift_origin import DriftOrigin, OriginKind
from precision_harness.check.localize.msprobe_tools import MsprobeAnswer, analyze_failure, write_msprobe_table
from precision_harness.check.verdicts.verdict_text import Reading, msprobe_rows


def _origin(api: str) -> DriftOrigin:
    return DriftOrigin(OriginKind.API, f"{api}.output.0", api, "rank0", "actor_update", f"{api}.output.0")


def test_first_diff_names_the_op_and_imports_no_torch(dumps, tmp_path: Path) -> None:
    def triple(data):
        data["Functional.linear.0.forward"]["output"][0].update(Max=9.0, Norm=37.5)

    target, golden = dumps(tmp_path, triple)
    code = (
        "import sys, json; from pathlib import Path; "
        "from precision_harness.check.localize.msprobe_tools import analyze_failure; "
        f"a = analyze_failure(Path({str(target)!r}), Path({str(golden)!r}), "
        f"Path({str(tmp_path / 'art')!r}), graph=False); "
        "heavy = sorted(m for m in ('torch', 'msprobe.pytorch') if m in sys.modules); "
        "print(json.dumps([a.first_diff, a.errors, heavy]))"
    )
    out = (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    first, errors, heavy = json.loads(out)
    assert first == {"rank0": "Functional.linear.0.forward"} and errors == [] and heavy == []


def test_no_diff_above_msprobe_threshold(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Norm=12.5001))
    answer = analyze_failure(target, golden, tmp_path / "art", graph=False)
    assert answer.first_diff == {} and answer.errors == []
    assert msprobe_rows(Reading(msprobe=answer)) == []  # msprobe found nothing: it adds nothing


def test_msprobe_first_diff_shows_only_where_it_adds_something() -> None:
    """The same API as where the change entered: left out; another: said with what it means."""
    answer = MsprobeAnswer(first_diff={"rank0": "Functional.linear.14.backward"})
    assert msprobe_rows(Reading(origin=_origin("Functional.linear.14.backward"), msprobe=answer)) == []
    (label, text), *_ = msprobe_rows(Reading(origin=_origin("Tensor.__mul__.23.forward"), msprobe=answer))
    assert label == "msprobe 1st diff"
    assert text.startswith("Functional.linear.14.backward: the first output past DiffAnalyzer's 50 % threshold")
    assert "after the change entered" in text
    two = MsprobeAnswer(first_diff={"rank0": "Functional.linear.1.forward", "rank1": "Functional.linear.2.forward"})
    (_, text), *_ = msprobe_rows(Reading(origin=_origin("Functional.linear.1.forward"), msprobe=two))
    assert text.startswith("rank0 Functional.linear.1.forward, rank1 Functional.linear.2.forward:")


def test_graph_database_for_module_level_dump(tmp_path: Path) -> None:
    """An L0/mix dump has a module tree in construct.json: GraphBuilder writes rank0.vis.db."""
    data = base_data()
    data["Module.mlp.Linear.forward.0"] = data.pop("Functional.linear.0.forward")
    stage = tmp_path / "run" / "step_1" / "actor_update"
    dump = write_dump(stage, data)
    (dump.parent / "construct.json").write_text(
        json.dumps(
            {
                "Module.mlp.Linear.forward.0": None,
                "Functional.embedding.0.forward": None,
                "Functional.softmax.0.forward": None,
            }
        )
    )
    write_dump(tmp_path / "golden" / "step_1" / "actor_update", base_data())
    answer = analyze_failure(stage, tmp_path / "golden" / "step_1" / "actor_update", tmp_path / "art", graph=True)
    assert answer.graphs == [tmp_path / "art" / "graph" / "rank0.vis.db"] and answer.graphs[0].stat().st_size > 0, (
        answer.errors
    )
    assert ("graph", f"tensorboard --logdir {tmp_path / 'art' / 'graph'}") in msprobe_rows(
        Reading(msprobe=answer, graph_dir=tmp_path / "art" / "graph")
    )


def test_msprobe_failure_is_a_line_not_an_error(tmp_path: Path) -> None:
    stage = tmp_path / "t" / "step_1" / "s"
    write_dump(stage, base_data())  # construct.json is {} (L1): GraphBuilder refuses
    answer = analyze_failure(stage, stage, tmp_path / "art", graph=True)
    assert answer.graphs == [] and answer.errors and answer.errors[0].startswith("GraphBuilder: RuntimeError")


def _as_task(path: Path, task: str) -> None:
    """``path``'s dump.json as ``task: tensor`` writes it (each tensor row names its file: msprobe's ALL mode), or
    with each tensor's ``md5`` beside its statistics (``summary_mode: md5``: msprobe's MD5 mode)."""
    dump = json.loads(path.read_text())
    dump["task"] = "tensor" if task == "tensor" else "statistics"
    for api, entry in dump["data"].items():
        for side in ("input_args", "output"):
            for i, item in enumerate(entry.get(side, [])):
                if task == "tensor":
                    item["data_name"] = f"{api}.{side}.{i}.pt"
                else:
                    item["md5"] = hashlib.md5(repr((api, side, i, item["Norm"])).encode()).hexdigest()[:8]
    path.write_text(json.dumps(dump))


@pytest.mark.parametrize("task", ["statistics", "md5", "tensor"])
def test_a_ranks_table_is_msprobes_own_from_one_parse(dumps, tmp_path: Path, monkeypatch, task: str) -> None:
    """The compare table written beside the first diff reads byte for byte as ``msprobe compare``'s
    (:func:`write_msprobe_table`); from the first diff's own parse where the modes agree (statistics), parsed
    again where first-diff analysis changes msprobe's mode (a tensor dump reads as SUMMARY there)."""
    from msprobe.core.compare import acc_compare

    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Norm=37.5))
    if task != "statistics":
        for stage in (target, golden):
            _as_task(stage / "step0/rank0/dump.json", task)
    expected = write_msprobe_table(
        target / "step0/rank0/dump.json", golden / "step0/rank0/dump.json", tmp_path / "m.csv"
    )
    parses = []
    parse = acc_compare.ParseData.parse
    monkeypatch.setattr(acc_compare.ParseData, "parse", lambda self, paths: parses.append(paths) or parse(self, paths))
    table = tmp_path / "art" / "compare_result_rank0.csv"
    answer = analyze_failure(target, golden, tmp_path / "art", graph=False, tables={"rank0": table})
    assert answer.errors == [] and answer.tables == [table]
    assert table.read_bytes() == expected.read_bytes()
    assert len(parses) == (2 if task == "tensor" else 1)
    assert answer.first_diff == {"rank0": "Functional.linear.0.forward"}


def test_a_table_that_fails_is_a_line_and_the_first_diff_goes_on(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Norm=37.5))
    (tmp_path / "a_file").write_text("")
    answer = analyze_failure(
        target, golden, tmp_path / "art", graph=False, tables={"rank0": tmp_path / "a_file" / "table.csv"}
    )
    assert answer.first_diff == {"rank0": "Functional.linear.0.forward"} and answer.tables == []
    assert [e.split(":")[:2] for e in answer.errors] == [["compare table", " FileExistsError"]]


def _msprobe_release(monkeypatch: pytest.MonkeyPatch, **versions: str) -> None:
    """The installed distributions' versions as ``versions`` says (``mindstudio_probe="8.3.3"``), the others' real."""
    from importlib import metadata

    real = metadata.version
    wanted = {name.replace("_", "-"): v for name, v in versions.items()}
    monkeypatch.setattr(metadata, "version", lambda name: wanted.get(name) or real(name))


@pytest.mark.parametrize(
    ("numpy", "why"),
    [
        ("2.4.6", "mindstudio-probe 8.3.3 cannot run under numpy 2.4.6: it uses np.unicode_, which numpy 2 removed"),
        ("1.26.4", "mindstudio-probe 8.3.3: msprobe's analyses are not supported for this release"),
    ],
)
def test_an_unsupported_msprobe_is_one_line_naming_its_release_and_the_range(
    dumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, numpy: str, why: str
) -> None:
    """The 8.x line (CANN images ship it): msprobe's analyses say in one line that this release's are not supported,
    with the supported range and what to install; nothing of msprobe runs, no log is written."""
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=9.0))
    _msprobe_release(monkeypatch, mindstudio_probe="8.3.3", numpy=numpy)
    answer = analyze_failure(target, golden, tmp_path / "art", graph=True)
    assert answer.first_diff == {} and answer.graphs == []
    (line,) = answer.errors
    assert line.startswith(why) and "\n" not in line
    assert line.endswith("mindstudio-probe 26.0.0 to 26.2.x: pip install 'mindstudio-probe>=26.1.0'")
    assert msprobe_rows(Reading(msprobe=answer)) == [("msprobe", line)]
    assert not (tmp_path / "art" / "msprobe.log").exists()


def test_an_msprobe_whose_parse_data_takes_no_data_folders_gives_its_first_diff(
    dumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mindstudio-probe 26.0.0's ``ParseData(mode_config, rank)``: its first diff and table, not a TypeError."""
    from msprobe.core.compare import acc_compare

    takes_folders = "data_dirs" in inspect.signature(acc_compare.ParseData).parameters
    folders = [{"NPU": None, "Bench": None}] if takes_folders else []

    class ParseData260(acc_compare.ParseData):
        def __init__(self, mode_config, rank):  # 26.0.0's signature, over the installed release's
            super().__init__(mode_config, rank, *folders)

    monkeypatch.setattr(acc_compare, "ParseData", ParseData260)
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=9.0, Norm=37.5))
    table = tmp_path / "art" / "compare_result_rank0.csv"
    answer = analyze_failure(target, golden, tmp_path / "art", graph=False, tables={"rank0": table})
    assert answer.errors == [] and answer.tables == [table]
    assert answer.first_diff == {"rank0": "Functional.linear.0.forward"}


def test_an_msprobe_that_fails_names_its_release_and_no_empty_log(
    dumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release newer than those read whose compare API moved: one line naming the release and the range read; no
    log file is pointed at where msprobe wrote nothing."""
    from msprobe.core.compare import acc_compare

    class Moved:
        def __init__(self, mode_config, rank, data_dirs, backend):  # a future signature
            raise AssertionError("not reached")

    monkeypatch.setattr(acc_compare, "ParseData", Moved)
    _msprobe_release(monkeypatch, mindstudio_probe="26.3.0")
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=9.0))
    answer = analyze_failure(target, golden, tmp_path / "art", graph=False)
    (line,) = answer.errors
    assert line.startswith("DiffAnalyzer: TypeError: ") and "missing 1 required positional argument" in line
    assert line.endswith("(mindstudio-probe 26.3.0; msprobe's analyses are read against 26.0.0 to 26.2.x)")
    assert not (tmp_path / "art" / "msprobe.log").exists()
