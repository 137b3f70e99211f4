"""The replay of a failing stage whose change entered at an API: capture its tensors, confirm, replay, judge.

For a stage classified ``api`` (:mod:`precision_harness.check.localize.drift_origin`): an API whose inputs
match the golden's gives other outputs; and for one classified ``code_path`` whose changed block is
one run call that replaced golden calls (a fused op for a decomposition) with inputs equal to the
golden block's: that call is judged against the golden block's output in its place
(:func:`block_rows`), else the judgement says why not (:func:`block_not_replayable`). :func:`judge_outcome`

1. picks the calls to judge (:func:`calls_to_judge`): that API, then the next few divergent APIs
   whose inputs all match (where the first cannot be replayed: a collective, an RNG op), replayable
   by name (:mod:`precision_harness.runs.api_replay.names`);
2. reruns the scenario to the stage's step with msprobe's ``task: tensor`` scoped to those calls
   (``list``; :meth:`~precision_harness.scenarios.base.ScenarioBase.capture_overrides`), through the
   session's own runner, so it works for every kind of scenario and for ``level: auto``'s L1
   localisation alike;
3. confirms each call: the rerun reproduced the checked run's statistics of it (else the kernel is
   not deterministic), and its inputs match the golden's statistic for statistic (the golden keeps no
   tensors: "inputs matched by statistics");
4. replays the confirmed calls in a worker (:mod:`precision_harness.runs.api_replay`) and judges the
   first one replayed (:func:`precision_harness.check.verdicts.judgement.judge`).

Whatever stops it on the way is an ``undecided`` judgement with its reason, never a guess. Only the
judged call's tensors are kept (``<out_dir>/run/step_<n>/<stage>/step0/<rank>/dump_tensor_data``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from precision_harness.check.compare.code_path import CodePathChange
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.item_key import ItemKey
from precision_harness.check.localize.drift_origin import DriftOrigin, OriginKind
from precision_harness.check.verdicts.items import Outcome
from precision_harness.check.verdicts.judgement import Judgement, held_back, judge
from precision_harness.check.verdicts.verdict_text import with_judgement as text_with_judgement
from precision_harness.dumps.files import load_dump
from precision_harness.dumps.pairing import aligned_golden, pair_calls
from precision_harness.dumps.rows import numel, row_statistics, rows
from precision_harness.dumps.stage import StageSource
from precision_harness.errors import PrecisionError
from precision_harness.runs.api_replay import launch, names
from precision_harness.runs.kind_runners import Run
from precision_harness.scenarios.scenario import Scenario

#: the kinds of change a replay judges: an API whose inputs match, a changed code path (one run call)
_JUDGED = (OriginKind.API, OriginKind.CODE_PATH)
#: calls captured and judged per stage at most: the API where the change entered and the next ones
MAX_CALLS = 3
#: where the capture keeps its tensors beside each rank's dump.json (msprobe's folder)
TENSOR_DIR = "dump_tensor_data"
#: dtypes whose four statistics the golden keeps (msprobe records Max and Min only for the others)
FLOAT_DTYPES = ("torch.float", "torch.bfloat16", "torch.half", "torch.double")


@dataclass(frozen=True)
class Call:
    """One output of one API call to judge: the dump.json key and msprobe's row name of the output."""

    api: str
    output: str


@dataclass(frozen=True)
class StagePair:
    """The failing stage on both sides: the checked run's and the golden's (its L1 record, at ``level: auto``)."""

    target: StageSource
    golden: StageSource


@dataclass(frozen=True)
class ReplaySettings:
    """How the capture and the replay run: where their files go, the session's runner, the time limit (s)."""

    out_dir: Path
    run: Run
    timeout: float | None = None
    warm: bool = False  #: fork the replay worker from the session's warm server where it is up


