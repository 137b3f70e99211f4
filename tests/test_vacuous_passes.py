"""Nothing compared is a finding (issue 36, item 6): each case below passed before, having compared nothing.

- a weight sync that lists 0 parameters;
- a ``rollout_generate`` stage whose run wrote no ``sampled_tokens.json`` where the golden has one;
- a ``metrics.jsonl`` that logs a step twice (the compare kept the last row of the step);

and (issue 53, item 3):

- exact log-prob parity over 0 response tokens ("bit for bit on 0 tokens");
- a stage whose dumps hold no statistic on either side ("0 statistics identical to the golden");
- ``precision-harness compare`` of a target without ``metrics.jsonl`` against a golden with one (the metrics were
  left out of the items).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_testing import base_data, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.item_key import METRICS_ITEM, ItemKey
from precision_harness.check.tolerance import consistency
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import OutcomeKind, check_items, items_of
from precision_harness.cli import main
from precision_harness.dumps import sampled_tokens
from precision_harness.dumps.files import parse_metrics
from precision_harness.errors import GoldenCorruptError
from precision_harness.goldens.golden import Golden
from precision_harness.scenarios import invariant_declarations

SETTINGS = CheckSettings(scenario="s", policy=TolerancePolicy(), msprobe=False)


def test_a_weight_sync_of_zero_parameters_fails(tmp_path: Path) -> None:
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "weight_sync.json").write_text(
        json.dumps({"parameters": [], "rollout_dtype": "torch.float32"})
    )
    invariants = invariant_declarations.parse(
        {"weight_sync": "exact"}, source="s.yaml", kind="builtin", records_rollout=True
    )
    verdict = consistency.check(tmp_path, 1, "weight_sync", invariants)
    assert not verdict.passed
    assert verdict.text == (
        "weight_sync @ step_1: weight_sync.json lists 0 parameters: no weight was compared; the sync ran on a model "
        "without parameters, or recorded none (runs/numerics/weight_sync.py)"
    )


def _rollout_stage(root: Path, *, tokens: bool, ranks: tuple[str, ...] = ("rank0",)) -> None:
    for rank in ranks:
        write_dump(root / "step_1" / "rollout_generate", base_data(), rank=rank)
        if tokens:
            path = root / "step_1" / "rollout_generate" / "step0" / rank / sampled_tokens.SAMPLED_TOKENS
            path.write_text(sampled_tokens.payload([[1, 2], [3, 4]]))


@pytest.mark.parametrize("ranks", [("rank0",), ("rank0", "rank1")], ids=["one rank", "two ranks"])
def test_a_run_without_the_sampled_tokens_the_golden_has_fails(tmp_path: Path, ranks: tuple[str, ...]) -> None:
    _rollout_stage(tmp_path / "golden", tokens=True, ranks=ranks)
    _rollout_stage(tmp_path / "run", tokens=False, ranks=ranks)  # statistics identical to the golden's
    golden = Golden.from_run_dir(tmp_path / "golden")
    [(_, out)] = check_items(tmp_path / "run", golden, [ItemKey(1, "rollout_generate")], SETTINGS)
    assert not out.passed
    where = "rollout_generate @ step_1: rank0: " if len(ranks) > 1 else "rollout_generate @ step_1: "
    assert out.text.splitlines()[0] == (
        f"{where}the run wrote no sampled_tokens.json where the golden has one: its sampled tokens were not "
        "compared (the rollout recorded none; a command scenario writes it with precision_harness.stage)"
    )


def test_a_golden_without_sampled_tokens_still_compares_the_statistics(tmp_path: Path) -> None:
    """A golden recorded before the gate kept the tokens has nothing to compare them against: not a finding."""
    _rollout_stage(tmp_path / "golden", tokens=False)
    _rollout_stage(tmp_path / "run", tokens=True)
    golden = Golden.from_run_dir(tmp_path / "golden")
    [(_, out)] = check_items(tmp_path / "run", golden, [ItemKey(1, "rollout_generate")], SETTINGS)
    assert out.passed, out.text


def test_a_step_logged_twice_in_metrics_is_one_line_naming_both_lines() -> None:
    content = b'{"training/global_step": 1, "a": 1.0}\n{"training/global_step": 2, "a": 2.0}\n'
    content += b'{"training/global_step": 1, "a": 5.0}\n'
    with pytest.raises(GoldenCorruptError) as exc:
        parse_metrics(content, shown="run/metrics.jsonl")
    assert str(exc.value) == (
        "run/metrics.jsonl:3: training/global_step 1 again (first at line 1); expected one row per step: a resumed "
        "or restarted run logged it twice, rerun it from the start"
    )


def test_the_metrics_item_of_a_run_that_logged_a_step_twice_fails(tmp_path: Path) -> None:
    """Before, the last row of step 1 was compared (and matched the golden): the item passed."""
    for root in ("golden", "run"):
        write_dump(tmp_path / root / "step_1" / "actor_update", base_data())
        rows = [{"training/global_step": 1, "actor/pg_loss": 0.5}]
        if root == "run":
            rows.insert(0, {"training/global_step": 1, "actor/pg_loss": 9.0})
        (tmp_path / root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    golden = Golden.from_run_dir(tmp_path / "golden")
    [(_, out)] = check_items(tmp_path / "run", golden, [METRICS_ITEM], SETTINGS)
    assert not out.passed and out.kind is OutcomeKind.ERROR
    assert "\n" not in out.text and "training/global_step 1 again (first at line 1)" in out.text


def test_exact_log_prob_parity_over_zero_tokens_fails(tmp_path: Path) -> None:
    (tmp_path / "step_1").mkdir()
    zeros = {
        "response_mask": [[0, 0], [0, 0]],
        "rollout_log_probs": [[0.0, 0.0]] * 2,
        "old_log_probs": [[1.0, 2.0]] * 2,
    }
    (tmp_path / "step_1" / "log_probs.json").write_text(json.dumps(zeros))
    exact = invariant_declarations.parse(
        {"rollout_log_prob_parity": "exact"}, source="s.yaml", kind="builtin", records_rollout=True
    )
    verdict = consistency.check(tmp_path, 1, "rollout_log_prob_parity", exact)
    assert not verdict.passed
    assert verdict.text.startswith(
        "rollout_log_prob_parity @ step_1: log_probs.json has no response token (every response_mask entry is 0): "
        "no log-prob was compared"
    ), verdict.text
    bounds = invariant_declarations.parse(
        {"rollout_log_prob_parity": {"max_abs": 1.0}}, source="s.yaml", kind="builtin", records_rollout=True
    )
    assert not consistency.check(tmp_path, 1, "rollout_log_prob_parity", bounds).passed  # as the bounds mode


@pytest.mark.parametrize("ranks", [("rank0",), ("rank0", "rank1")], ids=["one rank", "two ranks"])
def test_a_stage_without_statistics_on_either_side_fails(tmp_path: Path, ranks: tuple[str, ...]) -> None:
    """An msprobe list/scope filter that matches nothing dumps ``"data": {}`` in the run and the golden alike."""
    for root in ("golden", "run"):
        for rank in ranks:
            write_dump(tmp_path / root / "step_1" / "actor_update", {}, rank=rank)
    golden = Golden.from_run_dir(tmp_path / "golden")
    [(_, out)] = check_items(tmp_path / "run", golden, [ItemKey(1, "actor_update")], SETTINGS)
    assert not out.passed and out.kind is OutcomeKind.ERROR and "\n" not in out.text
    assert out.text.startswith(
        'actor_update @ step_1: no statistics in the run or the golden (every rank\'s dump.json "data" is {}): '
        "nothing was compared"
    ), out.text


def _with_metrics(root: Path, metrics: bool) -> Path:
    write_dump(root / "step_1" / "actor_update", base_data())
    if metrics:
        (root / "metrics.jsonl").write_text(json.dumps({"training/global_step": 1, "actor/pg_loss": 0.5}) + "\n")
    return root


def test_compare_of_a_target_without_metrics_fails_the_goldens_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, target = _with_metrics(tmp_path / "golden", True), _with_metrics(tmp_path / "target", False)
    assert items_of(target, Golden.from_run_dir(golden))[-1] == METRICS_ITEM
    assert main(["compare", str(target), str(golden), "--artifacts", str(tmp_path / "art")]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {target / 'metrics.jsonl'}: missing; the golden {golden} holds metrics.jsonl" in out, out
    assert "2 compared, 1 passed, 1 failed" in out
