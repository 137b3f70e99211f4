"""``precision-harness``: every command and exit code (0 pass, 1 drift, 2 usage)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness_testing import export_golden, replace_payload, run_cli, write_dump

from precision_harness.check.tolerance.calibrate import proposed_tolerance
from precision_harness.cli import main
from precision_harness.dumps.files import sha256_file
from precision_harness.dumps.rows import rows
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.goldens.golden import Golden
from precision_harness.options import OPTIONS


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_cli(cwd, *args, env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])})


@pytest.fixture
def golden_copy(recorded_project: Path, tmp_path: Path) -> Path:
    shutil.copytree(recorded_project / "golden", tmp_path / "golden")
    return tmp_path / "golden" / "tiny_ppo" / "cpu"


def test_compare_golden_with_itself_passes_without_torch(golden_copy: Path, tmp_path: Path) -> None:
    code = (
        "import sys; from precision_harness.cli import main; rc = main(['compare', sys.argv[1], sys.argv[1]]); "
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'msprobe.pytorch') if m in sys.modules)); "
        "sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(golden_copy)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS critic_update @ step_1, rank0: " in proc.stdout and "identical to the golden (sha256)" in proc.stdout
    assert "PASS metrics.jsonl" in proc.stdout and "11 compared, 11 passed, 0 failed" in proc.stdout
    assert "HEAVY []" in proc.stdout


def test_compare_drift_exit_1_with_report(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Max=9.0, Norm=37.5))
    proc = cli(
        "compare", str(target.parents[1]), str(golden.parents[1]), "--report", "rep", "--artifacts", "art", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL actor_update @ step_1, rank0: 2 of " in proc.stdout
    assert "  first divergence  Functional.linear.0.forward.output.0  Max 3 -> 9" in proc.stdout
    # the linear's inputs match, its output does not: msprobe's DiffAnalyzer names the same API, so it is not repeated
    assert "  change entered    this API computes differently now: Functional.linear.0.forward gives" in proc.stdout
    assert "msprobe 1st diff" not in proc.stdout
    doc = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert doc["mode"] == "compare" and doc["summary"]["failed"] == 1
    assert doc["items"][0]["origin"]["kind"] == "api" and doc["items"][0]["judgement"] is None
    assert doc["items"][0]["first_divergence"]["tensor"] == "Functional.linear.0.forward.output.0"
    # the plugin's layout: <artifacts>/<scenario>/step_<n>/<stage>/ (a plain directory's scenario is its name)
    assert (tmp_path / "art" / "golden" / "step_1" / "actor_update" / "verdict.txt").is_file()


def test_compare_verl_multi_rank_layout(tmp_path: Path) -> None:
    """verl's outputs/profile: several ranks per stage, no manifest, no metrics.jsonl."""
    from harness_testing import base_data

    for root in ("profile", "golden"):
        for rank in ("rank0", "rank1"):
            write_dump(tmp_path / root / "step_3" / "actor_update", base_data(), rank)
    missing = tmp_path / "profile" / "step_3" / "actor_update" / "step0" / "rank1"
    shutil.rmtree(missing)
    proc = cli("compare", "profile", "golden", cwd=tmp_path)
    assert proc.returncode == 1
    assert (
        "FAIL actor_update @ step_3, rank1 (differs on rank1 of 2 ranks): 1 structural difference(s) from the golden"
        in proc.stdout
    )
    assert "rank1: in the golden but missing from this run" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("compare", "nope", "."), "nope: TARGET is not a directory"),
        (("compare", ".", "."), "no step_<n>/<stage>/step0/rank<r>/dump.json on either side"),
        (("golden", "list", "--golden-dir", "nope"), "nope: no golden directory here (--golden-dir)"),
        (("calibrate", "x.yaml", "--runs", "1"), "--runs 1: calibration needs at least 2 reruns"),
    ],
)
def test_usage_errors_exit_2(
    args: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chdir(tmp_path)
    assert main(list(args)) == 2
    assert message in capsys.readouterr().err


def test_argparse_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", "only-one"])
    assert exc.value.code == 2


def test_compare_bad_artifacts_path(dumps, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target, golden = dumps(tmp_path)
    assert main(["compare", str(target.parents[1]), str(golden.parents[1]), "--artifacts", str(tmp_path / "a b")]) == 2
    assert "--artifacts: msprobe rejects dump path" in capsys.readouterr().err


def test_golden_verify_and_list(golden_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(golden_copy.parents[1])
    assert main(["golden", "verify", "--golden-dir", root]) == 0
    assert "1 goldens verified, 0 with problems" in capsys.readouterr().out
    assert main(["golden", "list", "--golden-dir", root]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = ["scenario", "device", "level", "steps", "stages", "files", "stored", "MB", "plain", "MB", "calibrated"]
    assert lines[0].split() == header
    cells = lines[1].split()
    # 21 payloads (10 ranks' dump.json and construct.json, the metrics) and each rank's dump.index
    assert cells[:6] == ["tiny_ppo", "cpu", "L1", "1,2", "5", "31"] and cells[-1] == "no"
    stored, plain = float(cells[6]), float(cells[7])
    assert 0 < stored < plain / 5  # compressed payloads; plain is what an export writes


def test_golden_verify_finds_corruption_and_nan(golden_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rel = "step_1/actor_update/step0/rank0/dump.json"
    data = json.loads((export_golden(golden_copy, golden_copy.parent / "plain") / rel).read_text())
    first = next(iter(data["data"].values()))["output"][0]
    first["Max"] = float("nan")
    replace_payload(golden_copy, rel, json.dumps(data).encode())  # a sound digest of a bad golden
    (golden_copy / "step_2" / "critic_update" / "step0" / "rank0" / "dump.json.zst").write_text("{}")
    (golden_copy / "stray.txt").write_text("x")
    assert main(["golden", "verify", "--golden-dir", str(golden_copy.parents[1])]) == 1
    out = capsys.readouterr().out
    assert "FAIL " in out and ".output.0 Max is nan" in out
    assert "step_2/critic_update/step0/rank0/dump.json.zst: sha256 differs from manifest.json" in out
    assert "stray.txt: not listed in manifest.json" in out
    assert "1 goldens verified, 1 with problems" in out


def test_calibrate_without_golden_is_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness_testing import TINY

    os.chdir(tmp_path)
    assert main(["calibrate", str(TINY), "--runs", "2", "--golden-dir", "golden"]) == 2
    assert "no golden for scenario tiny_ppo on cpu; record it with" in capsys.readouterr().err


@pytest.mark.slow
def test_run_then_calibrate(recorded_project: Path, tmp_path: Path) -> None:
    """`run` shows progress and timings; `calibrate` reruns under other thread counts and records noise."""
    shutil.copytree(recorded_project, tmp_path / "p", ignore=shutil.ignore_patterns(".precision"))
    p = tmp_path / "p"
    proc = cli("run", "scenarios/tiny_ppo.yaml", "--out", "out", cwd=p)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[precision] tiny_ppo: step 1/2 actor_compute_log_prob (" in proc.stdout
    assert "tiny_ppo on cpu: run " in proc.stdout and "10 dumped stages" in proc.stdout
    recorded = Golden.from_dir(p / "golden/tiny_ppo/cpu").digests(2, "actor_update")
    assert {"rank0": sha256_file(p / "out/step_2/actor_update/step0/rank0/dump.json")} == recorded
    proc = cli("calibrate", "scenarios/tiny_ppo.yaml", "--runs", "2", cwd=p)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rerun 2/2 (num_threads=2)" in proc.stdout and "golden updated: " in proc.stdout
    noise = json.loads((p / "golden/tiny_ppo/cpu/manifest.json").read_text())["noise"]
    # another thread count changes ATen's reduction order (docs/msprobe.md), so stages move and a block is proposed
    proposal = yaml.safe_load((p / ".precision/calibrate/tiny_ppo/tolerance.proposed.yaml").read_text())
    assert proposal == {"tolerance": proposed_tolerance(noise)} and proposal["tolerance"]["stages"]
    assert "proposed tolerance (k x observed) for the scenario file, written to " in proc.stdout
    assert (
        noise["runs"] == 2
        and noise["k"] == 3.0
        and set(noise["stages"])
        == {"actor_compute_log_prob", "ref_compute_log_prob", "compute_values", "critic_update", "actor_update"}
    )
    # per row: only the rows that moved, each statistic over the row's own scale; a stage's figure is its largest row
    assert noise["rows"] and all(noise["rows"][stage] for stage in proposal["tolerance"]["stages"])
    for stage, moved in noise["rows"].items():
        golden = Golden.from_dir(p / "golden/tiny_ppo/cpu")
        golden_rows = {name for step in (1, 2) for name in rows(golden.stage(step, stage).load("rank0"))}
        assert set(moved) <= set(golden_rows) and all(v > 0 for row in moved.values() for v in row.values())
        assert noise["stages"][stage] == {s: max(row.get(s, 0.0) for row in moved.values()) for s in STATISTICS}
    print(f"noise: {len(json.dumps(noise))} bytes, {sum(map(len, noise['rows'].values()))} rows moved")
    assert main(["golden", "verify", "--golden-dir", str(p / "golden")]) == 0


def test_options_defined_once() -> None:
    """Every shared option reaches pytest (--precision-<name> or ini) and each CLI command that lists it."""
    from precision_harness.cli import build_parser

    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    golden_actions = subs["golden"]._subparsers._group_actions[0].choices
    for opt in OPTIONS:
        for command in opt.cli:
            # "golden" options reach every golden action; "export" names the golden export action
            sub = subs.get(command) if command != "golden" else golden_actions["verify"]
            sub = sub or golden_actions[command]
            assert f"--{opt.name}" in sub.format_help(), (opt.name, command)


def _scale_first_norm(dump_path: Path, factor: float) -> None:
    """Multiply the first output Norm of the first API in an msprobe dump.json by ``factor``."""
    dump = json.loads(dump_path.read_text())
    api = next(a for a in dump["data"].values() if a.get("output"))
    out = api["output"][0]
    out["Norm"] *= factor
    dump_path.write_text(json.dumps(dump))


def test_compare_verifies_golden_sha256(golden_copy: Path, tmp_path: Path) -> None:
    """The CLI checks every golden file against its manifest, as the plugin does."""
    target = export_golden(golden_copy, tmp_path / "target")
    stored = golden_copy / "step_1" / "actor_update" / "step0" / "rank0" / "dump.json.zst"
    stored.write_bytes(stored.read_bytes() + b"\0")  # a byte appended to the stored frame
    proc = cli("compare", str(target), str(golden_copy), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL " in proc.stdout
    assert "actor_update/step0/rank0/dump.json.zst: sha256 differs from manifest.json" in proc.stdout
    assert "PASS actor_update @ step_2" in proc.stdout  # only the edited file fails


def test_compare_cross_device_rules_from_target_device(golden_copy: Path, tmp_path: Path) -> None:
    """A target from another device than the golden's is judged with tolerance.cross_device (fp32 rtol 1e-3)."""
    target = export_golden(golden_copy, tmp_path / "target")
    _scale_first_norm(target / "step_1" / "actor_update" / "step0" / "rank0" / "dump.json", 1 + 1e-4)
    same = cli("compare", str(target), str(golden_copy), cwd=tmp_path)
    assert same.returncode == 1, same.stdout + same.stderr
    assert "FAIL actor_update @ step_1, rank0: 1 of " in same.stdout and "fp32: rtol 1.3e-06" in same.stdout
    (target / "run.json").write_text(json.dumps({"device": "npu"}))  # as our runner writes it
    cross = cli("compare", str(target), str(golden_copy), cwd=tmp_path)
    assert cross.returncode == 0, cross.stdout + cross.stderr
    assert (
        "PASS actor_update @ step_1, rank0: " in cross.stdout and "within tolerance (fp32: rtol 0.001" in cross.stdout
    )
    flag = cli("compare", str(target), str(golden_copy), "--device", "cpu", cwd=tmp_path)
    assert flag.returncode == 1  # --device overrides run.json: same device, same-device rules


@pytest.mark.slow
def test_golden_export_opens_in_msprobe_compare(recorded_project: Path, golden_copy: Path, tmp_path: Path) -> None:
    """An exported golden is the plain verl layout: msprobe's own `msprobe compare` reads it."""
    scenario = recorded_project / "scenarios" / "tiny_ppo.yaml"
    proc = cli(
        "golden", "export", str(scenario), "--golden-dir", str(golden_copy.parents[1]), "--out", "exp", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exported " in proc.stdout and "(21 files, " in proc.stdout
    dump = tmp_path / "exp" / "step_1" / "actor_update" / "step0" / "rank0" / "dump.json"
    assert json.loads(dump.read_text())["data"]
    msprobe = Path(sys.executable).parent / "msprobe"
    out = tmp_path / "msprobe_out"
    out.mkdir()
    run = subprocess.run(
        [str(msprobe), "compare", "-tp", str(dump), "-gp", str(dump), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    tables = list(out.glob("compare_result*.csv"))
    assert len(tables) == 1
    import pandas as pd

    df = pd.read_csv(tables[0])
    assert len(df) > 0 and set(df["Result"]) == {"pass"}
    again = cli(
        "golden", "export", str(scenario), "--golden-dir", str(golden_copy.parents[1]), "--out", "exp", cwd=tmp_path
    )
    assert again.returncode == 2 and "--out exp: not empty" in again.stderr
