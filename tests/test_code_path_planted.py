"""A changed code path, end to end through the gate: planted changes of the call sequence (tests/hooks).

=====================  ==================================================  ============================================
case                   plant (``PRECISION_TEST_PLANT``), grpo_tiny against  verdict
                       its committed golden
=====================  ==================================================  ============================================
same values            the real upgrade, transformers 5.23.0's RoPE         passes, reported (test_real_upgrade.py)
fused, rounds apart    ``fused_attention``: eager attention's six calls     fails at that block; judged ``regression``
                       replaced by one SDPA call rounding q, k, v through   from the captured call replayed in float64
                       bfloat16
replaced + numeric     ``rope_mul,linear_bf16``: 5.23.0's RoPE, and the     fails at the first product, named where the
                       products from bf16-rounded inputs                    change entered; the RoPE block reported as
                                                                            matching
other shapes           ``mask_shape``: the causal mask compared on          passes, the changed code path named, never
                       ``[1, 18]`` and ``[18, 1]`` indices (``[18, 18]``)   "upstream" (transformers 4.57.3 builds the
                       where 5.10.4 records ``[1, 1, 18, 18]``              mask so, and failed every item upstream)
=====================  ==================================================  ============================================
"""

from __future__ import annotations

import json

import pytest
from harness_testing import hooks_env, run_pytest
from test_judgement_planted import ROOT, Gate, _gate, _project

pytestmark = pytest.mark.slow

ITEM = "actor_compute_log_prob and step_1"
ATTENTION = (
    "Torch.matmul, Tensor.__mul__, Tensor.__add__, Functional.softmax, Functional.dropout, Torch.matmul "
    "-> Functional.scaled_dot_product_attention"
)


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("fused"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    return _gate(root, ITEM, "fused_attention")


@pytest.fixture(scope="module")
def replaced_and_numeric(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("both"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    return _gate(root, ITEM, "rope_mul,linear_bf16")


def test_a_fused_op_that_rounds_differently_fails_at_its_block_and_is_judged(fused: Gate) -> None:
    entered = fused.line("change entered")
    assert entered.startswith(f"change entered    the code path changed in actor_compute_log_prob: {ATTENTION} (")
    assert "at transformers/integrations/sdpa_attention.py:" in entered  # where msprobe's stack.json places it
    assert entered.endswith("and the values leaving it differ from the golden's (code path below)")
    assert fused.record["origin"]["kind"] == "code_path" and fused.junit["precision_origin"].startswith("code_path ")
    assert fused.line("code path").startswith(f"code path         {ATTENTION} (x4, the first shown): ")
    judgement = fused.judgement
    assert judgement["verdict"] == "regression", judgement
    assert judgement["api"] == "Functional.scaled_dot_product_attention.0.forward"
    assert fused.record["code_path"]["failing"] == 4 and "upstream" not in fused.record["text"]


def test_a_numeric_change_after_a_replaced_call_is_named_where_it_entered(replaced_and_numeric: Gate) -> None:
    gate = replaced_and_numeric
    assert gate.line("change entered").startswith(
        "change entered    this API computes differently now: Functional.linear.0.forward gives other outputs"
    )
    assert gate.record["origin"]["kind"] == "api" and gate.judgement["verdict"] == "regression"
    assert gate.line("code path").startswith(
        "code path         2 other changed block(s) whose values match: Tensor.__matmul__ -> Tensor.__mul__ (x2; "
    )
    assert gate.record["code_path"]["failing"] == 0 and gate.record["code_path"]["count"] == 2


@pytest.fixture(scope="module")
def reshaped(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """The gate of :data:`ITEM` under the ``mask_shape`` plant: its output and the item's report.json record."""
    root = _project(tmp_path_factory.mktemp("mask"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    proc = run_pytest(root, "-k", ITEM, "--precision-report", "rep", env=hooks_env(PRECISION_TEST_PLANT="mask_shape"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads((root / "rep" / "report.json").read_text())
    return proc.stdout, next(r for r in doc["items"] if r["stage"] == "actor_compute_log_prob" and r["step"] == 1)


def test_a_mask_built_through_other_shapes_passes_as_a_changed_code_path(reshaped: tuple[str, dict]) -> None:
    stdout, record = reshaped
    path = record["code_path"]
    assert path is not None and path["what"] == ["Tensor.__le__ (other shapes)"], record["text"]
    assert path["failing"] == 0 and {c["leaving"] for c in path["changes"]} == {"match"}
    assert (
        "Tensor.__le__.0.forward.output.0 [18, 18] has the statistics of the golden's" in path["changes"][0]["evidence"]
    )
    assert "upstream" not in record["text"] and "upstream" not in stdout
