"""``level: auto``: the gate on L0 plus the runner's stage inputs/outputs, localised at L1.

One project holds the same tiny GRPO scenario twice, ``plant_l1`` (today's L1 gate) and
``plant_auto`` (``level: auto``), recorded once. Numeric changes are planted outside every module
(``PRECISION_TEST_PLANT``, tests/hooks/precision_test_hooks.py): in the log-prob computation, the loss and the
advantages. Each must fail first at the same (step, stage) under auto as under L1, and the auto
verdict, localised at L1, must name the same first divergent API the L1 gate names.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from harness_testing import TINY, hooks_env, run_pytest

from precision_harness.check.item_key import ItemKey
from precision_harness.check.rerun.level_auto import localize, with_localization
from precision_harness.check.verdicts.items import Outcome, OutcomeKind
from precision_harness.dumps.files import merged, rank_digest
from precision_harness.errors import RunFailedError, ScenarioError
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.verification import verify_golden
from precision_harness.runs.kind_runners import bind
from precision_harness.runs.launch import RunOptions
from precision_harness.scenarios.scenario import Scenario
from precision_harness.schemas import load_schema

pytest.importorskip("msprobe")

#: the harness's tiny PPO (GAE, critic, reference): non-zero advantages and losses at step 1
SCENARIO = TINY.read_text()
STAGE_ORDER = ("actor_compute_log_prob", "ref_compute_log_prob", "compute_values", "critic_update", "actor_update")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``plant_l1`` and ``plant_auto``, recorded once (auto records its L1 run too)."""
    root = tmp_path_factory.mktemp("auto")
    (root / "scenarios").mkdir()
    for name, level in (("plant_l1", "L1"), ("plant_auto", "auto")):
        (root / "scenarios" / f"{name}.yaml").write_text(SCENARIO.replace("level: L1", f"level: {level}"))
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    proc = run_pytest(root, "--precision-golden", "update")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def _failures(report: dict, scenario: str) -> list[dict]:
    """The scenario's failing stage items, in execution order."""
    items = [i for i in report["items"] if i["scenario"] == scenario and i["stage"] and not i["passed"]]
    return sorted(items, key=lambda i: (i["step"], STAGE_ORDER.index(i["stage"])))


def _content_sha(golden: Golden, name: str) -> str:
    return golden.content_sha256(name)


def test_update_records_l0_with_stage_outputs_and_the_l1_record(project: Path) -> None:
    auto, l1 = Golden.from_dir(project / "golden/plant_auto/cpu"), Golden.from_dir(project / "golden/plant_l1/cpu")
    assert auto.level == "auto" and auto.localizes and not l1.localizes
    assert verify_golden(auto.path).problems == []
    record = auto.localization()
    for step in (1, 2):
        for stage in STAGE_ORDER:
            assert auto.load_dump(step, stage, "rank0")["level"] == "L0"
            assert f"step_{step}/{stage}/step0/rank0/stage_outputs.json" in auto.contents
            # the L1 record is today's L1 golden, byte for byte: same scenario, same level
            name = f"step_{step}/{stage}/step0/rank0/dump.json"
            assert _content_sha(record, name) == _content_sha(l1, name)
            assert record.statistics(step, stage) == l1.statistics(step, stage) > 0
    # an L1 scenario's golden holds no stage outputs and no L1/ folder
    assert not any("stage_outputs" in n or n.startswith("L1/") for n in l1.contents)