def calls_to_judge(verdict: StageVerdict, origin: DriftOrigin, target: StageSource) -> list[Call]:
    """The API where the change entered, then the next APIs (execution order, same rank) whose inputs all
    equal the golden's and whose outputs do not, :data:`MAX_CALLS` at most, the first output that differs each.

    Raises:
        GoldenCorruptError: the target's dump is unreadable.
    """
    ratios = {
        name: ratio for rank, _, name, ratio in sorted(verdict.profile, key=lambda p: p[1]) if rank == origin.rank
    }
    table = rows(target.load(origin.rank))
    calls, apis = [Call(origin.api, origin.row)], _in_order(table, after=origin.api)
    for api in apis:
        if len(calls) >= MAX_CALLS:
            break
        mine = [(name, row.get("state")) for name, row in table.items() if row["api"] == api]
        inputs_equal = all(ratios.get(name, 0.0) == 0 for name, state in mine if state == "input")
        changed = [name for name, state in mine if state == "output" and ratios.get(name, 0.0) > 0]
        if inputs_equal and changed:
            calls.append(Call(api, changed[0]))
    return calls


def _in_order(table: dict[str, dict[str, Any]], *, after: str) -> list[str]:
    """The APIs of a rank's rows after ``after``, in execution order."""
    apis = list(dict.fromkeys(row["api"] for row in table.values()))
    return apis[apis.index(after) + 1 :] if after in apis else []


@dataclass(frozen=True)
class JudgeRequest:
    """What the session knows of one failing stage to judge: its scenario, item, both sides, how to rerun."""

    scenario: Scenario
    key: ItemKey
    pair: StagePair
    settings: ReplaySettings


def judge_outcome(out: Outcome, request: JudgeRequest, *, claim: Callable[[], ItemKey | None]) -> Outcome:
    """``out`` with its judgement (module docstring), or as it is where its change did not enter at an API.

    ``claim()`` is asked before a capture rerun: it marks this stage as the run's replayed one, or returns the
    stage that was (then this one is not rerun, and says so). A stage whose APIs cannot be replayed needs no
    rerun and is judged at once. Never raises for what a run or the replay can fail with (``undecided``).
    """
    judged = judged_outcome(out)
    origin, verdict = judged.origin, judged.verdict
    if origin is None or origin.kind not in _JUDGED or not isinstance(verdict, StageVerdict):
        return out
    if origin.code_path is not None:
        why = block_not_replayable(origin.code_path, request.pair)
        if why is not None:
            return with_judgement(out, Judgement.undecided(origin.api, why))
        calls = [Call(origin.api, origin.row)]
    else:
        calls = calls_to_judge(verdict, origin, request.pair.target)
    calls = [c for c in calls if names.why_not_replayable(c.api) is None]
    if not calls:
        return with_judgement(out, Judgement.undecided(origin.api, names.why_not_replayable(origin.api) or "no replay"))
    first = claim()
    if first is not None:
        return not_replayed(out, first)
    t0 = time.perf_counter()
    try:
        judgement = _capture_and_judge(request, origin, calls)
    except PrecisionError as exc:
        judgement = Judgement.undecided(origin.api, f"the capture rerun failed: {exc}")
    _write(request.settings.out_dir, judgement, seconds=time.perf_counter() - t0)
    return with_judgement(out, judgement)


