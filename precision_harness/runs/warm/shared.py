"""Warm servers shared by every pytest session of one job: runs forked from a server another session started.

The per-session warm server (:mod:`precision_harness.runs.warm.workers`) imports torch, transformers' Qwen2 and msprobe
once per pytest session: about 10 s on 2 cores. A job that starts many sessions (a CI job running the gate per
folder, or the harness's own tests, which start about 80) pays that once per session. With
``PRECISION_WARM_DIR`` set to a folder of its own and ``PRECISION_WARM_OWNER`` to the pid of the process that
owns the job, sessions share servers (:mod:`precision_harness.runs.warm.server`) kept in that folder:

- one server per run environment (:func:`server_key`: the interpreter and every environment variable but the
  per-test ones in :data:`VOLATILE` and those ``PRECISION_WARM_IGNORE_VARS`` names), started by the first session
  that needs it, under a file lock, so what torch and any ``sitecustomize`` read at import is what a fresh
  interpreter of that run reads;
- each run is a child forked from it, in the calling session's working directory, with its environment;
- a server ends with its owner process, after :data:`IDLE_S` seconds unused, or when its socket or folder is
  removed (see :func:`stop_all`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from precision_harness.errors import RunFailedError
from precision_harness.paths import display_path

#: the folder the shared servers live in (their sockets, pids and logs); unset: each session has its own server
DIR_ENV = "PRECISION_WARM_DIR"
#: the pid whose exit ends the servers (the process that set ``PRECISION_WARM_DIR``)
OWNER_ENV = "PRECISION_WARM_OWNER"
#: variables that differ between the tests of one job and no import reads: they do not pick the server
VOLATILE = frozenset(
    {"PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT", "PWD", "_"}
)
#: more variables no import reads, comma-separated (a ``sitecustomize`` that reads them at each call): runs that
#: differ only in them share a server
IGNORE_ENV = "PRECISION_WARM_IGNORE_VARS"
#: the pid and the exit code go to the client as one signed 64-bit integer each
WORD = struct.Struct("!q")
#: a request is a 4-byte length, then ``{"argv", "env", "log", "module", "cwd"}`` in JSON (data, never code)
LENGTH = struct.Struct("!I")
#: seconds a server stays up with no run forked from it (each holds about 450 MB)
IDLE_S = 90.0
#: seconds a new server may take to import and listen
START_TIMEOUT_S = 600.0
_servers: list[subprocess.Popen] = []  # this process's servers, kept so they are not reported as leaked


@dataclass(frozen=True)
class SharedServers:
    """The shared servers of ``folder``, ended with process ``owner``."""

    folder: Path
    owner: int

    def start(self, argv: list[str], env: dict[str, str], log_path: str, module: str) -> SharedChild:
        """Fork ``module``'s ``main(argv)`` from the server for ``env`` (starting it if none runs); its child.

        Raises:
            RunFailedError: the server could not be started (its log is named).
        """
        cwd = os.getcwd()
        key = server_key(env, cwd)
        conn = self._connect(key, env)
        request = json.dumps({"argv": argv, "env": env, "log": log_path, "module": module, "cwd": cwd}).encode()
        conn.sendall(LENGTH.pack(len(request)) + request)
        return SharedChild(conn, self.folder / f"{key}.log")

    def _connect(self, key: str, env: dict[str, str]) -> socket.socket:
        path = self.folder / f"{key}.sock"
        with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
            return _open(path)
        with FileLock(str(self.folder / f"{key}.lock")):
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                return _open(path)
            path.unlink(missing_ok=True)  # a server that ended left its socket behind
            return self._start_server(key, path, env)

    def _start_server(self, key: str, path: Path, env: dict[str, str]) -> socket.socket:
        log = self.folder / f"{key}.log"
        command = [sys.executable, "-m", "precision_harness.runs.warm.server", str(path), str(self.owner), str(IDLE_S)]
        with open(log, "ab") as fh:
            server = subprocess.Popen(
                command, env=env, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        _servers.append(server)
        (self.folder / f"{key}.pid").write_text(str(server.pid))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                return _open(path)
            if server.poll() is not None:
                raise RunFailedError(f"the warm server exited with {server.returncode} (log: {display_path(log)})")
            time.sleep(0.1)
        server.kill()
        raise RunFailedError(f"the warm server did not listen within {START_TIMEOUT_S:g} s (log: {display_path(log)})")


class SharedChild:
    """A run forked by a shared server, with the part of ``multiprocessing.Process`` the launchers use."""

    def __init__(self, conn: socket.socket, server_log: Path) -> None:
        self._conn, self._server_log = conn, server_log
        self.exitcode: int | None = None
        self.pid = self._read(None)

    def _read(self, timeout: float | None) -> int:
        self._conn.settimeout(timeout)
        try:
            return WORD.unpack(read_exactly(self._conn, WORD.size))[0]
        except EOFError:
            raise RunFailedError(
                f"the warm server ended while a run was in progress (log: {display_path(self._server_log)})"
            ) from None

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: until it ends) for the child's exit code."""
        if self.exitcode is not None:
            return
        with contextlib.suppress(TimeoutError):
            self.exitcode = self._read(timeout)
            self._conn.close()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def read_exactly(conn: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``conn`` (both ends of the protocol).

    Raises:
        EOFError: the other end closed the connection first.
        TimeoutError: ``conn``'s timeout passed.
    """
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the other end closed the connection")
        data += chunk
    return data


def _open(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        raise
    return conn


def server_key(env: dict[str, str], cwd: str | None = None) -> str:
    """The server a run with ``env`` forks from: a hash of the interpreter and ``env`` less :data:`VOLATILE`, the
    names ``env[PRECISION_WARM_IGNORE_VARS]`` lists, and ``PYTHONPATH``'s entries that name ``cwd``.

    A fresh worker (``python -m``) has its working directory first on ``sys.path`` already, so such an entry adds
    nothing to its imports; pytester's subprocess sessions put their own folder there. Where ``cwd`` holds a
    ``sitecustomize.py`` or ``usercustomize.py`` (imported at start-up), the entry is kept.
    """
    ignored = VOLATILE | {name.strip() for name in env.get(IGNORE_ENV, "").split(",") if name.strip()}
    kept = dict((name, value) for name, value in env.items() if name not in ignored)
    if cwd is not None and "PYTHONPATH" in kept and not _customizes(cwd):
        here = os.path.abspath(cwd)
        entries = kept["PYTHONPATH"].split(os.pathsep)
        kept["PYTHONPATH"] = os.pathsep.join(p for p in entries if os.path.abspath(p) != here)
    return hashlib.sha256(json.dumps([sys.executable, sorted(kept.items())]).encode()).hexdigest()[:16]


def _customizes(folder: str) -> bool:
    return any(os.path.exists(os.path.join(folder, name)) for name in ("sitecustomize.py", "usercustomize.py"))


def configured() -> SharedServers | None:
    """The shared servers ``PRECISION_WARM_DIR`` and ``PRECISION_WARM_OWNER`` name, or None where unset.

    Raises:
        RunFailedError: ``PRECISION_WARM_OWNER`` is not a pid, or ``PRECISION_WARM_DIR`` is not a folder.
    """
    folder, owner = os.environ.get(DIR_ENV), os.environ.get(OWNER_ENV)
    if not folder or not owner:
        return None
    if not owner.isdigit():
        raise RunFailedError(f"{OWNER_ENV}={owner!r}: expected the pid of the process that owns {DIR_ENV}'s servers")
    if not Path(folder).is_dir():
        raise RunFailedError(f"{DIR_ENV}={folder}: no such folder; create one of the job's own, or unset it")
    return SharedServers(Path(folder).resolve(), int(owner))  # absolute: the server runs in that folder


def stop_all(folder: Path, wait_s: float = 10.0) -> None:
    """End the servers of ``folder`` (SIGTERM: each kills its children first); wait up to ``wait_s`` for them all."""
    pids = set()
    for pid_file in folder.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            pids.add(pid)
    for server in _servers:  # this process's children: reaped here, or each stays a zombie
        if server.pid in pids:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(wait_s)
    deadline = time.monotonic() + wait_s
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie stays where pid 1 does not reap, as in containers)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
