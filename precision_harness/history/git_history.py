"""Git as the history store: the commits that changed a path, a path as it was at a commit, worktrees.

Everything here is ``git`` itself, run as a subprocess (no extra database, no git library): ``git
log`` lists the commits that touched a folder, ``git archive`` writes the folder as it was at one
of them into a temporary directory, ``git worktree`` gives a commit a checkout of its own so the
user's never changes. A failing git command raises :class:`~precision_harness.errors.HistoryError`
with git's own last line.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from precision_harness.errors import HistoryError

#: field separator of the ``git log`` format below (a control character no subject holds)
_SEP = "\x1f"
#: seconds a single git command may take (a ``git archive`` of a large golden included)
GIT_TIMEOUT = 300


@dataclass(frozen=True)
class Commit:
    """One commit: full and short hash, committer date (ISO 8601) and subject line."""

    sha: str
    short: str
    date: str
    subject: str


def _git_env() -> dict[str, str]:
    # a hook or a pager must never wait for a terminal; the user's locale must not translate messages
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", LC_ALL="C")
    return env


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``git -C cwd args...``; returns the completed process (stdout as bytes).

    Raises:
        HistoryError: git is not installed, or (``check``) the command exits non-zero; the message
            is the command and git's last error line.
    """
    try:
        proc = subprocess.run(
            ["git", "-C", str(cwd), *args], capture_output=True, env=_git_env(), timeout=GIT_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise HistoryError("git: not installed; golden history and bisect read the history through git") from None
    if check and proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"]
        raise HistoryError(f"git {' '.join(args[:3])}: {lines[-1]}")
    return proc


def git_text(cwd: Path, *args: str) -> str:
    """stdout of ``git -C cwd args...`` as text, stripped. Raises HistoryError."""
    return git(cwd, *args).stdout.decode(errors="replace").strip()


class Repository:
    """The git repository holding a path: its top level, and paths relative to it."""

    def __init__(self, toplevel: Path) -> None:
        self.toplevel = Path(toplevel).resolve()

    @classmethod
    def holding(cls, path: Path) -> Repository | None:
        """The repository whose working tree holds ``path`` (which may not exist yet); None outside one
        or where git is missing."""
        probe = Path(path).resolve()
        while not probe.is_dir():
            probe = probe.parent
        try:
            proc = git(probe, "rev-parse", "--show-toplevel", check=False)
        except HistoryError:
            return None
        if proc.returncode != 0:
            return None
        return cls(Path(proc.stdout.decode().strip()))

    def relative(self, path: Path) -> str:
        """``path`` as a POSIX path relative to the top level. Raises HistoryError outside the working tree."""
        try:
            return Path(path).resolve().relative_to(self.toplevel).as_posix()
        except ValueError:
            raise HistoryError(f"{path}: outside the git working tree {self.toplevel}") from None

    def resolve(self, rev: str) -> Commit:
        """The commit ``rev`` names (a hash, branch, tag, ``HEAD~3``).

        Raises:
            HistoryError: ``rev`` names no commit here (one line naming it).
        """
        ok = not rev.startswith("-")  # never an option to git
        proc = git(self.toplevel, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False) if ok else None
        if proc is None or proc.returncode != 0:
            raise HistoryError(f"{rev}: unknown revision in {self.toplevel} (expected a commit, branch or tag)")
        return self.commits(proc.stdout.decode().strip(), "-1", "--no-walk")[0]

    def commits(self, *log_args: str) -> list[Commit]:
        """``git log`` with ``log_args`` as :class:`Commit` s, newest first."""
        out = git_text(self.toplevel, "log", f"--format=%H{_SEP}%h{_SEP}%cI{_SEP}%s", *log_args)
        return [Commit(*line.split(_SEP, 3)) for line in out.splitlines() if line]

    def touching(self, rel: str, *, since: str | None = None, limit: int | None = None) -> list[Commit]:
        """Commits reachable from HEAD that changed ``rel`` (a folder), newest first; ``since``: only
        those after that revision; ``limit``: at most that many."""
        if git(self.toplevel, "rev-parse", "--verify", "-q", "HEAD", check=False).returncode != 0:
            return []  # a repository with no commit yet
        args = [f"-n{limit}"] if limit else []
        revs = [f"{self.resolve(since).sha}..HEAD"] if since else ["HEAD"]
        return self.commits(*args, *revs, "--", rel)

    def extract(self, rev: str, rel: str, into: Path) -> Path | None:
        """``rel`` (a folder) as it was at ``rev``, written below ``into``; returns ``into/rel``, or None
        where the folder did not exist at ``rev``.

        ``git archive`` streams the tree; members are extracted with tarfile's ``data`` filter, so
        no archived path can leave ``into``.
        """
        proc = git(self.toplevel, "archive", "--format=tar", rev, "--", rel, check=False)
        if proc.returncode != 0:
            if b"did not match any files" in proc.stderr:
                return None
            git(self.toplevel, "archive", "--format=tar", rev, "--", rel)  # raises with git's line
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            tar.extractall(into, filter="data")
        return Path(into) / rel

    def is_clean(self) -> bool:
        """True when tracked files have no uncommitted change."""
        return not git_text(self.toplevel, "status", "--porcelain", "--untracked-files=no")