def _capture_and_judge(request: JudgeRequest, origin: DriftOrigin, calls: list[Call]) -> Judgement:
    """Rerun with the calls' tensors captured, confirm each, replay the confirmed, judge the first replayed."""
    scenario, key, pair, settings = request.scenario, request.key, request.pair, request.settings
    assert key.step is not None and key.stage is not None
    overrides = scenario.capture_overrides(key.step, key.stage, [c.api for c in calls])
    tag = f"capture-step_{key.step}-{key.stage}"
    variant = scenario.with_overrides(overrides, directory=settings.out_dir, name=scenario.name, tag=tag)
    result = settings.run(variant, settings.out_dir / "run")
    rank_dir = result.run_dir / f"step_{key.step}" / key.stage / "step0" / origin.rank
    captured = rows(load_dump(rank_dir / "dump.json"))
    checked, golden = _paired_rows(pair, origin)
    reasons: dict[str, str] = {}
    confirmed = []
    for call in calls:
        why = _unconfirmed(call.api, captured, checked, golden)
        if why is None:
            confirmed.append(call)
        else:
            reasons[call.api] = why
    results = (
        launch.replay_calls(
            rank_dir,
            [{"api": c.api, "output": c.output, "golden_dtype": golden[c.output].get("dtype")} for c in confirmed],
            out_dir=settings.out_dir,
            timeout=settings.timeout,
            warm=settings.warm,
        )
        if confirmed
        else []
    )
    for call, result in zip(confirmed, results, strict=True):
        if result.get("replayable"):
            _keep_tensors(rank_dir, call.api)
            judgement = judge(call.api, result, row_statistics(golden[call.output]))
            judgement = held_back(judgement, _not_proven(call, captured, golden))
            return _after_first(judgement, origin.api, reasons)
        reasons[call.api] = result.get("reason", "not replayed")
    _keep_tensors(rank_dir, None)
    why = reasons.get(origin.api) or names.why_not_replayable(origin.api) or next(iter(reasons.values()), None)
    return Judgement.undecided(origin.api, why or "not replayed")


def _paired_rows(pair: StagePair, origin: DriftOrigin) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checked run's rows and the golden's, the golden's named as the run's calls they pair with; for a
    changed block (one run call), its rows named after the golden rows they match (:func:`block_rows`)."""
    target, golden = pair.target.load(origin.rank), pair.golden.load(origin.rank)
    checked, paired = rows(target), rows(aligned_golden(golden, pair_calls(target, golden)))
    if origin.code_path is not None:
        paired.update(block_rows(origin.code_path, checked, rows(golden))[0])
    return checked, paired


def block_rows(change: CodePathChange, checked: dict, golden: dict) -> tuple[dict[str, Any], str | None]:
    """The golden rows a changed block's one run call is judged against, named as that call's rows: each input
    the golden block's input of equal type, dtype, size and statistics (a value: equal value), in the run's layout
    (the same values, read transposed or reshaped), and the differing output the golden's in its place
    (:attr:`CodePathChange.match`). Second: why the block cannot be judged that way (None: it can)."""
    (api,) = change.block.target
    g_inputs = [r for name, r in golden.items() if r["api"] in change.block.golden and r.get("state") == "input"]
    found: dict[str, Any] = {}
    for name, row in checked.items():
        if row["api"] != api or row.get("state") != "input":
            continue
        same = next((g for g in g_inputs if _same_tensor(row, g)), None)
        if same is None:
            return found, f"its input {name} equals none of the golden block's inputs: no common float64 reference"
        # a block may read the golden's tensor in another layout (SDPA's k where eager read k transposed)
        found[name] = same if _is_value(same) else {**same, "shape": row.get("shape")}
    if change.match is None or change.match not in golden:
        return found, f"its output {change.row} has no golden output of the same dtype and size to judge against"
    found[change.row] = golden[change.match]
    return found, None


def _same_tensor(row: dict[str, Any], other: dict[str, Any]) -> bool:
    """Equal dtype, size and statistics (a value msprobe records of a tensor, never the whole tensor): every statistic
    both sides record, where one side's msprobe records some the other's does not (the Mean and Norm of an integer
    tensor: :mod:`~precision_harness.check.recording`)."""
    mine, theirs = row_statistics(row), row_statistics(other)
    both = [k for k in mine if k in theirs and mine[k] is not None and theirs[k] is not None]
    same = mine == theirs or (mine.keys() == theirs.keys() and bool(both) and all(mine[k] == theirs[k] for k in both))
    return (
        row.get("dtype") == other.get("dtype")
        and row.get("type") == other.get("type")
        and numel(row.get("shape")) == numel(other.get("shape"))
        and same
    )


def block_not_replayable(change: CodePathChange, pair: StagePair) -> str | None:
    """Why a changed block cannot be judged by replaying the run's side in float64; None when it can be tried.

    It can when the run's side is one replayable call whose every input equals an input of the golden's
    block, so that one float64 reference serves both sides' outputs.
    """
    block = change.block
    if not change.matches and len(block.target) == 1 and block.golden:
        why = names.why_not_replayable(block.target[0])
        if why is not None:
            return f"the code path changed to {block.target[0]}: {why}"
        target, golden = pair.target.load(change.rank), pair.golden.load(change.rank)
        why = block_rows(change, rows(target), rows(golden))[1]
        return None if why is None else f"the code path changed ({block.what}) and {why}"
    if change.matches:
        return f"the code path changed ({block.what}); its values match the golden's (tolerance.code_path: fail)"
    return (
        f"the code path changed ({block.what}): a changed block is replayed only as one run call that replaced "
        f"golden calls, and this one has {len(block.target)} run call(s) for {len(block.golden)} of the golden's"
    )


def _unconfirmed(api: str, captured: dict, checked: dict, golden: dict) -> str | None:
    """Why a captured call cannot be judged: the rerun did not reproduce the checked run, an input of the golden's
    call is not in the capture, or an input is not the golden's (a value, a dtype or shape, a statistic, a CRC);
    None when all hold. An input that matches without proof is :func:`_unproven`'s."""
    mine = {_row_name(name): row for name, row in captured.items() if row["api"] == api}
    if not mine:
        return f"the capture rerun did not call {api}"
    checked, golden = _by_row_name(checked), _by_row_name(golden)
    for name, row in mine.items():
        if name not in checked or _differs(row, checked[name]):
            return f"not deterministic: the capture rerun's {name} differs from the checked run's"
    wanted = [name for name, row in golden.items() if row["api"] == api and row.get("state") == "input"]
    missing = [name for name in wanted if name not in mine]
    if missing:
        return f"the golden's call has {missing[0]}, which the capture does not: not the golden's call"
    for name, row in mine.items():
        if name not in golden:
            return f"the golden has no {name}"
        if row.get("state") == "input" and _differs(row, golden[name]):
            return f"its inputs differ from the golden's (first: {name}): no common float64 reference"
    return None


