"""msprobe's analyses of a failing stage in a process of their own, started while the stage's other ranks are compared.

Importing msprobe's compare takes about 0.7 s (pandas, and the tensorboard stub msprobe's ``__init__`` loads): as
long as comparing a 30,000-call rank. In this process it could only come after the ranks, since a thread importing
it holds the GIL the rank compare needs. So where a large stage's rank fails and other ranks are still to be
compared (:func:`warm`), a worker process is started that imports msprobe on another core; :func:`analyze` then
hands it the stage's window, and the gate goes on (where the change entered) while msprobe reads. The worker stays
for the check's next failing stages, one at a time: msprobe is imported once a process, as it was here.

A worker is started where its import hides behind work left here:

- the stage's run dumps are at least :data:`MIN_WARM_BYTES` (sized as
  :func:`~precision_harness.check.compare.rank_pool.dump_bytes`, indexed goldens counted at their share);
- a rank failed and at least one rank is still to come;
- this machine gives the process two cores or more, and it is not a pytest-xdist worker (xdist fills the cores);
- msprobe's compare is not imported here already (then asking it here costs no import).

Otherwise msprobe is asked in this process, as :func:`~precision_harness.check.localize.msprobe_tools.analyze_failure`
always was, and so wherever the worker gives no answer (it had gone before the stage was handed over, it died, its
answer does not read). The answer and msprobe's files are the same either way (``tests/test_msprobe_worker.py``).

A worker that has not answered a stage ``timeout`` seconds after it was handed over (``precision_msprobe_timeout``,
``--msprobe-timeout``; :data:`~precision_harness.options.MSPROBE_TIMEOUT_S` by default) is killed, and the stage's
answer is one error line, "did not answer within N s": msprobe is not asked again here, where the same reading could
hang the gate itself. Whenever a worker is stopped for want of an answer, its standard error and exit code are kept
as ``<out_dir>/msprobe_worker.log`` (:data:`LOG`), in the stage's artifacts.

No worker outlives its process: it is killed at exit (``atexit``), and one whose process ends without exit handlers
reads the end of its standard input and exits.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from precision_harness.check.compare import rank_pool
from precision_harness.check.localize.msprobe_tools import MsprobeAnswer, analyze_failure, preload

#: the smallest stage (bytes of the run's dump.json files, as
#: :func:`~precision_harness.check.compare.rank_pool.map_ranks` is given them) whose failing rank starts a worker:
#: about 0.3 s of rank compare left here to hide its import behind
MIN_WARM_BYTES = 8 << 20
#: a module of msprobe's compare: imported here, asking msprobe here costs no import
_MSPROBE_COMPARE = "msprobe.core.compare.acc_compare"
#: a stopped worker's standard error and exit code, in the artifacts of the stage it gave no answer for
LOG = "msprobe_worker.log"


class NoAnswer(Exception):
    """The worker gave no answer to the job handed over: it ended, or wrote something that does not read."""


class Timeout(NoAnswer):
    """The worker did not answer within its time."""


@dataclass(frozen=True)
class Job:
    """What :func:`~precision_harness.check.localize.msprobe_tools.analyze_failure` is asked, by its argument names."""

    target_stage: Path
    golden_stage: Path
    out_dir: Path
    graph: bool
    graph_of: Path | None = None
    tables: dict[str, Path] = field(default_factory=dict)

    def run(self) -> MsprobeAnswer:
        """msprobe's answer, asked in this process."""
        return analyze_failure(
            self.target_stage,
            self.golden_stage,
            self.out_dir,
            graph=self.graph,
            graph_of=self.graph_of,
            tables=self.tables,
        )

    def line(self) -> bytes:
        """The job as the worker reads it: one line of JSON, paths as strings."""
        return json.dumps(asdict(self), default=str).encode() + b"\n"

    @classmethod
    def read(cls, line: bytes) -> Job:
        fields = json.loads(line)
        paths = {k: Path(v) if v is not None else None for k, v in fields.items() if k not in ("graph", "tables")}
        tables = {rank: Path(path) for rank, path in fields["tables"].items()}
        return cls(**paths, graph=bool(fields["graph"]), tables=tables)


