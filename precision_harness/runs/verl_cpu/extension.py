"""What ``import verl`` runs in each verl process on CPU (``VERL_USE_EXTERNAL_MODULES``): see the package docstring."""

from __future__ import annotations

import importlib.metadata

from precision_harness.runs.verl_engine import SUPPORTED_VERSIONS, unsupported_version_message

_version = importlib.metadata.version("verl")
if _version not in SUPPORTED_VERSIONS:
    raise RuntimeError(unsupported_version_message(_version))

from precision_harness.runs.verl_cpu import kernels, patches, platform, rollout  # noqa: E402

kernels.setup_process()
platform.register()
rollout.register()
patches.apply(_version)
