"""What README.md and docs/ name, checked against the code and the docs themselves (issue 40).

:func:`problems` reads a text and returns one line per reference that does not resolve:

- ``--precision-<name>``: an option of :data:`precision_harness.options.OPTIONS` (a pytest flag);
- ``precision-harness <command>`` (and ``golden <action>``): a subcommand the CLI's parser accepts
  (``build_parser().parse_args([..., "--help"])`` exits 0 only for one that exists);
- ``docs/<page>.md``: a page under docs/; ``docs/<page>.md#<anchor>``: a heading of that page, as
  GitHub makes its anchor; ``docs/<page>.md, "<section>"`` (or ``docs/<page>.md's "<section>"``,
  ``README, "<section>"``): a heading, or a paragraph's bold lead-in, that begins with those words.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

from precision_harness.cli import build_parser
from precision_harness.options import OPTIONS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: not inside a heading anchor (``#verl-on-cpu---precision-device-cpu``)
_OPTION = re.compile(r"(?<![\w#-])--precision-[a-z][a-z-]*[a-z]")
_COMMAND = re.compile(r"precision-harness ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
_PAGE = re.compile(r"docs/([A-Za-z_]+)\.md(?:#([\w-]+))?")
_SECTION = re.compile(r"(docs/[A-Za-z_]+\.md|README(?:\.md)?)(?:'s|,)\s+\"([^\"]+)\"")
_HEADING = re.compile(r"^#+\s+(.*)$", re.M)
_BOLD_LEAD = re.compile(r"^\s*(?:[-*]\s+|\d+\.\s+)?\*\*(.+?)\*\*", re.M)
#: words after "precision-harness" in prose that are not subcommands
_PROSE = frozenset({"is", "exits", "and", "or", "the", "cli", "command", "commands", "takes", "has"})


def pytest_flags() -> set[str]:
    return {f"--precision-{o.name}" for o in OPTIONS if o.pytest in ("option", "both")}


def command_exists(words: list[str]) -> bool:
    """Whether ``precision-harness <words>`` is a command of the CLI (its parser takes ``--help`` there)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            build_parser().parse_args([*words, "--help"])
        except SystemExit as exc:
            return exc.code == 0
    return False


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _plain(text: str) -> str:
    return " ".join(re.sub(r"[`*]", "", text).split()).rstrip(".:").lower()


def sections(page: Path) -> tuple[set[str], list[str]]:
    """A page's heading anchors, and its headings and bold lead-ins as plain lower-case text."""
    text = page.read_text()
    headings = _HEADING.findall(text)
    return {_slug(h) for h in headings}, [_plain(h) for h in headings + _BOLD_LEAD.findall(text)]


def _page(name: str) -> Path:
    return ROOT / "README.md" if name.startswith("README") else DOCS / f"{Path(name).stem}.md"


def problems(text: str, source: str) -> Iterator[str]:
    """One line per reference in ``text`` (from ``source``) that names nothing in the code or the docs."""
    flags = pytest_flags()
    for flag in sorted(set(_OPTION.findall(text)) - flags):
        yield f"{source}: {flag} is not an option of precision_harness/options.py OPTIONS"
    for first, second in sorted(set(_COMMAND.findall(text))):
        if first in _PROSE:
            continue
        words = [first, second] if first == "golden" and second else [first]
        if not command_exists(words):
            yield f"{source}: 'precision-harness {' '.join(words)}' is not a command of precision_harness/cli.py"
    for page, anchor in sorted(set(_PAGE.findall(text))):
        path = DOCS / f"{page}.md"
        if not path.is_file():
            yield f"{source}: docs/{page}.md does not exist"
        elif anchor and anchor not in sections(path)[0]:
            yield f"{source}: docs/{page}.md#{anchor} is no heading of docs/{page}.md"
    for page, section in sorted(set(_SECTION.findall(text))):
        path = _page(page)
        wanted = _plain(section)
        if path.is_file() and not any(s.startswith(wanted) for s in sections(path)[1]):
            yield f'{source}: {page}, "{section}" is no heading or bold lead-in of {path.relative_to(ROOT)}'


def documented() -> str:
    """README.md and every page of docs/, as one text per file: ``{source: text}``."""
    return {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]}
