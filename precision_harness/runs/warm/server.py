"""A shared warm server: ``python -m precision_harness.runs.warm.server SOCKET OWNER_PID IDLE_S``.

It imports what the per-session forkserver imports (:data:`precision_harness.runs.warm.workers.PRELOAD`) once, then
forks one child per request that a client of :mod:`precision_harness.runs.warm.shared` sends on the Unix socket
``SOCKET``. The child is :func:`precision_harness.runs.warm.workers.run_child` in the client's working directory, with
the client's environment; the server answers the child's pid, then its exit code (``os.waitstatus_to_exitcode``:
negative for a signal), as the standard library's forkserver does for ``multiprocessing``.

Its environment is the one its first client's run had, and clients of another environment use another server
(:func:`precision_harness.runs.warm.shared.server_key`), so what torch and a ``sitecustomize`` read at import is
what a fresh interpreter of that run would have read.

It ends, killing any child still running, when the owner process ``OWNER_PID`` is gone or on SIGTERM. After
``IDLE_S`` seconds with no child (each server holds about 450 MB), or once ``SOCKET`` is removed, it stops listening
and ends with its last child. A client that disconnects before its child ended has its child killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from precision_harness.runs.warm.shared import LENGTH, WORD, read_exactly

#: seconds between checks that the owner process and the socket still exist
POLL_S = 1.0


@dataclass
class _State:
    socket_path: Path
    owner: int
    idle_s: float  #: seconds without a child after which the server stops listening and ends
    listening: bool = True
    last_active: float = field(default_factory=time.monotonic)  #: when the last child ended (or the server began)
    children: dict[int, socket.socket] = field(default_factory=dict)  #: pid -> the connection that asked for it


def _owner_alive(owner: int) -> bool:
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_request(conn: socket.socket) -> dict:
    (size,) = LENGTH.unpack(read_exactly(conn, LENGTH.size))
    return json.loads(read_exactly(conn, size))


def _child(request: dict, server_dir: str, closing: list) -> None:
    """The forked child: nothing of the server's loop, the client's directory, then the run (never returns)."""
    code = 1
    try:
        for obj in closing:
            obj.close()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(request["cwd"])
        _client_sys_path(request, server_dir)
        from precision_harness.runs.warm import workers as warm

        warm.run_child(request["argv"], request["env"], request["log"], request["module"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # whatever the run raised ends this child with code 1, its trace in the log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _client_sys_path(request: dict, server_dir: str) -> None:
    """``sys.path`` as the client's fresh worker would have it: its directory first (``python -m`` put the server's
    there), without the server's ``PYTHONPATH`` entries that the client's lacks (its first client's folder, which
    :func:`~precision_harness.runs.warm.shared.server_key` does not count)."""
    if sys.path and sys.path[0] == server_dir:
        sys.path[0] = request["cwd"]

    def entries(env: dict) -> set[str]:
        return {os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p}

    stale = entries(os.environ) - entries(request["env"])
    sys.path[1:] = [p for p in sys.path[1:] if os.path.abspath(p) not in stale]


def _send(conn: socket.socket, value: int) -> None:
    with contextlib.suppress(OSError):  # the client is gone: nobody is left to tell
        conn.sendall(WORD.pack(value))


def _reap(state: _State, selector: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = state.children.pop(pid, None)
        state.last_active = time.monotonic()
        if conn is not None:
            _send(conn, os.waitstatus_to_exitcode(status))
            with contextlib.suppress(KeyError):  # unregistered already where the client went first
                selector.unregister(conn)
            conn.close()


def _accept(listener: socket.socket, state: _State, selector: selectors.BaseSelector, closing: list) -> None:
    conn = listener.accept()[0]
    conn.setblocking(True)
    try:
        request = _read_request(conn)
    except (EOFError, OSError, ValueError):  # ValueError: not JSON
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(request, str(state.socket_path.parent), [*closing, *state.children.values(), conn])
    state.children[pid] = conn
    selector.register(conn, selectors.EVENT_READ)
    _send(conn, pid)


def _client_gone(conn: socket.socket, state: _State, selector: selectors.BaseSelector) -> None:
    """A client connection became readable: it only ever closes, so its child is killed (its exit is still reaped)."""
    with contextlib.suppress(OSError):
        if conn.recv(1):
            return
    for pid, owner_conn in list(state.children.items()):
        if owner_conn is conn:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    selector.unregister(conn)


def _stop(*_args: object) -> None:
    raise SystemExit(0)


def serve(state: _State, listener: socket.socket) -> None:
    """Fork a child per request until idle, or until the owner is gone; kill the children left on the way out."""
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_r, False)
    os.set_blocking(sig_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD wakes the selector through sig_w
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C is for the sessions, which kill their runs
    signal.signal(signal.SIGTERM, _stop)
    signal.set_wakeup_fd(sig_w)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sig_r, selectors.EVENT_READ)
    closing = [listener, selector, _Fd(sig_r), _Fd(sig_w)]
    try:
        while _owner_alive(state.owner) and (state.listening or state.children):
            if state.listening and _should_close(state):
                _close_listener(listener, state, selector, closing)
            for key, _events in selector.select(POLL_S):
                if key.fileobj is listener:
                    _accept(listener, state, selector, closing)
                elif key.fileobj == sig_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(sig_r, 4096)
                    _reap(state, selector)
                else:
                    _client_gone(key.fileobj, state, selector)  # type: ignore[arg-type]
    finally:
        for pid in state.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if state.listening:  # once it stopped listening, the name may already be a newer server's
            with contextlib.suppress(FileNotFoundError):
                state.socket_path.unlink()


def _should_close(state: _State) -> bool:
    """Idle past ``state.idle_s`` with no child running, or the socket was removed (the folder's owner ended it)."""
    idle = not state.children and time.monotonic() - state.last_active > state.idle_s
    return idle or not state.socket_path.exists()


def _close_listener(listener: socket.socket, state: _State, selector: selectors.BaseSelector, closing: list) -> None:
    """Take the socket's name away (a new client starts another server), then serve who connected meanwhile.

    A connect names the socket's path, so none can arrive once it is unlinked; those already queued are accepted.
    The server then ends when its last child has.
    """
    with contextlib.suppress(FileNotFoundError):
        state.socket_path.unlink()
    listener.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            _accept(listener, state, selector, closing)
    selector.unregister(listener)
    listener.close()
    state.listening = False


@dataclass
class _Fd:
    """A raw descriptor with the ``close()`` the child calls on everything of the server's loop."""

    fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def main(argv: list[str]) -> NoReturn:
    socket_path, owner, idle_s = Path(argv[0]), int(argv[1]), float(argv[2])
    from precision_harness.runs.warm import workers as warm

    warm.preload()
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(socket_path))
    listener.listen(64)
    print(f"warm server {os.getpid()}: listening on {socket_path} for owner {owner}", flush=True)
    code = 0
    try:
        serve(_State(socket_path, owner, idle_s), listener)
    except SystemExit:  # SIGTERM (_stop), after serve's cleanup
        pass
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Finalizing the preloaded torch, transformers and msprobe modules frees nothing the exit does not, and took
    # over 10 s on a loaded 2-core CI host: an idle server, or one told to stop, kept its 450 MB that long.
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
