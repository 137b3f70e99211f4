"""Which side is right, end to end: each planted change gets its judgement in the terminal, report.json and JUnit.

Plants (tests/hooks/precision_test_hooks.py, ``PRECISION_TEST_PLANT``), each in the processes the gate starts:

=====================  ==============================================  ===============================================
case                   plant, scenario, golden                          judgement
=====================  ==============================================  ===============================================
regression             ``linear_bf16`` (fp32 products from bf16-        ``regression`` at the first product
                       rounded inputs); grpo_tiny, committed golden
improvement            none; grpo_tiny, golden recorded with            ``improvement`` there
                       ``linear_bf16``
equivalent             ``sum_order`` (another association of the        ``equivalent`` at that API; the stage's later
                       same fp32 sums); grpo_tiny at ``mode: exact``    divergences were not judged
collective             ``allreduce`` (the reduced gradient scaled);     ``undecided``: a collective
                       ppo_dp2_tiny (two Ray ranks), committed golden
dropout                ``dropout_rng`` (another mask for the same       ``undecided``: draws random numbers
                       input); tests/data/tiny_dropout.yaml
auto                   ``linear_bf16``; the harness's tiny PPO at       ``regression``, from the L1 localisation's
                       ``level: auto``                                  capture
=====================  ==============================================  ===============================================

Issue 36's plants, each a real loss of precision or a wrong input, which must read ``regression`` or
``undecided`` with the true reason, never ``equivalent`` or ``improvement`` (each reuses a committed golden,
but ``gelu_tanh``, whose golden is recorded with exact ``gelu`` in Qwen2's MLP):

=====================  ==============================================  ===============================================
narrowing              ``softmax_bf16`` (eager attention's softmax      ``regression``, held to float32's standard
                       asked for float32, computed in bf16);            (was ``equivalent``)
                       grpo_bf16_actor, ``actor_update`` step 1
rotated_index          ``gather_index`` (each row's labels rotated      ``undecided``, naming the int64 index (was
                       by one before the log-prob gather); grpo_tiny    "not deterministic")
shifted_mask           ``mask_shift`` (``actor_update``'s response      ``undecided``, naming the int64 mask
                       mask shifted by one token); grpo_is_geometric,
                       step 2 (its step 1 masks are all ones)
gelu_tanh              ``gelu_tanh`` for ``gelu``; grpo_tiny at         ``regression``
                       ``mode: exact``
dropped_bias           ``linear_nobias`` (q_proj's bias, which step 1   ``regression``
                       moved from 0, left out of the log-prob stages);
                       grpo_tiny step 2
=====================  ==============================================  ===============================================

Issue 53's plant, a run's own patch of torch at the Python level, which the float64 replay must not take for the
truth (it reads ``improvement`` where the replay loads the patch too):

=====================  ==============================================  ===============================================
patched_silu           a ``sitecustomize.py`` on ``PYTHONPATH`` that   ``regression`` at ``Functional.silu``
                       patches ``torch.nn.functional.silu`` to
                       compute 1e-4 off; grpo_tiny, committed golden
=====================  ==============================================  ===============================================

Each case runs one pytest session in a project of its own and selects one item (the run is whole; only
the item's compare and msprobe's analysis are spared).
"""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from harness_testing import CHROMIUM, DATA, TINY, chromium_dom, hooks_env, patching_site, run_pytest

from precision_harness.schemas import load_schema

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Gate:
    """One gate session's output: stdout, the item's report.json record, its JUnit properties, the project."""

    stdout: str
    record: dict
    junit: dict
    root: Path

    @property
    def judgement(self) -> dict:
        assert self.record["judgement"] is not None, self.stdout[-4000:]
        return self.record["judgement"]

    def line(self, label: str) -> str:
        """The verdict's line with ``label`` (``judgement``, ``change entered``), label included."""
        return next(line for line in self.stdout.splitlines() if line.strip().startswith(label + " ")).strip()


def _project(root: Path, scenario: Path, *, golden: str | None = None, extra: str = "") -> Path:
    (root / "scenarios").mkdir(parents=True)
    (root / "scenarios" / scenario.name).write_text(scenario.read_text() + extra)
    if golden is not None:
        shutil.copytree(ROOT / "golden" / golden, root / "golden" / golden)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return root


