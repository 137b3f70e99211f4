"""The rank pool's lanes (``check/compare/rank_pool.py``): a lone stage's ranks spread over the workers, a check's next
stages side by side, a stage whole on one worker (so the worker parses the stage's skeleton once), collected by key."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from precision_harness.check.compare import rank_pool

JOBS = [()] * 3  #: three ranks of nothing: each job answers the worker's pid (os.getpid pickles by name)


@pytest.fixture
def paying(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The workers pay for any stage (not an xdist worker here, no smallest stage)."""
    if rank_pool.cores() < 2:
        pytest.skip("one core: the workers are never used")
    monkeypatch.setattr(rank_pool, "MIN_POOL_BYTES", 0)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    yield
    rank_pool.forget()


def pids(key: str, jobs: list[tuple] = JOBS) -> list[int]:
    return list(rank_pool.map_ranks(os.getpid, jobs, size=1, key=key))


def test_two_stages_ahead_each_run_whole_on_a_worker_of_its_own(paying: None) -> None:
    rank_pool.ahead(os.getpid, [("a", JOBS, 1), ("b", JOBS, 1)])
    assert rank_pool.started("a") and rank_pool.started("b")
    a, b = pids("a"), pids("b")
    assert not rank_pool.started("a")
    assert len(set(a)) == 1 and len(set(b)) == 1 and a[0] != b[0]
    assert os.getpid() not in a + b
    assert not rank_pool._ahead  # asked for: nothing kept


def test_the_next_stage_goes_to_the_worker_whose_stage_was_asked_for(paying: None) -> None:
    rank_pool.ahead(os.getpid, [("a", JOBS, 1), ("b", JOBS, 1)])
    a = pids("a")
    rank_pool.ahead(os.getpid, [("b", JOBS, 1), ("c", JOBS, 1)])  # the window moved on: b is left as it is
    b, c = pids("b"), pids("c")
    assert set(c) == set(a) and set(b) != set(a)


def test_a_lone_stage_is_not_started_ahead_and_its_ranks_spread_over_the_workers(paying: None) -> None:
    rank_pool.ahead(os.getpid, [("lone", [()] * 4, 1)])
    assert not rank_pool._ahead
    assert len(set(pids("lone", [()] * 4))) == min(rank_pool.cores(), 4)


def test_a_stage_too_small_to_pay_is_compared_here(paying: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_pool, "MIN_POOL_BYTES", 2)
    rank_pool.ahead(os.getpid, [("small", JOBS, 1), ("large", JOBS, 2)])
    assert not rank_pool._ahead  # one stage pays: nothing to put beside it
    assert pids("small") == [os.getpid()] * 3


def test_stages_started_and_never_asked_for_are_forgotten(paying: None) -> None:
    rank_pool.ahead(os.getpid, [("a", JOBS, 1), ("b", JOBS, 1)])
    rank_pool.forget()
    assert not rank_pool._ahead
    assert pids("a") != [os.getpid()] * 3  # asked for again: submitted afresh, in the workers
