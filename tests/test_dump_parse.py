"""The orjson parse of msprobe's dump.json: bare NaN/Infinity read, no string changed, corrupt dumps still named.

Python's ``json.dump`` (msprobe's writer) writes non-finite statistics as bare ``NaN``, ``Infinity`` and
``-Infinity``; orjson refuses them, so :func:`quote_non_finite` quotes those standing as values. A string of
the dump that holds the same letters, even where they look like a value, must come back unchanged.
"""

from __future__ import annotations

import json
import math

import pytest

from precision_harness.dumps.files import NON_FINITE, parse_dump, parse_dump_raw, quote_non_finite
from precision_harness.errors import GoldenCorruptError

#: an API and arguments spelt with the tokens, in strings, keys and values; msprobe's indented layout
TRICKY = """{"task": "statistics", "data": {
 "NaN.Infinity.0.forward": {
  "input_args": [{"type": "str", "value": "NaN"}, {"type": "str", "value": "-Infinity"},
                 {"type": "str", "value": "NaN is not a number: Infinity"}, {"type": "str", "value": " NaN "}],
  "input_kwargs": {"NaN": {"type": "float", "value": NaN}, "Infinity": {"type": "str", "value": "Infinity"}},
  "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2],
              "Max": Infinity, "Min": -Infinity, "Mean": NaN, "Norm": 1.5},
             [NaN, -Infinity,Infinity ]]}}}"""


def test_bare_tokens_are_read_through_orjson_and_no_string_or_key_changes() -> None:
    content = TRICKY.encode()
    raw = parse_dump_raw(content, shown="dump.json")
    entry = raw["data"]["NaN.Infinity.0.forward"]
    # the fast path read it: the bare tokens are its sentinels, every string is the original
    assert entry["output"][0]["Max"] == "\x00Infinity" and entry["input_kwargs"]["NaN"]["value"] == "\x00NaN"
    assert entry["output"][1] == ["\x00NaN", "\x00-Infinity", "\x00Infinity"]
    assert {NON_FINITE[v] for v in entry["output"][1][1:]} == {math.inf, -math.inf}
    assert [a["value"] for a in entry["input_args"]] == ["NaN", "-Infinity", "NaN is not a number: Infinity", " NaN "]
    assert list(entry["input_kwargs"]) == ["NaN", "Infinity"]
    assert entry["input_kwargs"]["Infinity"]["value"] == "Infinity"
    restored = parse_dump(content, shown="dump.json")
    assert json.dumps(restored, sort_keys=True) == json.dumps(json.loads(content), sort_keys=True)
    assert math.isnan(restored["data"]["NaN.Infinity.0.forward"]["output"][0]["Mean"])


def test_a_token_inside_a_string_that_looks_like_a_value_falls_back_to_json_loads() -> None:
    """``"a, NaN]"`` gets quoted in the middle of its string; the result is no JSON, so json.loads reads it."""
    content = b'{"data": {"op": {"value": "a, NaN] b", "Max": NaN}}}'
    quoted, count = quote_non_finite(content)
    assert count == 2 and b'"a, "\\u0000NaN"] b"' in quoted
    dump = parse_dump_raw(content, shown="dump.json")
    assert dump["data"]["op"]["value"] == "a, NaN] b" and math.isnan(dump["data"]["op"]["Max"])


def test_a_dump_holding_a_nul_is_never_given_sentinels() -> None:
    content = b'{"data": {"op": {"value": "\\u0000NaN", "Max": NaN}}}'
    assert quote_non_finite(content) is None
    dump = parse_dump_raw(content, shown="dump.json")
    assert dump["data"]["op"]["value"] == "\x00NaN" and math.isnan(dump["data"]["op"]["Max"])


@pytest.mark.parametrize(
    ("content", "offset"),
    [
        (b'{"data": {NaN: 1}}', 10),  # a token as a key: no value, json.loads refuses it
        (b'{"data": {"a": [1, NaN: 2]}}', 22),
        (b'{"data": {"a": NaN', 18),  # truncated after a token
        (b'{"data": {"a": [NaN, Infinity', 29),
    ],
)
def test_a_corrupt_dump_with_tokens_names_the_byte_offset(content: bytes, offset: int) -> None:
    with pytest.raises(GoldenCorruptError) as raised:
        parse_dump_raw(content, shown="run/dump.json")
    assert f"run/dump.json: not JSON at byte {offset} of {len(content)} (" in str(raised.value)