def _gate(root: Path, item: str, plant: str | None, *args: str, env: dict[str, str] | None = None) -> Gate:
    env = hooks_env(PRECISION_TEST_PLANT=plant) if plant else env
    proc = run_pytest(root, "-k", item, "--precision-report", "rep", "--junitxml", "junit.xml", *args, env=env)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads((root / "rep" / "report.json").read_text())
    jsonschema.validate(doc, load_schema("report"))
    stage, step = item.split(" and step_")
    record = next(r for r in doc["items"] if r["stage"] == stage and r["step"] == int(step))
    case = next(c for c in ET.parse(root / "junit.xml").iter("testcase") if c.get("name") == f"{stage}[step_{step}]")
    junit = {p.get("name"): p.get("value") for p in case.iter("property")}
    return Gate(proc.stdout, record, junit, root)


def _record(root: Path, plant: str | None = None) -> None:
    env = hooks_env(PRECISION_TEST_PLANT=plant) if plant else None
    proc = run_pytest(root, "--precision-golden", "update", env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("regression"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    return _gate(root, "actor_compute_log_prob and step_1", "linear_bf16")


@pytest.fixture(scope="module")
def improvement(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("improvement"), ROOT / "scenarios/grpo_tiny.yaml")
    _record(root, "linear_bf16")
    return _gate(root, "actor_compute_log_prob and step_1", None)


@pytest.fixture(scope="module")
def equivalent(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("eq"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny", extra=EXACT)
    return _gate(root, "actor_compute_log_prob and step_1", "sum_order")


@pytest.fixture(scope="module")
def collective(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("coll"), ROOT / "scenarios/ppo_dp2_tiny.yaml", golden="ppo_dp2_tiny")
    return _gate(root, "critic_update and step_1", "allreduce")


@pytest.fixture(scope="module")
def dropout(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("dropout"), DATA / "tiny_dropout.yaml")
    _record(root)
    return _gate(root, "actor_update and step_1", "dropout_rng")


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = tmp_path_factory.mktemp("auto")
    (root / "tiny_auto.yaml").write_text(TINY.read_text().replace("level: L1", "level: auto"))
    _project(root, root / "tiny_auto.yaml")
    _record(root)
    return _gate(root, "actor_compute_log_prob and step_1", "linear_bf16")


EXACT = "tolerance:\n  mode: exact\n"  # not in the scenario's identity: the committed golden gates it


@pytest.fixture(scope="module")
def narrowing(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    scenario = ROOT / "scenarios/grpo_bf16_actor.yaml"
    root = _project(tmp_path_factory.mktemp("narrowing"), scenario, golden="grpo_bf16_actor")
    return _gate(root, "actor_update and step_1", "softmax_bf16")


@pytest.fixture(scope="module")
def rotated_index(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("rotated"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    return _gate(root, "actor_compute_log_prob and step_1", "gather_index")


@pytest.fixture(scope="module")
def shifted_mask(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    scenario = ROOT / "scenarios/grpo_is_geometric.yaml"
    root = _project(tmp_path_factory.mktemp("mask"), scenario, golden="grpo_is_geometric")
    return _gate(root, "actor_update and step_2", "mask_shift")


@pytest.fixture(scope="module")
def gelu_tanh(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("gelu"), ROOT / "scenarios/grpo_tiny.yaml", extra=EXACT)
    _record(root, "gelu")
    return _gate(root, "actor_compute_log_prob and step_1", "gelu_tanh")


@pytest.fixture(scope="module")
def dropped_bias(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = _project(tmp_path_factory.mktemp("bias"), ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    return _gate(root, "actor_compute_log_prob and step_2", "linear_nobias")


@pytest.fixture(scope="module")
def patched_silu(tmp_path_factory: pytest.TempPathFactory) -> Gate:
    root = tmp_path_factory.mktemp("silu")
    site = patching_site(root / "site", "silu")
    _project(root / "project", ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return _gate(root / "project", "actor_compute_log_prob and step_1", None, env={"PYTHONPATH": path})


def _said_everywhere(gate: Gate, verdict: str, api: str) -> str:
    """The judgement in the terminal (right after where the change entered), report.json and JUnit; its line."""
    lines = gate.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("judgement "))
    assert lines[at - 1].strip().startswith("change entered    this API computes differently now: " + api)
    line = gate.line("judgement")
    assert line.startswith(f"judgement         {verdict} at API {api}: "), line
    assert gate.judgement["verdict"] == verdict and gate.judgement["api"] == api
    assert gate.junit["precision_judgement"] == line.removeprefix("judgement").strip()
    assert gate.record["origin"]["kind"] == "api"
    return line


def test_a_float32_product_from_bf16_rounded_inputs_is_a_regression(regression: Gate) -> None:
    line = _said_everywhere(regression, "regression", "Tensor.__matmul__.0.forward")
    assert "x what this op costs in float32 (fails rmse, max abs error" in line
    assert line.endswith("keep the golden (inputs matched by statistics)")
    figures = regression.judgement["figures"]
    assert figures["standard"]["k"] > 100 and not figures["standard"]["passed"]
    # only the judged call's tensors are kept
    kept = list((regression.root / ".precision/artifacts/grpo_tiny/judge/run").rglob("*.pt"))
    assert kept and all(p.name.startswith("Tensor.__matmul__.0.forward.") for p in kept)


def test_a_golden_recorded_with_that_regression_reads_as_an_improvement(improvement: Gate) -> None:
    line = _said_everywhere(improvement, "improvement", "Tensor.__matmul__.0.forward")
    assert "more precise now: the golden's " in line and "Review and re-record the golden" in line
    bound = next(iter(b for b in improvement.judgement["figures"]["golden"].values() if b["lower_bound"] > 0))
    assert bound["lower_bound"] > max(bound["twice_new"], bound["allowance"])


def test_a_summation_order_change_is_equivalent(equivalent: Gate) -> None:
    line = _said_everywhere(equivalent, "equivalent", "Functional.linear.0.forward")
    assert line.endswith("the stage's later divergences were not judged (inputs matched by statistics)")
    assert "too tight" not in line and "re-record" not in line


def test_a_collective_is_undecided_with_its_reason(collective: Gate) -> None:
    line = _said_everywhere(collective, "undecided", "Distributed.all_reduce.0.forward")
    assert line.endswith(
        "a collective: its result is made of the other ranks' data, which this rank's capture does not hold"
    )
    assert not (collective.root / ".precision/artifacts/ppo_dp2_tiny/judge").exists()  # nothing to rerun


def test_a_dropout_is_undecided_with_its_reason(dropout: Gate) -> None:
    line = _said_everywhere(dropout, "undecided", "Functional.dropout.0.forward")
    assert "dropout draws random numbers: the device's generator state is not captured" in line


def test_level_auto_judges_the_api_its_l1_localisation_names(auto: Gate) -> None:
    lines = auto.stdout.splitlines()
    local = next(i for i, line in enumerate(lines) if "localized at L1" in line)
    judgement = next(i for i, line in enumerate(lines) if line.strip().startswith("judgement "))
    assert judgement > local and lines[judgement].startswith("    judgement         regression at API ")
    assert auto.judgement["verdict"] == "regression" and auto.record["origin"]["kind"] == "api"
    assert auto.junit["precision_judgement"].startswith("regression at API ")


def test_a_softmax_narrowed_to_bf16_is_a_regression_held_to_float32(narrowing: Gate) -> None:
    """Before: "equivalent: both sides as exact as bfloat16 allows ... the tolerance may be too tight"."""
    line = _said_everywhere(narrowing, "regression", "Functional.softmax.0.forward")
    assert "the output narrowed from float32 to bfloat16, held to float32's standard: error = " in line, line
    assert narrowing.judgement["figures"]["narrowed"] == {"golden": "torch.float32", "new": "torch.bfloat16"}
    assert narrowing.judgement["figures"]["standard"]["k"] > 10


def test_a_rotated_gather_index_is_undecided_naming_its_integer_input(rotated_index: Gate) -> None:
    """Before: "not deterministic: the capture rerun's Torch.gather.0.forward.kwargs.index differs" (false)."""
    line = _said_everywhere(rotated_index, "undecided", "Torch.gather.0.forward")
    assert (
        "its input Torch.gather.0.forward.input.index is torch.int64, which msprobe records by Max and Min only: "
        "not proven equal to the golden's" in line
    ), line
    assert "deterministic" not in line


def test_a_response_mask_shifted_by_one_token_is_undecided_naming_the_mask(shifted_mask: Gate) -> None:
    """Before: "improvement" (the golden's Mean is farther from the replay of the shifted mask than float32 allows)."""
    line = _said_everywhere(shifted_mask, "undecided", "Tensor.__mul__.35.forward")
    assert (
        "its input Tensor.__mul__.35.forward.input.1 is torch.int64, which msprobe records by Max and Min only: "
        "not proven equal to the golden's" in line
    ), line
    assert line.endswith("not improvement on that basis (the new output's error is 0x the baseline's)"), line


def test_gelu_computed_with_the_tanh_approximation_is_a_regression(gelu_tanh: Gate) -> None:
    line = _said_everywhere(gelu_tanh, "regression", "Functional.gelu.0.forward")
    assert "x what this op costs in float32 (fails " in line


def test_a_dropped_bias_is_a_regression(dropped_bias: Gate) -> None:
    line = _said_everywhere(dropped_bias, "regression", "Functional.linear.0.forward")
    assert "x what this op costs in float32 (fails " in line


def test_no_planted_loss_is_acquitted(
    narrowing: Gate, rotated_index: Gate, shifted_mask: Gate, gelu_tanh: Gate, dropped_bias: Gate
) -> None:
    """Issue 36's count over its plants: 0 read equivalent or improvement (a re-record would erase each)."""
    verdicts = {name: g.judgement["verdict"] for name, g in locals().items() if isinstance(g, Gate)}
    assert len(verdicts) == 5 and set(verdicts.values()) <= {"regression", "undecided"}, verdicts


def test_a_function_the_run_patched_is_judged_against_torchs_own(patched_silu: Gate) -> None:
    """Before: "improvement ... more precise now ... Review and re-record the golden" (the replay loaded the patch)."""
    line = _said_everywhere(patched_silu, "regression", "Functional.silu.0.forward")
    assert "x what this op costs in float32 (fails " in line and "keep the golden" in line, line


def test_report_markdown_and_html_carry_the_judgement(regression: Gate) -> None:
    md = (regression.root / "rep/report.md").read_text()
    assert "| api: `Tensor.__matmul__.0.forward.output.0` | **regression** `Tensor.__matmul__.0.forward` |" in md
    assert "**judgement**: regression at API Tensor.__matmul__.0.forward: error = " in md
    html = (regression.root / "rep/report.html").read_text()
    assert '<p class="judgement regression"><b>judgement</b>: regression at API Tensor.__matmul__.0.forward' in html


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless check needs Debian chromium at /usr/bin/chromium (apt-get install -y chromium)",
)
def test_the_judgement_line_shows_in_report_html_rendered_by_headless_chromium(
    regression: Gate, tmp_path: Path
) -> None:
    proc = chromium_dom(regression.root / "rep/report.html", tmp_path / "profile")
    dom = proc.stdout
    assert (
        '<p class="judgement regression"><b>judgement</b>: regression at API Tensor.__matmul__.0.forward: error ='
        in dom
    ), proc.stderr[-2000:]
    assert '<p class="origin"><b>change entered</b>: this API computes differently now:' in dom


def test_judgement_off_keeps_the_classification_without_a_rerun(tmp_path: Path) -> None:
    """--precision-judgement off: where the change entered, no capture rerun, no judgement."""
    root = _project(tmp_path, ROOT / "scenarios/grpo_tiny.yaml", golden="grpo_tiny")
    gate = _gate(root, "actor_compute_log_prob and step_1", "linear_bf16", "--precision-judgement", "off")
    assert gate.line("change entered").startswith("change entered    this API computes differently now")
    assert gate.record["judgement"] is None and "precision_judgement" not in gate.junit
    assert not (root / ".precision/artifacts/grpo_tiny/judge").exists()