@dataclass
class _Worker:
    """A worker process and its standard error (a temporary file: a pipe left unread could fill and stall it)."""

    proc: subprocess.Popen
    err: IO[bytes]
    owed: bool = False  #: a job was handed over whose answer was not read (its stage's check stopped early)
    _read: bytes = b""  #: what was read of the worker's standard output past the last answer's line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, job: Job) -> bool:
        """Hand ``job`` over; False where the worker cannot take it (it has gone)."""
        try:
            self.proc.stdin.write(job.line())
            self.proc.stdin.flush()
        except OSError:
            return False
        self.owed = True
        return True

    def answer(self, deadline: float | None = None) -> MsprobeAnswer:
        """The answer to the job handed over last, read by ``deadline`` (``time.monotonic()``; None: no limit).

        Raises:
            Timeout: no whole line came by ``deadline``.
            NoAnswer: the worker ended first, or its line is not an answer.
        """
        self.owed = False
        try:
            return _answer_of(json.loads(self._line(deadline)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise NoAnswer(f"its answer does not read: {exc}") from None

    def _line(self, deadline: float | None) -> bytes:
        """The worker's next line of standard output, read from its descriptor (``select`` waits on that: data kept in
        the file object's buffer would not wake it).

        Raises:
            Timeout: ``deadline`` passed first. NoAnswer: the output ended first.
        """
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._read:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and (left <= 0 or not select.select([fd], [], [], left)[0]):
                raise Timeout("no answer in time")
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError as exc:
                raise NoAnswer(str(exc)) from None
            if not chunk:
                raise NoAnswer("it ended")
            self._read += chunk
        line, _, self._read = self._read.partition(b"\n")
        return line

    def stop(self) -> bytes:
        """Kill the worker (where it runs) and reap it; its standard error and exit code, as its log reads them."""
        if self.alive():
            self.proc.kill()
        self.proc.communicate()
        self.err.seek(0)
        log = self.err.read() + f"\nexit {self.proc.returncode}\n".encode()
        self.err.close()
        return log


_worker: _Worker | None = None


def warm(size: int, left: int) -> None:
    """Start a worker importing msprobe where it pays (module docstring): a rank of a stage of ``size`` bytes failed
    and ``left`` ranks are still to be compared here. One worker a process; one already started is kept, and one that
    has gone stays until the next stage is handed over, whose artifacts keep its log (:func:`analyze`)."""
    global _worker
    if _worker is not None:
        return
    if left < 1 or size < MIN_WARM_BYTES or _MSPROBE_COMPARE in sys.modules:
        return
    if rank_pool.cores() < 2 or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _worker = _start()


class Pending:
    """msprobe's answer on one stage, on its way: from the worker, else asked here when :meth:`result` is called."""

    def __init__(self, job: Job, worker: _Worker | None, scope: str, timeout: float | None = None) -> None:
        self.job, self._worker, self._scope, self._timeout = job, worker, scope, timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def result(self) -> MsprobeAnswer:
        """The answer (its ``scope`` set): the worker's, else asked here (module docstring); a worker past its time
        gives an answer of one error line."""
        answer = self._from_worker() if self._worker is not None else None
        if answer is None:
            answer = self.job.run()
        answer.scope = self._scope
        return answer

    def _from_worker(self) -> MsprobeAnswer | None:
        worker, self._worker = self._worker, None
        try:
            return worker.answer(self._deadline)
        except Timeout:
            _keep_log(self.job, _retire(worker))
            why = f"did not answer within {self._timeout:g} s (precision_msprobe_timeout): its worker was killed, "
            return MsprobeAnswer(errors=[why + f"its log kept as {LOG} in this stage's artifacts"])
        except NoAnswer:
            _keep_log(self.job, _retire(worker))
            return None


def _keep_log(job: Job, log: bytes) -> None:
    """A stopped worker's log, in the artifacts of the stage it gave no answer for (:data:`LOG`)."""
    job.out_dir.mkdir(parents=True, exist_ok=True)
    (job.out_dir / LOG).write_bytes(log)


def analyze(job: Job, *, scope: str = "", timeout: float | None = None) -> Pending:
    """Hand ``job`` to the worker where one runs (it starts reading at once), else keep it to be asked here;
    ``scope`` is what msprobe read, as the verdict says it (:attr:`MsprobeAnswer.scope`); ``timeout``: seconds the
    worker has to answer from now (None: no limit). A worker that had gone leaves its log in ``job``'s artifacts."""
    worker = _worker
    if worker is not None and worker.owed:  # an answer owed would be read as this job's
        _retire(worker)
        worker = None
    elif worker is not None and not (worker.alive() and worker.ask(job)):
        _keep_log(job, _retire(worker))
        worker = None
    return Pending(job, worker, scope, timeout)


def _start() -> _Worker:
    """A worker: this interpreter on this module, with this process's environment and folder (so it imports the
    same precision_harness)."""
    err = tempfile.TemporaryFile()  # noqa: SIM115 (the worker holds it: _Worker.stop closes it)
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    atexit.unregister(_stop_worker)  # registered once, however many workers a process starts in turn
    atexit.register(_stop_worker)
    return _Worker(proc, err)


def _retire(worker: _Worker) -> bytes:
    """Stop ``worker`` and forget it; its log (:meth:`_Worker.stop`)."""
    global _worker
    if _worker is worker:
        _worker = None
    return worker.stop()


def _stop_worker() -> None:
    if _worker is not None:
        _retire(_worker)


def _answer_of(fields: dict) -> MsprobeAnswer:
    return MsprobeAnswer(
        first_diff={str(k): str(v) for k, v in fields["first_diff"].items()},
        graphs=[Path(p) for p in fields["graphs"]],
        tables=[Path(p) for p in fields["tables"]],
        errors=[str(e) for e in fields["errors"]],
        seconds=float(fields["seconds"]),
    )


def _serve() -> int:
    """The worker: import msprobe, then for each job read from standard input (a line), its answer as a line of JSON
    on standard output (anything else written there goes to standard error); at the end of the input, exit."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    preload()
    while line := sys.stdin.buffer.readline():
        answer = Job.read(line).run()
        answers.write(json.dumps({k: v for k, v in asdict(answer).items() if k != "scope"}, default=str) + "\n")
        answers.flush()
    sys.stderr.flush()
    # its process is ending (or killed it): an interpreter's teardown with pandas and msprobe loaded takes 0.1 s, to
    # free memory the system takes back anyway (every answer is flushed above)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_serve())
