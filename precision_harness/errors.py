"""Errors a user can cause. Each renders as one line: file, field, what was expected, what to do.

The pytest plugin shows these without a traceback. ``precision-harness`` prints them and exits with
the class's :attr:`PrecisionError.exit_code`: 2 (:data:`EXIT_USAGE`) when the input is wrong (a
scenario file, a missing golden, an unsafe name), 1 (:data:`EXIT_DRIFT`) when a run failed or a
golden is corrupt or stale.
"""

from __future__ import annotations

EXIT_PASS, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A ``precision-harness`` command-line mistake (an argument that cannot work): one line, exit 2."""


class PrecisionError(Exception):
    """Base class: a user-facing error whose ``str()`` is the whole, one-line message."""

    exit_code = EXIT_DRIFT


class ScenarioError(PrecisionError):
    """A scenario YAML file is malformed, violates the schema, or names an unknown stage."""

    exit_code = EXIT_USAGE


class SchemaError(PrecisionError):
    """A document fails its packaged JSON Schema (``precision_harness.schemas``); the message names the field."""

    exit_code = EXIT_USAGE


class VerlMissingError(ScenarioError):
    """An ``engine: verl`` scenario where verl is not installed (one line naming the extra): its items fail, or skip
    under ``--precision-allow-skip``."""


class GoldenError(PrecisionError):
    """A golden is absent, corrupt or recorded under other settings."""


class GoldenMissingError(GoldenError):
    """No golden exists for a scenario/device (or for one of its steps or stages)."""

    exit_code = EXIT_USAGE


class GoldenCorruptError(GoldenError):
    """A golden file is unreadable, fails its schema, or does not match its manifest sha256."""


class GoldenStaleError(GoldenError):
    """The golden was recorded from another scenario hash or msprobe level: re-record, not drift."""


class GoldenNarrowedError(GoldenError):
    """The golden holds steps or stages its scenario no longer lists: they would be compared by nothing.

    Attributes:
        narrowing: the :class:`~precision_harness.goldens.narrowing.Narrowing` named by the message.
    """

    def __init__(self, message: str, narrowing: object = None) -> None:
        super().__init__(message)
        self.narrowing = narrowing


class GoldenRefusedError(GoldenError):
    """Recording refused: the run would make a golden that checks nothing (a stage without statistics) or
    holds NaN/Inf the scenario does not declare. Nothing in ``golden/`` changes."""


class GoldenDeviceModelError(GoldenError):
    """The golden was recorded on another accelerator model (GPU or NPU name) than the run's device.

    Not used silently: the gate asks for ``--precision-golden-device`` (cross-device rules) or a re-record.
    """


class ProbeUnavailableError(PrecisionError):
    """mindstudio-probe (msprobe) is not importable in the interpreter that needs it."""


class UnsafePathError(PrecisionError):
    """A name from user input would place a file outside ``golden/`` or the artifacts folder."""

    exit_code = EXIT_USAGE


class RunFailedError(PrecisionError):
    """A scenario worker process exited non-zero; the message carries the last error line."""


class HistoryError(PrecisionError):
    """Git cannot give what golden history or bisect asked for: no repository, an unknown revision, a
    worktree that cannot be made."""

    exit_code = EXIT_USAGE
