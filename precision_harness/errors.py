"""Errors a user can cause. Each renders as one line: file, field, what was expected, what to do.

The pytest plugin shows these without a traceback; the CLI prints them and exits 2.
"""

from __future__ import annotations


class PrecisionError(Exception):
    """Base class: a user-facing error whose ``str()`` is the whole, one-line message."""


class ScenarioError(PrecisionError):
    """A scenario YAML file is malformed, violates the schema, or names an unknown stage."""


class GoldenError(PrecisionError):
    """A golden is absent, corrupt or recorded under other settings."""


class GoldenMissingError(GoldenError):
    """No golden exists for a scenario/device (or for one of its steps or stages)."""


class GoldenCorruptError(GoldenError):
    """A golden file is unreadable, fails its schema, or does not match its manifest sha256."""


class GoldenStaleError(GoldenError):
    """The golden was recorded from another scenario hash or msprobe level: re-record, not drift."""


class ProbeUnavailableError(PrecisionError):
    """mindstudio-probe (msprobe) is not importable in the interpreter that needs it."""


class RunFailedError(PrecisionError):
    """A scenario worker process exited non-zero; the message carries the last error line."""
