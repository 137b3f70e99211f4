"""The runner's process does not import scikit-learn or SciPy, which transformers would import for nothing.

transformers 5.x imports both at import time where they are installed, for models and features the built-in loop
never uses: ``sklearn.metrics.roc_curve`` for assisted generation's confidence threshold
(``transformers/generation/candidate_generator.py``) and ``scipy.optimize.linear_sum_assignment`` for the
object-detection losses (``transformers/loss/loss_for_object_detection.py``). msprobe's requirement ``skl2onnx``
installs scikit-learn (and SciPy with it), so every runner process paid their imports: about a quarter of the 10
to 12 s a runner spends importing on a 2-core AMD EPYC, before it trains anything.

Importing this module marks ``sklearn`` and ``scipy`` absent in ``sys.modules`` (unless already imported), so
transformers' ``is_sklearn_available()`` and ``is_scipy_available()`` are false and importing either raises
ImportError, in this process only. Importing is the switch because the warm server's preload
(:mod:`precision_harness.runs.warm.workers`) can only import. The runner runs no user code, and neither torch nor
msprobe imports them on its paths; verl's processes, which run users' reward functions, are left alone.
"""

from __future__ import annotations

import sys

#: transformers' optional imports the built-in loop never uses
UNUSED = ("sklearn", "scipy")

for _name in UNUSED:
    sys.modules.setdefault(_name, None)  # type: ignore[arg-type]