def _unproven(api: str, captured: dict, golden: dict) -> tuple[str, str] | None:
    """The first input of ``api`` whose equality with the golden's is not proven: an integer or bool tensor, which
    msprobe records by Max and Min only, with no CRC on both sides (``summary_mode: md5``); None where every input
    is a value compared as such, a float tensor matched statistic for statistic, or a tensor whose CRC matched.
    Returns ``(row name, dtype)``."""
    golden = _by_row_name(golden)
    for name, row in captured.items():
        if row["api"] != api or row.get("state") != "input" or _is_value(row) or row.get("dtype") is None:
            continue
        if _crc(row) is not None and _crc(row) == _crc(golden.get(_row_name(name), {})):
            continue
        if not str(row.get("dtype")).startswith(FLOAT_DTYPES):
            return _row_name(name), str(row.get("dtype"))
    return None


def _differs(row: dict, other: dict) -> bool:
    """Whether two rows of one input differ: a value by value (text and dtypes too), a tensor by dtype, shape, CRC
    (where both carry one) and the statistics both record (a ``task: tensor`` capture records Mean and Norm of
    integer tensors, which a statistics dump leaves out)."""
    if _is_value(row) or _is_value(other):
        return row.get("value") != other.get("value") or row.get("type") != other.get("type")
    if (row.get("dtype"), str(row.get("shape"))) != (other.get("dtype"), str(other.get("shape"))):
        return True
    if _crc(row) is not None and _crc(other) is not None and _crc(row) != _crc(other):
        return True
    mine, theirs = row_statistics(row), row_statistics(other)
    return any(v is not None and theirs.get(k) is not None and v != theirs[k] for k, v in mine.items())


