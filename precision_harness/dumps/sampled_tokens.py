"""The tokens a ``rollout_generate`` stage sampled, and the verdict that names the first one that changed.

The built-in loop writes ``step_<n>/rollout_generate/step0/rank<r>/sampled_tokens.json`` beside the
stage's dump: ``{"responses": [[token id, ...], ...]}``, ``(bs*n, R)`` as sampled (pad after eos). A
changed token explains every statistic downstream of it, so the gate reports it before comparing any
(docs/consistency.md). Torch-free: the pytest process reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from precision_harness.errors import GoldenCorruptError

SAMPLED_TOKENS = "sampled_tokens.json"


def payload(responses: list[list[int]]) -> str:
    """The file's text for ``responses`` (token ids, one list per sampled sequence)."""
    return json.dumps({"responses": responses}, separators=(",", ":")) + "\n"


def _responses(content: bytes, shown: str) -> list[list[int]]:
    try:
        data: Any = json.loads(content.decode("utf-8"))
        rows = data["responses"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise GoldenCorruptError(f"{shown}: not a {SAMPLED_TOKENS} ({exc})") from None
    return rows


def first_change(run: list[list[int]], golden: list[list[int]]) -> str | None:
    """``sample 3 position 5: token 17 -> 42 (first of 6 changed tokens)`` (golden -> run), or None if equal.

    Sequences are compared position by position, row-major; a different number of sequences or of
    positions is reported as such.
    """
    if len(run) != len(golden) or any(len(a) != len(b) for a, b in zip(run, golden, strict=True)):
        shape = f"{len(run)} x {len(run[0]) if run else 0}"
        recorded = f"{len(golden)} x {len(golden[0]) if golden else 0}"
        return f"sampled {shape} tokens, the golden {recorded}"
    changed = [
        (i, t, g, r)
        for i, (rr, gr) in enumerate(zip(run, golden, strict=True))
        for t, (r, g) in enumerate(zip(rr, gr, strict=True))
        if r != g
    ]
    if not changed:
        return None
    i, t, g, r = changed[0]
    return f"sample {i} position {t}: token {g} -> {r} (first of {len(changed)} changed tokens)"


def compare_stage(run_stage: Path, golden: Any, step: int, stage: str) -> str | None:
    """The first changed token of a ``rollout_generate`` stage against ``golden``, per rank, or None.

    ``golden`` is a :class:`~precision_harness.goldens.golden.Golden`; a golden without the file (recorded
    before the gate kept it) has nothing to compare. A run rank without the file the golden has is a finding:
    its tokens were not compared. Returns ``<stage> @ step_<n>: [rank<r>: ]<first_change or what is missing>``.

    Raises:
        GoldenCorruptError: a file is not JSON with ``responses`` (or the golden's fails its sha256).
    """
    prefix = f"step_{step}/{stage}/step0/"
    ranks = sorted(
        {p.parent.name for p in Path(run_stage).glob(f"step0/rank*/{SAMPLED_TOKENS}")}
        | {
            n[len(prefix) :].split("/")[0]
            for n in golden.contents
            if n.startswith(prefix) and n.endswith(SAMPLED_TOKENS)
        }
    )
    for rank in ranks:
        name = f"{prefix}{rank}/{SAMPLED_TOKENS}"
        if name not in golden.contents:
            continue
        where = f"{stage} @ step_{step}: {rank}: " if len(ranks) > 1 else f"{stage} @ step_{step}: "
        path = Path(run_stage) / "step0" / rank / SAMPLED_TOKENS
        if not path.is_file():
            return (
                f"{where}the run wrote no {SAMPLED_TOKENS} where the golden has one: its sampled tokens were not "
                "compared (the rollout recorded none; a command scenario writes it with precision_harness.stage)"
            )
        change = first_change(_responses(path.read_bytes(), str(path)), _responses(golden.read(name), name))
        if change is not None:
            return f"{where}{change}"
    return None
