"""The drift profile kept as columns (precision_harness/check/compare/drift_profile.py): the same points, in the same
order, as the list of tuples it replaces, whatever was appended, packed, added or pickled."""

from __future__ import annotations

import math
import pickle
import random
import weakref

import numpy as np
import pytest

from precision_harness.check.compare.drift_profile import DriftProfile


def _points(rank: str, n: int, seed: int, *, names: list[str] | None = None) -> list[tuple[str, int, str, float]]:
    rng = random.Random(seed)
    names = names or [f"Functional.linear.{i}.forward.output.0" for i in range(n)]
    ratios = [0.0, rng.random() * 3, math.inf] + ([math.nan] if seed % 5 == 0 else [])
    return [(rank, i, names[i], rng.choice(ratios)) for i in range(n)]


def _profile_and_list(seed: int) -> tuple[DriftProfile, list]:
    """A stage's profile as compare builds it (ranks packed and added, some points appended after) and the list."""
    rng = random.Random(seed)
    stage, expected = DriftProfile(), []
    for r in range(rng.randint(0, 4)):
        rank = DriftProfile()
        points = _points(f"rank{r}", rng.randint(0, 40), seed + r)
        cut = rng.randint(0, len(points))  # a judged table's rows, then rows judged one by one, as compare adds them
        names, ratios = [p[2] for p in points], np.array([p[3] for p in points])
        rank.extend_columns(f"rank{r}", (0, cut), names, ratios)
        for p in points[cut:]:
            rank.append(p)
        if rng.random() < 0.5:
            rank = pickle.loads(pickle.dumps(rank.pack()))  # as it comes back from the rank pool
        stage += rank
        expected += points
    tail = _points("rank9", rng.randint(0, 5), seed)
    for p in tail:
        stage.append(p)
    return stage, expected + tail


@pytest.mark.parametrize("seed", range(40))
def test_the_profile_reads_as_the_list_of_its_points(seed: int) -> None:
    """Point for point (``repr``: a NaN ratio read back is another float object), NaN ratios included (max()
    keeps a NaN it meets first)."""
    profile, expected = _profile_and_list(seed)
    assert repr(list(profile)) == repr(expected) and len(profile) == len(expected)
    assert bool(profile) is bool(expected)
    assert repr(profile.worst()) == repr(max(expected, key=lambda p: p[3], default=None))
    if not any(math.isnan(p[3]) for p in expected):
        assert profile == expected
        assert profile.max_ratio() == max((p[3] for p in expected), default=0.0)
    for index in range(-len(expected), len(expected)):
        assert repr(profile[index]) == repr(expected[index])
    for start in (None, 0, 3, 17, 200):
        for stop in (None, 5, 30, -2):
            for step in (None, 1, 2, 7, 64, -1, -3):
                assert repr(profile[start:stop:step]) == repr(expected[start:stop:step]), (start, stop, step)
    assert repr(list(pickle.loads(pickle.dumps(profile)))) == repr(expected)
    for up_to in (-1, 0, 3, 20, 10**9):  # where the change entered reads the earliest row that moved
        moved = [(o, r, n, x) for r, o, n, x in expected if x > 0 and o <= up_to]
        assert profile.earliest_moved(up_to) == min(moved, default=None), up_to


def test_an_index_past_the_end_is_an_index_error() -> None:
    profile = DriftProfile(_points("rank0", 3, 0)).pack()
    with pytest.raises(IndexError):
        profile[3]
    with pytest.raises(IndexError):
        DriftProfile()[0]


def test_ranks_of_the_same_rows_share_one_name_list_and_runs_of_a_rank_pack_apart() -> None:
    """Each rank's names come back from the pool as new strings: a stage keeps one list of them."""
    names = [f"Torch.matmul.{i}.forward.output.0" for i in range(50)]
    stage = DriftProfile()
    for r in range(3):
        rank = DriftProfile(_points(f"rank{r}", 50, r, names=[n + "" for n in list(names)]))
        stage += pickle.loads(pickle.dumps(rank))
    lists = {id(chunk.names) for chunk in stage._chunks}
    assert len(stage._chunks) == 3 and len(lists) == 1
    mixed = DriftProfile(_points("rank0", 2, 0) + _points("rank1", 2, 0) + _points("rank0", 1, 0)).pack()
    assert [c.rank for c in mixed._chunks] == ["rank0", "rank1", "rank0"]


def test_a_profile_is_not_equal_to_other_points_or_to_other_types() -> None:
    points = _points("rank0", 4, 1)
    profile = DriftProfile(points).pack()
    assert profile != points[:3] and profile != [*points[:3], ("rank0", 3, "x", 0.0)]
    assert profile != "not a profile" and DriftProfile() == []


def test_columns_added_at_once_read_as_the_points_they_replace() -> None:
    """A judged table's spans, between rows added one by one, as compare's columnar judging adds them."""
    names = [f"Torch.add.{i}.forward.output.0" for i in range(10)]
    worst = np.array([0.0, 0.5, math.inf, 1.5, 0.0, 2.0, 0.1, 0.2, 0.3, 0.4])
    profile = DriftProfile()
    profile.extend_columns("rank1", (0, 3), names, worst)
    profile.append(("rank1", 3, names[3], 9.0))
    profile.extend_columns("rank1", (4, 4), names, worst)  # an empty span adds nothing
    profile.extend_columns("rank1", (4, 10), names, worst)
    expected = [("rank1", i, names[i], 9.0 if i == 3 else float(worst[i])) for i in range(10)]
    assert profile == expected and profile.worst() == expected[2] and len(profile.pack()._chunks) == 1
    whole = DriftProfile()
    whole.extend_columns("rank0", (0, 10), names, worst)
    assert whole.pack()._chunks[0].names is names  # a whole table's name list, kept as it is
    assert whole == [("rank0", i, names[i], float(worst[i])) for i in range(10)]


def _rank_result(rank: str, names: list[str]) -> DriftProfile:
    """A rank's profile as it leaves the rank pool: its table's columns, pickled."""
    profile = DriftProfile()
    profile.extend_columns(rank, (0, len(names)), names, np.linspace(0.0, 1.0, len(names)))
    return pickle.loads(pickle.dumps(profile.pack()))


def test_ranks_unpickled_with_equal_names_share_one_list_while_it_is_alive() -> None:
    """The results of a stage compared ahead wait whole: one copy of the names the ranks share, not one a rank."""
    names = [f"Functional.linear.{i}.forward.output.0" for i in range(50)]
    rank0, rank1 = _rank_result("rank0", list(names)), _rank_result("rank1", list(names))
    other = _rank_result("rank0", [*names[:-1], "Functional.gelu.0.forward.output.0"])
    assert rank0._chunks[0].names is rank1._chunks[0].names
    assert other._chunks[0].names is not rank0._chunks[0].names
    ratios = np.linspace(0.0, 1.0, 50).tolist()
    assert list(rank1) == [("rank1", i, name, ratios[i]) for i, name in enumerate(names)]
    shared = weakref.ref(rank0._chunks[0].names)
    del rank0, rank1, other
    assert shared() is None  # the process keeps no name list of its own: only the profiles held it
    again = _rank_result("rank2", list(names))
    assert again._chunks[0].names == names and next(iter(again)) == ("rank2", 0, names[0], 0.0)