def _is_value(row: dict) -> bool:
    """A non-tensor argument msprobe records by value (``int``, ``float``, ``bool``, ``str``, ``torch.dtype``)."""
    return "value" in row and not str(row.get("type", "")).startswith("torch.Tensor")


def _crc(row: dict) -> str | None:
    """The tensor's CRC-32 where msprobe recorded one (``summary_mode: md5``); its placeholder is all zeros."""
    crc = row.get("md5")
    return None if not crc or set(str(crc)) == {"0"} else str(crc)


def _row_name(name: str) -> str:
    """One name for a keyword argument's row on both sides: a ``task: tensor`` capture names a tensor keyword
    argument ``<api>.kwargs.<key>`` where a statistics dump names it ``<api>.input.<key>``."""
    return name.replace(".forward.kwargs.", ".forward.input.")


def _by_row_name(table: dict) -> dict:
    return {_row_name(name): row for name, row in table.items()}


def _not_proven(call: Call, captured: dict, golden: dict) -> str | None:
    """Why the judged call's side-by-side verdict is not proven: its output's shape differs from the golden's, or
    an input is not proven equal to the golden's (:func:`_unproven`); None when neither."""
    mine, theirs = captured.get(call.output, {}), golden.get(call.output, {})
    if str(mine.get("shape")) != str(theirs.get("shape")):
        return f"{call.output} has shape {mine.get('shape')}, the golden's {theirs.get('shape')}: no common standard"
    unproven = _unproven(call.api, captured, golden)
    if unproven is None:
        return None
    name, dtype = unproven
    return (
        f"its input {name} is {dtype}, which msprobe records by Max and Min only: not proven equal to the golden's "
        "(a golden recorded with msprobe's summary_mode: md5 would prove it by CRC-32)"
    )


def _after_first(judgement: Judgement, first: str, reasons: dict[str, str]) -> Judgement:
    """A judgement of a later call says why the first (where the change entered) was not judged."""
    why = reasons.get(first) or names.why_not_replayable(first)
    if judgement.api == first or why is None:
        return judgement
    return Judgement(
        judgement.verdict, judgement.api, f"{judgement.reason}; {first} not judged: {why}", judgement.figures
    )


def _keep_tensors(rank_dir: Path, api: str | None) -> None:
    """Remove the captured tensors of every call but ``api`` (the judged one, on the judged rank), on every rank."""
    for path in rank_dir.parent.glob(f"rank*/{TENSOR_DIR}/*.pt"):
        if api is None or path.parent.parent != rank_dir or not path.name.startswith(api + "."):
            path.unlink()


def _write(out_dir: Path, judgement: Judgement, *, seconds: float) -> None:
    """``<out_dir>/judgement.json``: the judgement, its figures and the time the capture and replay took."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {**judgement.to_json(), "seconds": round(seconds, 3)}
    (out_dir / "judgement.json").write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")


def judged_outcome(out: Outcome) -> Outcome:
    """The outcome whose change the judgement is about: a ``level: auto`` item's L1 localisation when it found
    where the change entered, else the item's own."""
    local = out.localized
    return local if local is not None and local.origin is not None else out


def with_judgement(out: Outcome, judgement: Judgement | None) -> Outcome:
    """``out`` carrying ``judgement``, its line right after the judged verdict's ``change entered`` line."""
    if judgement is None:
        return out
    last = judged_outcome(out) is not out
    return replace(out, text=text_with_judgement(out.text, judgement.line, last=last), judgement=judgement)


def not_replayed(out: Outcome, first: ItemKey) -> Outcome:
    """``out`` (a failing stage whose change entered at an API) when another stage of the run was replayed first."""
    origin = judged_outcome(out).origin
    assert origin is not None
    reason = (
        f"not replayed: {first.stage} @ step_{first.step} was this run's replayed stage "
        "(rerun this item alone to judge it)"
    )
    return with_judgement(out, Judgement.undecided(origin.api, reason))
