"""The golden root a commit's pytest configuration sets (``precision_golden_dir``), found as pytest finds it.

pytest (``_pytest.config.findpaths.locate_config``) looks in the folder of its arguments' common
ancestor, then in each parent, and in each folder takes the first of: ``pytest.ini`` or
``.pytest.ini`` (even without a ``[pytest]`` section), ``pyproject.toml`` with
``[tool.pytest.ini_options]``, ``tox.ini`` with ``[pytest]``, ``setup.cfg`` with ``[tool:pytest]``.
That file's folder is the rootdir, which ``precision_golden_dir`` is relative to (default
``golden``). Here the files are read from one commit (``git cat-file``), from the scenario's folder up
to the repository's top level; with none of them the rootdir is the top level, where bisect runs
pytest. Not followed: ``-c``, ``--rootdir`` and pytest 9's native ``[tool.pytest]`` table.
"""

from __future__ import annotations

import configparser
import posixpath
import sys
from collections.abc import Callable
from pathlib import PurePosixPath

from precision_harness.errors import HistoryError
from precision_harness.history.git_history import Commit, Repository, git

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

KEY = "precision_golden_dir"
DEFAULT = "golden"


def _ini(section: str, *, always: bool) -> Callable[[str], dict[str, str] | None]:
    def read(text: str) -> dict[str, str] | None:
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        if parser.has_section(section):
            return dict(parser[section])
        return {} if always else None

    return read


def _pyproject(text: str) -> dict[str, str] | None:
    table = tomllib.loads(text).get("tool", {}).get("pytest", {}).get("ini_options")
    return None if table is None else {k: str(v) for k, v in table.items()}


#: pytest's order within one folder: the first file that holds a pytest section wins
CANDIDATES: tuple[tuple[str, Callable[[str], dict[str, str] | None]], ...] = (
    ("pytest.ini", _ini("pytest", always=True)),
    (".pytest.ini", _ini("pytest", always=True)),
    ("pyproject.toml", _pyproject),
    ("tox.ini", _ini("pytest", always=False)),
    ("setup.cfg", _ini("tool:pytest", always=False)),
)


def golden_dir_at(repo: Repository, commit: Commit, scenario: str) -> str:
    """The golden root pytest would use at ``commit`` for ``scenario`` (both relative to the top level,
    POSIX); ``golden`` where no ini file sets ``precision_golden_dir``.

    Raises:
        HistoryError: an ini file at ``commit`` that does not parse, or a ``precision_golden_dir``
            outside the repository (absolute, or leading out with ``..``); pass ``--golden-dir`` then.
    """
    folder = PurePosixPath(scenario).parent
    for where in (folder, *folder.parents):
        for name, read in CANDIDATES:
            path = (where / name).as_posix()
            shown = git(repo.toplevel, "cat-file", "-p", f"{commit.sha}:{path}", check=False)
            if shown.returncode != 0:
                continue
            try:
                ini = read(shown.stdout.decode(errors="replace"))
            except (configparser.Error, tomllib.TOMLDecodeError) as exc:
                why = str(exc).splitlines()[0]
                msg = f"{path} at {commit.short}: does not parse ({why}); fix it or pass --golden-dir"
                raise HistoryError(msg) from None
            if ini is not None:
                return _inside(path, commit, posixpath.normpath((where / ini.get(KEY, DEFAULT)).as_posix()))
    return DEFAULT


def _inside(path: str, commit: Commit, rel: str) -> str:
    if posixpath.isabs(rel) or rel == ".." or rel.startswith("../"):
        raise HistoryError(
            f"{path} at {commit.short}: {KEY} = {rel} is outside the repository, so not in the commit; "
            "pass --golden-dir"
        )
    return rel
