"""Worker entry point: ``python -m precision_harness.runs.api_replay REQUEST.json OUT.json``.

``REQUEST.json``: ``{"rank_dir": ".../step0/rank0", "calls": [{"api": "Functional.linear.0.forward",
"output": "Functional.linear.0.forward.output.0", "golden_dtype": "torch.float32"}, ...]}``, a ``task: tensor``
capture's rank folder and the outputs to judge, each with the golden's dtype of it (optional: the standard's
dtype where the output narrowed, :func:`~.replay.replay_call`). ``OUT.json``: ``{"calls": [...]}``, one
:func:`~.replay.replay_call` result per call, in order. A call that cannot be replayed says why in its result;
the worker exits 1 only when it cannot read the request or write its answer (the reason on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m precision_harness.runs.api_replay REQUEST.json OUT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    import torch

    from precision_harness.runs.api_replay.replay import replay_call

    torch.set_num_threads(1)  # the baseline's reduction order must not depend on the machine's cores
    rank_dir = Path(request["rank_dir"])
    dump = json.loads((rank_dir / "dump.json").read_text(encoding="utf-8"))
    calls = [
        replay_call(dump, rank_dir, call["api"], call["output"], call.get("golden_dtype")) for call in request["calls"]
    ]
    Path(args[1]).write_text(json.dumps({"calls": calls}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