def test_stage_outputs_hold_what_l0_cannot_see(project: Path) -> None:
    golden = Golden.from_dir(project / "golden/plant_auto/cpu")
    outputs = json.loads(golden.read("step_1/actor_update/step0/rank0/stage_outputs.json"))
    # 4 sequences (2 prompts x n=2), mini-batch 2 (1 prompt x n), micro-batch 2: 2 micro-batches, 2 optimizer steps
    assert outputs["inputs"] == [
        "Stage.old_log_probs.0.forward",
        "Stage.advantages.0.forward",
        "Stage.ref_log_prob.0.forward",
    ]
    names = list(outputs["data"])
    for loss in ("loss", "pg_loss", "grad_norm"):
        assert [n for n in names if n.startswith(f"Stage.{loss}.")] == [f"Stage.{loss}.{i}.forward" for i in range(2)]
    advantages = outputs["data"]["Stage.advantages.0.forward"]["input_args"][0]
    assert advantages["shape"] == [4, 4] and advantages["dtype"] == "torch.float32" and advantages["Norm"] > 0
    critic = json.loads(golden.read("step_1/critic_update/step0/rank0/stage_outputs.json"))
    assert critic["inputs"] == ["Stage.values.0.forward", "Stage.returns.0.forward"]
    assert [n for n in critic["data"] if n not in critic["inputs"]] == [
        "Stage.vf_loss.0.forward",
        "Stage.vf_loss.1.forward",
        "Stage.grad_norm.0.forward",
        "Stage.grad_norm.1.forward",
    ]
    log_prob = json.loads(golden.read("step_1/actor_compute_log_prob/step0/rank0/stage_outputs.json"))
    assert list(log_prob["data"]) == ["Stage.old_log_probs.0.forward", "Stage.entropy.0.forward"]
    # merged for the compare: inputs before the L0 modules, outputs after them
    rows = list(golden.load_dump(1, "actor_update", "rank0")["data"])
    assert rows[:3] == outputs["inputs"] and rows[3].startswith("Module.") and rows[-1] == "Stage.grad_norm.1.forward"


def test_unchanged_auto_run_is_identical_and_its_l0_dump_equals_a_plain_l0_run(project: Path, tmp_path: Path) -> None:
    proc = run_pytest(project, "scenarios/plant_auto.yaml")
    assert proc.returncode == 0 and "10 identical to golden, 1 within tolerance" in proc.stdout, proc.stdout
    from precision_harness.runs import kind_runners

    base = Scenario.load(project / "scenarios" / "plant_l1.yaml")
    l0 = base.with_overrides({"global_profiler.global_tool_config.precision_debugger.level": "L0"}, directory=tmp_path)
    run = kind_runners.run_scenario(l0, out_dir=tmp_path / "run", device="cpu")
    auto = Golden.from_dir(project / "golden/plant_auto/cpu")
    for dump in sorted(run.run_dir.glob("step_*/*/step0/rank0/dump.json")):
        name = dump.relative_to(run.run_dir).as_posix()
        assert hashlib.sha256(dump.read_bytes()).hexdigest() == auto.content_sha256(name), name


@pytest.fixture(scope="module", params=["log_prob", "loss", "advantages"])
def planted(request: pytest.FixtureRequest, project: Path) -> dict:
    """Both scenarios checked with one change planted outside every module."""
    site = request.param
    proc = run_pytest(project, "--precision-report", f"rep_{site}", env=hooks_env(PRECISION_TEST_PLANT=site))
    report = json.loads((project / f"rep_{request.param}" / "report.json").read_text())
    markdown = (project / f"rep_{site}" / "report.md").read_text()
    return {"site": site, "proc": proc, "report": report, "markdown": markdown}


def test_planted_change_fails_at_the_same_stage_and_step_as_l1(planted: dict) -> None:
    assert planted["proc"].returncode == 1, planted["proc"].stdout
    l1, auto = _failures(planted["report"], "plant_l1"), _failures(planted["report"], "plant_auto")
    assert l1 and auto
    assert (auto[0]["step"], auto[0]["stage"]) == (l1[0]["step"], l1[0]["stage"])
    where = {"log_prob": "actor_compute_log_prob", "loss": "actor_update", "advantages": "actor_update"}
    assert (l1[0]["step"], l1[0]["stage"]) == (1, where[planted["site"]])


def test_localized_verdict_names_the_api_the_l1_gate_names(planted: dict) -> None:
    l1, auto = _failures(planted["report"], "plant_l1")[0], _failures(planted["report"], "plant_auto")[0]
    local = auto["localized"]
    assert local is not None and local["level"] == "L1" and local["passed"] is False
    api = local["first_divergence"]["tensor"]
    assert not api.startswith(("Stage.", "Module.")), api  # an API, as an L1 gate names it
    assert local["first_divergence"] == l1["first_divergence"]
    assert "localized at L1 (rerun to step_1" in auto["text"] and api in auto["text"]
    assert f"L1: `{api}`" in planted["markdown"]
    jsonschema.validate(planted["report"], load_schema("report"))
    # later failing stages point to the localised one instead of rerunning
    later = _failures(planted["report"], "plant_auto")[1:]
    assert later and all(i["localized"] is None and "localization: not rerun" in i["text"] for i in later)


