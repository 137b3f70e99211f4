"""Every option, CLI command and doc section that README.md and docs/ name exists in the code and the docs
(issue 40): the checker (tests/doc_references.py) over the real pages, and over a small text with
made-up names, which it must name one by one.
"""

from __future__ import annotations

import re

import pytest
from doc_references import DOCS, command_exists, documented, problems, pytest_flags

from precision_harness.cli import build_parser
from precision_harness.options import OPTIONS


def test_readme_and_docs_name_only_what_exists() -> None:
    found = [line for source, text in documented().items() for line in problems(text, source)]
    assert not found, "\n".join(found)


def _commands(help_text: str) -> list[str]:
    """The subcommands an argparse help lists under its positional argument (4-space indented names)."""
    return re.findall(r"^    ([a-z][a-z-]*)\b", help_text, re.M)


def test_every_option_and_command_of_the_code_is_in_the_reference() -> None:
    reference = (DOCS / "reference.md").read_text()
    names = [f"--precision-{o.name}" if o.pytest == "option" else f"precision_{o.dest}" for o in OPTIONS if o.pytest]
    assert [n for n in names if n not in reference] == []
    commands = _commands(build_parser().format_help())
    assert {"run", "compare", "golden", "calibrate"} <= set(commands), commands
    assert [c for c in commands if not re.search(rf"precision-harness[^\n]*\b{c}\b|`{c}`", reference)] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pytest --precision-jobs 1 --precision-frobnicate x", ["--precision-frobnicate is not an option"]),
        ("run `precision-harness calibrate` then `precision-harness recalibrate`", ["'precision-harness recalibrate'"]),
        (
            "`precision-harness golden verify` and `precision-harness golden polish`",
            ["'precision-harness golden polish'"],
        ),
        ("see docs/levels.md and docs/speed.md", ["docs/speed.md does not exist"]),
        ("docs/goldens.md#sizing and docs/goldens.md#weighing", ["docs/goldens.md#weighing is no heading"]),
        ('docs/levels.md, "Collection levels" and docs/levels.md, "Colour levels"', ['"Colour levels" is no heading']),
        ('README, "Install" and README, "Collection levels"', ['README, "Collection levels" is no heading']),
        ('docs/scenarios.md, "Recording with pinned\n rollouts runs twice"', []),  # a bold lead-in, over a line break
    ],
)
def test_the_checker_names_each_made_up_reference(text: str, expected: list[str]) -> None:
    found = list(problems(text, "sample.md"))
    assert len(found) == len(expected), found
    for line, part in zip(found, expected, strict=True):
        assert line.startswith("sample.md: ") and part in line, (line, part)


def test_the_commands_and_flags_it_checks_against_are_the_codes() -> None:
    assert command_exists(["golden", "history"]) and not command_exists(["history"])
    assert "--precision-jobs" in pytest_flags() and "--precision-golden-dir" not in pytest_flags()  # an ini key
