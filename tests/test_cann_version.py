"""CANN's version is recorded on every CANN, from the toolkit's files where torch_npu cannot say (issue 40).

``torch_npu.utils.get_cann_version`` answers "" below CANN 8.1.RC1 (torch_npu's docs), and the NPU
fingerprint used to fall back to ``$ASCEND_TOOLKIT_HOME`` itself, so a golden recorded on CANN 8.0
held a path where its version belonged and an upgrade never named CANN. The layouts below are the
published ones: ``ascend_toolkit_install.info`` as vllm-ascend's ``collect_env`` prints it on CANN
8.0.RC3 (aarch64) and 8.1.RC1 (x86_64) hosts, and the CANN 8.0 toolkit root's ``version.cfg``. No
NPU ran these readers here.
"""

from __future__ import annotations

import platform
import sys
import types
from pathlib import Path

import pytest

from precision_harness.runs.host import stack
from precision_harness.runs.numerics import devices

CANN_80_INFO = """\
package_name=Ascend-cann-toolkit
version=8.0.RC3
innerversion=V100R001C19SPC001B155
compatible_version=[V100R001C13,V100R001C19],[V100R001C30]
arch=aarch64
os=linux
path=/usr/local/Ascend/ascend-toolkit/8.0.RC3/aarch64-linux
"""
CANN_81_INFO = """\
package_name=Ascend-cann-toolkit
version=8.1.RC1
innerversion=V100R001C21SPC001B238
compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21]
arch=x86_64
os=linux
path=/usr/local/Ascend/ascend-toolkit/8.1.RC1/x86_64-linux
"""
CANN_80_VERSION_CFG = """\
# version: 1.0
runtime_running_version=[7.6.0.1.220:8.0.0]
compiler_running_version=[7.6.0.1.220:8.0.0]
hccl_running_version=[7.6.0.1.220:8.0.0]
opp_running_version=[7.6.0.1.220:8.0.0]
toolkit_running_version=[7.6.0.1.220:8.0.0]
"""


def _toolkit(base: Path, release: str, files: dict[str, str]) -> Path:
    """``<base>/ascend-toolkit/<release>`` holding ``files``, and ``latest`` linked to it, as CANN installs it."""
    home = base / "ascend-toolkit" / release
    for rel, text in files.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    (base / "ascend-toolkit" / "latest").symlink_to(release)
    return base / "ascend-toolkit" / "latest"


def test_cann_80_layout_reads_the_toolkit_install_info(tmp_path: Path) -> None:
    files = {"aarch64-linux/ascend_toolkit_install.info": CANN_80_INFO, "version.cfg": CANN_80_VERSION_CFG}
    latest = _toolkit(tmp_path, "8.0.RC3", files)
    assert stack.cann_version({"ASCEND_TOOLKIT_HOME": str(latest)}, arch="aarch64") == "8.0.RC3"


def test_cann_80_layout_without_the_arch_folder_reads_version_cfg(tmp_path: Path) -> None:
    """A container that mounts the toolkit root without ``<arch>-linux/`` still says its release."""
    latest = _toolkit(tmp_path, "8.0.0", {"version.cfg": CANN_80_VERSION_CFG})
    assert stack.cann_version({"ASCEND_HOME_PATH": str(latest)}, arch="aarch64") == "8.0.0"


def test_cann_81_layout_reads_the_toolkit_install_info(tmp_path: Path) -> None:
    latest = _toolkit(tmp_path, "8.1.RC1", {"x86_64-linux/ascend_toolkit_install.info": CANN_81_INFO})
    assert stack.cann_version({"ASCEND_TOOLKIT_HOME": str(latest)}, arch="x86_64") == "8.1.RC1"


def test_no_toolkit_file_gives_no_version_never_the_path(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "version.cfg").write_text("# version: 1.0\nruntime_running_version=[]\n")
    assert stack.cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path / "empty")}, arch="x86_64") is None


def _fake_torch_npu(cann: str) -> types.ModuleType:
    """torch_npu as the fingerprint calls it: ``utils.get_cann_version`` answering ``cann`` ("" below 8.1.RC1)."""
    module = types.ModuleType("torch_npu")
    module.utils = types.SimpleNamespace(get_cann_version=lambda module="CANN": cann)  # type: ignore[attr-defined]
    module.npu = types.SimpleNamespace(get_device_name=lambda index: "Ascend910B1")  # type: ignore[attr-defined]
    return module


def test_npu_fingerprint_on_cann_80_records_the_version_not_the_toolkit_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"{platform.machine()}-linux/ascend_toolkit_install.info": CANN_80_INFO}
    latest = _toolkit(tmp_path, "8.0.RC3", files)
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(latest))
    monkeypatch.setitem(sys.modules, "torch_npu", _fake_torch_npu(""))
    assert devices._npu_fingerprint()["cann"] == "8.0.RC3"


def test_npu_fingerprint_on_cann_81_takes_torch_npus_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setitem(sys.modules, "torch_npu", _fake_torch_npu("8.1.RC1"))
    assert devices._npu_fingerprint()["cann"] == "8.1.RC1"
