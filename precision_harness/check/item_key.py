"""ItemKey: one gate item, a ``(step, stage)`` dump or the run's ``metrics.jsonl``.

The pytest items, the session, the compare path and the settings a pair is checked with all name
items by it, so it sits below them all in check/.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ItemKey:
    """One gate item: a ``(step, stage)`` dump, or the run's ``metrics.jsonl`` (both None)."""

    step: int | None = None
    stage: str | None = None

    @property
    def is_metrics(self) -> bool:
        return self.stage is None

    @property
    def selector(self) -> str:
        """The ``-k`` expression that selects this item alone."""
        return "metrics" if self.is_metrics else f"{self.stage} and step_{self.step}"


METRICS_ITEM = ItemKey()