@pytest.mark.parametrize("planted", ["log_prob"], indirect=True)  # the site computed after every module
def test_log_prob_change_is_invisible_to_l0_alone(planted: dict, project: Path) -> None:
    """The blind spot auto closes: the failing stage's L0 dump is byte-identical to the golden's."""
    assert planted["site"] == "log_prob"
    auto = _failures(planted["report"], "plant_auto")[0]
    assert auto["first_divergence"]["tensor"].startswith("Stage.old_log_probs.")
    golden = Golden.from_dir(project / "golden/plant_auto/cpu")
    name = "step_1/actor_compute_log_prob/step0/rank0/dump.json"
    run_dump = project / ".precision/artifacts/plant_auto/run" / name
    assert hashlib.sha256(run_dump.read_bytes()).hexdigest() == golden.content_sha256(name)


def test_unchanged_localization_rerun_is_identical_to_the_l1_record(project: Path, tmp_path: Path) -> None:
    """A rerun to step 2 dumping only actor_update at L1 writes the very dump the full L1 run recorded."""
    from precision_harness.check.check_settings import CheckSettings
    from precision_harness.check.tolerance.policy import TolerancePolicy

    scenario = Scenario.load(project / "scenarios" / "plant_auto.yaml")
    golden = Golden.from_dir(project / "golden/plant_auto/cpu")
    policy = TolerancePolicy.for_golden(scenario.config["tolerance"], noise=None, cross_device=False)
    settings = CheckSettings(scenario="plant_auto", policy=policy)
    out = localize(scenario, ItemKey(2, "actor_update"), golden, settings, out_dir=tmp_path / "loc", run=bind("cpu"))
    assert out.passed and out.kind is OutcomeKind.IDENTICAL, out.text
    assert sorted(p.parent.parent.name for p in (tmp_path / "loc/run").glob("step_*/*/step0")) == ["step_2"]


def test_golden_recorded_at_l1_before_auto_gates_at_l1_with_a_re_record_line(project: Path, tmp_path: Path) -> None:
    root = tmp_path / "p"
    shutil.copytree(project / "scenarios", root / "scenarios")
    shutil.copytree(project / "golden" / "plant_l1", root / "golden" / "plant_l1")
    shutil.copy(project / "pytest.ini", root / "pytest.ini")
    path = root / "scenarios" / "plant_l1.yaml"
    path.write_text(path.read_text().replace("level: L1", "level: auto"))
    proc = run_pytest(root, "scenarios/plant_l1.yaml")
    assert proc.returncode == 0, proc.stdout
    assert "10 identical to golden, 1 within tolerance" in proc.stdout
    assert (
        "plant_l1: golden recorded at L1 before level: auto; gating at L1. "
        "Re-record for auto with: pytest scenarios/plant_l1.yaml --precision-golden update" in proc.stdout
    )


def test_corrupt_l1_record_fails_with_the_l0_verdict_and_why(project: Path, tmp_path: Path) -> None:
    root = tmp_path / "p"
    shutil.copytree(project / "scenarios", root / "scenarios")
    shutil.copytree(project / "golden" / "plant_auto", root / "golden" / "plant_auto")
    shutil.copy(project / "pytest.ini", root / "pytest.ini")
    stored = root / "golden/plant_auto/cpu/L1/step_1/actor_update/step0/rank0/dump.json.zst"
    stored.write_bytes(stored.read_bytes()[:-8])
    proc = run_pytest(
        root,
        "scenarios/plant_auto.yaml",
        "-k",
        "actor_update and step_1",
        env=hooks_env(PRECISION_TEST_PLANT="advantages"),
    )
    assert proc.returncode == 1
    assert "first divergence  Stage.advantages.0.forward.input.0" in proc.stdout
    assert "localization failed: " in proc.stdout and "dump.json.zst: sha256 differs" in proc.stdout


