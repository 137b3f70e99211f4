"""msprobe's analyses of a failing stage in a process of their own, started while the stage's other ranks are compared.

Importing msprobe's compare takes about 0.7 s (pandas, and the tensorboard stub msprobe's ``__init__`` loads): as
long as comparing a 30,000-call rank. In this process it could only come after the ranks, since a thread importing
it holds the GIL the rank compare needs. So where a large stage's rank fails and other ranks are still to be
compared (:func:`warm`), a worker process is started that imports msprobe on the other core; :func:`analyze` then
hands it the stage's window and the gate goes on (where the change entered) while msprobe reads.

The worker pays where its import hides behind work left here:

- the stage's run dumps are at least :data:`MIN_WARM_BYTES` (sized as
  :func:`~precision_harness.check.rank_pool.dump_bytes`, indexed goldens counted at their share);
- a rank failed and at least one rank is still to come;
- this machine gives the process two cores or more, and it is not a pytest-xdist worker (xdist fills the cores);
- msprobe's compare is not imported here already (then asking it here costs no import).

Otherwise, and wherever the worker fails to answer (it died, its answer does not read), msprobe is asked in this
process, as :func:`~precision_harness.check.msprobe_tools.analyze_failure` always was: the answer is the same
either way (``tests/test_msprobe_worker.py``).

A worker serves one stage, then exits. One that is started and never handed a stage exits when its standard input
closes (this process's end), and is killed at exit (``atexit``): no worker outlives its check.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import precision_harness
from precision_harness.check import rank_pool
from precision_harness.check.msprobe_tools import MsprobeAnswer, analyze_failure, preload

#: the smallest stage (bytes of the run's dump.json files, as :func:`~precision_harness.check.rank_pool.map_ranks`
#: is given them) whose failing rank starts a worker: about 0.3 s of rank compare left here to hide its import behind
MIN_WARM_BYTES = 8 << 20
#: a module of msprobe's compare: imported here, asking msprobe here costs no import
_MSPROBE_COMPARE = "msprobe.core.compare.acc_compare"

_warm: subprocess.Popen | None = None
_started: list[subprocess.Popen] = []


@dataclass(frozen=True)
class Job:
    """What :func:`~precision_harness.check.msprobe_tools.analyze_failure` is asked, by its argument names."""

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
        fields = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        fields["tables"] = {rank: str(path) for rank, path in self.tables.items()}
        return json.dumps(fields).encode() + b"\n"

    @classmethod
    def read(cls, line: bytes) -> Job:
        fields = json.loads(line)
        paths = {k: Path(v) if v is not None else None for k, v in fields.items() if k not in ("graph", "tables")}
        tables = {rank: Path(path) for rank, path in fields["tables"].items()}
        return cls(**paths, graph=bool(fields["graph"]), tables=tables)


def warm(size: int, left: int) -> None:
    """Start a worker importing msprobe where it pays (module docstring): a rank of a stage of ``size`` bytes failed
    and ``left`` ranks are still to be compared here. One worker at a time; one already warm is kept."""
    global _warm
    if _warm is not None and _warm.poll() is None:
        return
    if left < 1 or size < MIN_WARM_BYTES or _MSPROBE_COMPARE in sys.modules:
        return
    if rank_pool.cores() < 2 or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    _warm = _start()


class Pending:
    """msprobe's answer on one stage, on its way: from the worker, else asked here when :meth:`result` is called."""

    def __init__(self, job: Job, worker: subprocess.Popen | None, scope: str) -> None:
        self.job, self._worker, self._scope = job, worker, scope

    def result(self) -> MsprobeAnswer:
        """The answer (its ``scope`` set); waits for the worker, or asks msprobe here where there is none or it
        gave no answer (its standard error then goes to ``<out_dir>/msprobe_worker.log``)."""
        answer = self._from_worker() if self._worker is not None else None
        if answer is None:
            answer = self.job.run()
        answer.scope = self._scope
        return answer

    def _from_worker(self) -> MsprobeAnswer | None:
        worker, self._worker = self._worker, None
        out, err = worker.communicate()
        _started.remove(worker)
        try:
            if worker.returncode == 0:
                return _answer_of(json.loads(out))
        except (ValueError, KeyError, TypeError):
            pass
        self.job.out_dir.mkdir(parents=True, exist_ok=True)
        (self.job.out_dir / "msprobe_worker.log").write_bytes(err + f"\nexit {worker.returncode}\n".encode())
        return None


def analyze(job: Job, *, scope: str = "") -> Pending:
    """Hand ``job`` to the warm worker (it starts reading at once), or keep it to be asked here; ``scope`` is what
    msprobe read, as the verdict says it (:attr:`MsprobeAnswer.scope`)."""
    global _warm
    worker, _warm = _warm, None
    if worker is not None:
        try:
            worker.stdin.write(job.line())
            worker.stdin.flush()
        except (BrokenPipeError, OSError):
            _stop(worker)
            worker = None
    return Pending(job, worker, scope)


def _start() -> subprocess.Popen:
    source = str(Path(precision_harness.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)}
    worker = subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    if not _started:
        atexit.register(_stop_all)
    _started.append(worker)
    return worker


def _stop(worker: subprocess.Popen) -> None:
    if worker.poll() is None:
        worker.kill()
    worker.communicate()
    if worker in _started:
        _started.remove(worker)


def _stop_all() -> None:
    global _warm
    _warm = None
    for worker in list(_started):
        _stop(worker)


def _answer_of(fields: dict) -> MsprobeAnswer:
    return MsprobeAnswer(
        first_diff={str(k): str(v) for k, v in fields["first_diff"].items()},
        graphs=[Path(p) for p in fields["graphs"]],
        tables=[Path(p) for p in fields["tables"]],
        errors=[str(e) for e in fields["errors"]],
        seconds=float(fields["seconds"]),
    )


def _serve() -> int:
    """The worker: import msprobe, read one job from standard input, write its answer as JSON to standard output
    (anything else written there goes to standard error). No job (standard input closed): exit."""
    answer_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    preload()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0
    answer = Job.read(line).run()
    answer_out.write(json.dumps({k: v for k, v in asdict(answer).items() if k != "scope"}, default=str))
    answer_out.close()
    sys.stderr.flush()
    # the gate waits on this exit: an interpreter's teardown with pandas and msprobe loaded takes 0.1 s, to free
    # memory the system takes back anyway (everything it wrote is closed above)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_serve())
