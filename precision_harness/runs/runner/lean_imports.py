"""The runner's process does not import scikit-learn, which transformers would import for nothing.

transformers 5.x (``transformers/generation/candidate_generator.py``) imports ``sklearn.metrics.roc_curve`` when
scikit-learn is installed, for assisted generation's confidence threshold. msprobe's requirement ``skl2onnx``
installs scikit-learn, so every run paid its import, scipy's included: 2 to 3 s of the 10 to 12 s a runner
process spends importing (2-core AMD EPYC), and the built-in loop never generates with an assistant model.

Importing this module marks ``sklearn`` absent in ``sys.modules`` (unless it is already imported), so
transformers' ``is_sklearn_available()`` is false and ``import sklearn`` raises ImportError, in this process only.
Importing is the switch because the warm server's preload (:mod:`precision_harness.runs.warm`) can only import.
The runner runs no user code, so nothing in it wants scikit-learn; verl's processes, which run users' reward
functions, are left alone.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("sklearn", None)  # type: ignore[arg-type]
