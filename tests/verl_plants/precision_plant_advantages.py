"""A planted change for the verl CPU end-to-end tests, loaded into every verl process by verl's own extension hook.

The tests put this folder on ``PYTHONPATH`` and name this module in ``VERL_USE_EXTERNAL_MODULES``
(the gate keeps a user's modules there and adds its CPU support first). On import it wraps every
advantage estimator in ``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY`` to scale the advantages
it returns by ``1 + 1e-4``, in the registry (``get_adv_estimator_fn``) and as the ``core_algos``
attribute it was registered from (``compute_advantage`` in ``ray_trainer.py`` calls GRPO and GAE
that way): a change the gate must catch at ``actor_update`` of step 1 and nowhere before it.
"""

from __future__ import annotations

import functools
from typing import Any

SCALE = 1 + 1e-4


def _planted(original: Any) -> Any:
    @functools.wraps(original)
    def estimator(*args: Any, **kwargs: Any) -> Any:
        advantages, returns = original(*args, **kwargs)
        return advantages * SCALE, returns

    estimator.__precision_planted__ = True
    return estimator


def _plant() -> None:
    import verl.trainer.ppo.core_algos as core_algos

    for name, fn in list(core_algos.ADV_ESTIMATOR_REGISTRY.items()):
        if getattr(fn, "__precision_planted__", False):
            continue
        planted = _planted(fn)
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = planted
        for attr, value in list(vars(core_algos).items()):
            if value is fn:
                setattr(core_algos, attr, planted)


_plant()
