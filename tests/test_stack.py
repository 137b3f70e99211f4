"""The stack a golden records (issue 32): versions read from the formats the vendors' files and tools use,
each rank's record, and the environment line that names an upgrade before the CPU.

The Ascend and NVIDIA samples are those tools' published output (npu-smi 24.1.rc1 on 910B1 hosts,
``ascend_toolkit_install.info`` and ``driver/version.info`` as CANN's install guide shows them,
``/proc/driver/nvidia/version``); no NPU or GPU ran these readers here.
"""

from __future__ import annotations

import json
from pathlib import Path

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.runs.host import rank_env, stack

NPU_SMI_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B1               | OK            | 89.1        32                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3437 / 65536         |
+===========================+===============+====================================================+
| 1     910B1               | OK            | 90.0        33                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          3437 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
"""
TOOLKIT_INFO = """\
package_name=Ascend-cann-toolkit
version=8.0.RC3
innerversion=V100R001C19SPC001B118
compatible_version=[V100R001C15],[V100R001C17],[V100R001C18],[V100R001C19]
arch=x86_64
os=linux
path=/usr/local/Ascend/ascend-toolkit/8.0.RC3/x86_64-linux
"""
DRIVER_INFO = "Version=24.1.rc2\nascendhal_version=7.35.19\naicpu_version=1.0\ntdt_version=1.0\n"
NVIDIA_PROC = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def test_npu_smi_gives_the_chip_model_and_count_not_the_process_table() -> None:
    assert stack.parse_npu_smi(NPU_SMI_INFO) == ("910B1", 2)
    assert stack.parse_npu_smi("") is None


def test_a_host_with_two_chip_models_names_both() -> None:
    mixed = NPU_SMI_INFO.replace("| 1     910B1  ", "| 1     910B3  ")
    assert stack.parse_npu_smi(mixed) == ("910B1, 910B3", 2)


def test_cann_is_read_from_the_toolkit_install_info_under_its_home(tmp_path: Path) -> None:
    info = tmp_path / "latest" / "x86_64-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text(TOOLKIT_INFO)
    assert stack.cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path / "latest")}, arch="x86_64") == "8.0.RC3"
    assert stack.cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path / "nowhere")}, arch="x86_64") is None


def test_driver_and_nvidia_versions_in_their_files_formats() -> None:
    assert stack.key_value(DRIVER_INFO, "version") == "24.1.rc2"
    assert stack.nvidia_driver_version(NVIDIA_PROC) == "535.104.05"
    assert stack.parse_nvidia_smi("NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n") == ("NVIDIA H100 80GB HBM3", 2)


def test_package_versions_name_only_what_is_installed() -> None:
    versions = stack.package_versions(("pytest", "no-such-distribution-precision"))
    assert set(versions) == {"pytest"} and versions["pytest"][0].isdigit()


def test_the_cpu_has_no_accelerator_stack() -> None:
    assert stack.accelerator_stack("cpu", {}) == {}


def test_each_rank_writes_its_stack_and_rank_0_leads_the_golden(tmp_path: Path) -> None:
    assert rank_env.write(tmp_path, 0, "cpu") is not None
    assert rank_env.write(tmp_path, 1, "cpu") is not None
    records = rank_env.read(tmp_path)
    assert sorted(records) == [0, 1] and records[0]["python"]
    record = json.loads((tmp_path / "env" / "rank0.json").read_text())
    assert record == records[0]
    merged = rank_env.merged({"num_threads": 1, "torch": "gate's"}, {0: {"torch": "2.13.0"}, 1: {"torch": "2.14.0"}})
    assert merged == {"num_threads": 1, "torch": "2.13.0", "torch@rank1": "2.14.0"}
    assert rank_env.merged({"a": 1}, {}) == {"a": 1}


def test_a_rank_process_writes_its_record_from_the_gates_variables(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PRECISION_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv(rank_env.ENV_DEVICE, "cpu")
    assert rank_env.write_from_environment() == tmp_path / "env" / "rank3.json"
    monkeypatch.delenv("RANK")
    assert rank_env.write_from_environment() is None  # the driver, a rollout server: not a rank


def test_an_upgrade_of_the_device_stack_is_named_before_the_cpu() -> None:
    golden = {"torch": "2.5.1", "torch_npu": "2.5.1", "cann": "8.0.RC3", "verl": "0.9.1", "cpu_model": "Kunpeng 920"}
    run = {"torch": "2.5.1", "torch_npu": "2.6.0", "cann": "8.1.RC1", "verl": "0.9.1", "cpu_model": "Kunpeng 930"}
    diff = EnvironmentDiff.between(golden, run)
    assert diff.summary.startswith("torch_npu 2.5.1 -> 2.6.0; CANN 8.0.RC3 -> 8.1.RC1; CPU Kunpeng 920")


def test_a_golden_from_another_npu_model_is_a_device_model_change() -> None:
    golden = {"device": "npu", "npu_chip": "910B1", "npu_count": 8}
    run = {"device": "npu", "npu_chip": "910B3", "npu_count": 8}
    change = EnvironmentDiff.between(golden, run).device_model
    assert change is not None and str(change) == "accelerator model 910B1 -> 910B3"
