"""Which APIs the replay can recompute, from their names in msprobe's ``dump.json`` alone (torch-free).

An API is named ``<prefix>.<name>.<call>.<direction>`` (``Functional.linear.0.forward``). The replay
recomputes a forward call of a torch functional API, a ``Tensor`` method, a ``torch`` function, a
``torch._VF`` or ``aten`` op, and a fused NPU op through msprobe's CPU bench function where msprobe
ships one (the worker checks that: :mod:`.msprobe_acc`). What it cannot recompute, and why:

- ``Distributed.*``: a collective's result is made of the other ranks' data, which this rank's
  capture does not hold (msprobe's acc_check skips them too: ``is_unsupported_api``);
- ops that draw random numbers (dropout, sampling): the device's generator state is not captured, so
  the replay would draw another mask;
- allocation and copies msprobe's acc_check skips (``empty*``, ``to``): nothing to compute;
- a backward call: msprobe's dump does not say which of its outputs is the gradient of which input
  (the forward call's inputs are replayed instead where they are judged);
- ``Module.*`` rows (L0, mix): a module is many ops; L1 (``level: auto``'s localisation) names the API;
- ``Stage.*`` rows (``level: auto``'s stage inputs and outputs): computed by the runner, not an API.
"""

from __future__ import annotations

#: API prefixes (msprobe's ``Const.API_DATA_PREFIX`` for pytorch) the replay can recompute
REPLAYABLE_PREFIXES = ("Functional", "Tensor", "Torch", "VF", "Aten", "NPU")
#: ops that draw random numbers (by msprobe's name, without prefix or call number)
RNG_OPS = frozenset(
    {
        "dropout",
        "dropout_",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "alpha_dropout",
        "feature_alpha_dropout",
        "native_dropout",
        "rrelu",
        "gumbel_softmax",
        "bernoulli",
        "bernoulli_",
        "multinomial",
        "normal",
        "normal_",
        "uniform_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
        "random_",
        "rand",
        "rand_like",
        "randn",
        "randn_like",
        "randint",
        "randint_like",
        "randperm",
        "poisson",
        "npu_dropout",
        "npu_dropout_with_add_softmax",
    }
)
#: what msprobe's acc_check does not run (``unsupported_api_list``): allocations and copies
NOTHING_TO_COMPUTE = frozenset({"to", "empty", "empty_like", "new_empty", "new_empty_strided", "empty_with_format"})


def split(api: str) -> tuple[str, str, str]:
    """``Functional.linear.0.forward`` -> ``("Functional", "linear", "forward")``; a module's row keeps its path."""
    prefix, _, rest = api.partition(".")
    parts = rest.split(".")
    direction = next((p for p in reversed(parts) if p in ("forward", "backward")), "")
    if len(parts) >= 3 and parts[-1] in ("forward", "backward") and parts[-2].isdigit():
        return prefix, ".".join(parts[:-2]), direction
    return prefix, rest, direction


def why_not_replayable(api: str) -> str | None:
    """Why ``api`` (a dump.json key) cannot be replayed, in words for a verdict; None when it can be tried."""
    prefix, name, direction = split(api)
    if prefix == "Distributed":
        return "a collective: its result is made of the other ranks' data, which this rank's capture does not hold"
    if prefix in ("Module", "Cell"):
        return "a module, not an API: its ops are recorded one by one at L1 (level: auto localises it there)"
    if prefix == "Stage":
        return "a value the runner computes for level: auto, not an API: the L1 localisation names the API"
    if prefix not in REPLAYABLE_PREFIXES:
        return f"{prefix} APIs have no CPU replay (msprobe's acc_check runs Functional, Tensor, Torch, Aten and NPU)"
    if name.split(".")[0] in RNG_OPS:
        return f"{name} draws random numbers: the device's generator state is not captured, so no replay draws the same"
    if name in NOTHING_TO_COMPUTE:
        return f"{name} allocates or copies: nothing to recompute (msprobe's acc_check skips it too)"
    if direction == "backward":
        return "a backward call: msprobe's dump does not say which of its outputs is the gradient of which input"
    return None
