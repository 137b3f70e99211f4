"""msprobe's four tensor statistics, by the names ``dump.json`` uses, and how far one moved between two dumps.

Read by the compare (check/), the golden store's lint and the update churn (goldens/), so they sit
below both.
"""

from __future__ import annotations

import math

#: the statistics of a tensor entry in msprobe's ``dump.json`` (``summary_mode: statistics``)
STATISTICS = ("Max", "Min", "Mean", "Norm")


def relative_change(target: float, golden: float) -> float:
    """``|target - golden| / |golden|`` (``inf`` when golden is 0 and target is not)."""
    if target == golden:
        return 0.0
    if golden == 0 or not math.isfinite(golden) or not math.isfinite(target):
        return math.inf
    return abs(target - golden) / abs(golden)