def _l0_outcome() -> Outcome:
    return Outcome(False, "actor_update @ step_1, rank0: 1 of 9 statistics beyond tolerance", OutcomeKind.COMPARED)


def test_localization_run_that_crashes_keeps_the_l0_verdict_and_says_why() -> None:
    def crash() -> Outcome:
        raise RunFailedError("scenarios/x.yaml: scenario run failed: RuntimeError: boom (log: .precision/w.log)")

    out = with_localization(_l0_outcome(), ItemKey(1, "actor_update"), crash)
    assert out.passed is False and out.kind is OutcomeKind.COMPARED and out.localized is None
    assert out.text.splitlines() == [
        "actor_update @ step_1, rank0: 1 of 9 statistics beyond tolerance",
        "  localization failed: scenarios/x.yaml: scenario run failed: RuntimeError: boom (log: .precision/w.log)",
    ]


def test_localization_timeout_is_one_line(project: Path, tmp_path: Path) -> None:
    """A rerun past --precision-timeout: launch raises, localize passes it on, the item keeps its L0 verdict."""
    from precision_harness.check.check_settings import CheckSettings
    from precision_harness.check.tolerance.policy import TolerancePolicy

    scenario = Scenario.load(project / "scenarios" / "plant_auto.yaml")
    golden = Golden.from_dir(project / "golden/plant_auto/cpu")
    policy = TolerancePolicy.for_golden(scenario.config["tolerance"], noise=None, cross_device=False)
    settings = CheckSettings(scenario="plant_auto", policy=policy)
    key = ItemKey(2, "actor_update")
    out = with_localization(
        _l0_outcome(),
        key,
        lambda: localize(
            scenario, key, golden, settings, out_dir=tmp_path / "loc", run=bind("cpu", RunOptions(timeout=0.5))
        ),
    )
    assert out.passed is False
    assert "localization failed: " in out.text and "worker timed out after 0.5 s" in out.text


def test_level_auto_is_refused_for_command_scenarios(tmp_path: Path) -> None:
    path = tmp_path / "cmd.yaml"
    path.write_text(
        "command: [python, train.py]\nglobal_profiler:\n  steps: [1]\n  global_tool_config:\n"
        "    precision_debugger:\n      stages: [actor_update]\n      level: auto\n"
    )
    with pytest.raises(ScenarioError) as err:
        Scenario.load(path)
    assert str(err.value) == (
        f"{path}: global_profiler.global_tool_config.precision_debugger.level: auto needs each stage's inputs and "
        "outputs beside the L0 dump, which the built-in runner and engine: verl on cpu write; a command scenario "
        "sets L0, L1 or mix"
    )


def test_merge_order_and_rank_digest() -> None:
    dump = {"level": "L0", "data": {"Module.a.forward.0": {}}}
    adv, loss = "Stage.advantages.0.forward", "Stage.loss.0.forward"
    outputs = {"inputs": [adv], "data": {adv: {}, loss: {}}}
    assert list(merged(dump, outputs)["data"]) == [adv, "Module.a.forward.0", loss]
    assert merged(dump, None) is dump
    assert rank_digest("a", None) == "a" and rank_digest("a", "b") != rank_digest("a", "c")


def test_localize_off_keeps_the_l0_verdict_and_reruns_nothing(project: Path, tmp_path: Path) -> None:
    """``--precision-localize off`` (a quick triage run): the failing stage keeps its L0 and stage-output verdict,
    with no L1 rerun and no localisation line."""
    root = tmp_path / "p"
    shutil.copytree(project / "scenarios", root / "scenarios")
    shutil.copytree(project / "golden" / "plant_auto", root / "golden" / "plant_auto")
    shutil.copy(project / "pytest.ini", root / "pytest.ini")
    select = ("-k", "actor_update and step_1", "--precision-localize", "off")
    proc = run_pytest(root, "scenarios/plant_auto.yaml", *select, env=hooks_env(PRECISION_TEST_PLANT="advantages"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first divergence  Stage.advantages.0.forward.input.0" in proc.stdout
    assert "localiz" not in proc.stdout
    assert not (root / ".precision/artifacts/plant_auto/localize").exists()
