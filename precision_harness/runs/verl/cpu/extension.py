"""What ``import verl`` runs in each verl process on CPU (``VERL_USE_EXTERNAL_MODULES``): see the package docstring."""

from __future__ import annotations

import importlib.metadata
import os

from precision_harness.runs.verl.release import SUPPORTED_VERSIONS, unsupported_version_message

# a Ray worker of a run on the gate's shared Ray starts in that instance's folder: relative paths in verl's
# config resolve from the driver's, as with a Ray of the run's own (precision_harness/runs/verl/shared_ray.py)
if os.environ.get("PRECISION_WORKDIR") and os.getcwd() != os.environ["PRECISION_WORKDIR"]:
    os.chdir(os.environ["PRECISION_WORKDIR"])

_version = importlib.metadata.version("verl")
if _version not in SUPPORTED_VERSIONS:
    raise RuntimeError(unsupported_version_message(_version))

from precision_harness.runs.verl import ray_head  # noqa: E402
from precision_harness.runs.verl.cpu import kernels, patches, platform, rollout  # noqa: E402
from precision_harness.runs.verl.stages import on_import, timeline  # noqa: E402

kernels.setup_process()
platform.register()
# verl's rollout replica module costs 1.4 s to import; registered when a process imports it (on_import)
on_import.when_imported("verl.workers.rollout.replica", lambda _module: rollout.register())
patches.apply(_version)
timeline.process_ready()
# a driver joining the gate's shared Ray waits here for it to be up: its imports overlapped Ray's start-up
ray_head.wait_ready()
