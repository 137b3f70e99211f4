"""GoldenStore: layout, manifest, atomic promote, corrupt/stale/missing errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness_testing import TINY, base_data, write_dump

from precision_harness import golden as golden_mod
from precision_harness.errors import GoldenCorruptError, GoldenMissingError, GoldenStaleError, UnsafePathError
from precision_harness.golden import GoldenStore
from precision_harness.scenario import Scenario


@pytest.fixture
def scenario() -> Scenario:
    return Scenario.load(TINY)


def fake_run(root: Path, scenario: Scenario, *, norm: float = 12.5) -> Path:
    """A finished run directory in verl's layout, as the worker writes it."""
    data = base_data()
    data["Functional.linear.0.forward"]["output"][0]["Norm"] = norm
    for step in scenario.steps:
        for stage in scenario.stages:
            write_dump(root / f"step_{step}" / stage, data)
    (root / "metrics.jsonl").write_text(
        "".join(json.dumps({"training/global_step": s, "actor/pg_loss": 0.1}) + "\n" for s in scenario.steps)
    )
    (root / "run.json").write_text(
        json.dumps(
            {
                "scenario_hash": scenario.hash,
                "level": scenario.level,
                "env": {"torch": "2.13.0"},
                "steps": list(scenario.steps),
                "stages": list(scenario.stages),
                "numeric_settings": scenario.numeric_settings,
            }
        )
    )
    return root


def test_promote_layout_drops_stack_json(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    assert store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu") is True
    g = store.load(scenario, "cpu")
    dump = g.path / "step_2/actor_update/step0/rank0/dump.json"
    assert dump.is_file() and (dump.parent / "construct.json").is_file()
    assert not list(g.path.rglob("stack.json"))
    assert not list(g.path.rglob("run.json"))
    assert g.sha256(2, "actor_update") == {
        "rank0": g.manifest["files"]["step_2/actor_update/step0/rank0/dump.json"]["sha256"]
    }
    assert g.statistics(2, "actor_update") > 0
    assert store.list() == [("tiny_ppo", "cpu")]


def test_unchanged_golden_is_not_rewritten(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    run = fake_run(tmp_path / "run", scenario)
    store.promote(run, scenario, "cpu")
    manifest = store.path("tiny_ppo", "cpu") / "manifest.json"
    before = manifest.stat().st_mtime_ns, manifest.stat().st_ino
    assert store.promote(run, scenario, "cpu") is False
    assert (manifest.stat().st_mtime_ns, manifest.stat().st_ino) == before


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_interrupted_copy_leaves_old_golden(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run1", scenario), scenario, "cpu")
    before = _snapshot(store.path("tiny_ppo", "cpu"))
    with pytest.raises(OSError, match="simulated interruption"):
        store.promote(fake_run(tmp_path / "run2", scenario, norm=13.0), scenario, "cpu", _fail_after_copy=True)
    assert _snapshot(store.path("tiny_ppo", "cpu")) == before
    assert sorted(p.name for p in (tmp_path / "golden/tiny_ppo").iterdir() if not p.name.endswith(".lock")) == ["cpu"]


def test_failed_swap_rolls_back(tmp_path: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run1", scenario), scenario, "cpu")
    before = _snapshot(store.path("tiny_ppo", "cpu"))
    real_replace = os.replace
    calls = []

    def flaky_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the second rename: new golden into place
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(golden_mod.os, "replace", flaky_replace)
    with pytest.raises(OSError, match="disk full"):
        store.promote(fake_run(tmp_path / "run2", scenario, norm=13.0), scenario, "cpu")
    monkeypatch.setattr(golden_mod.os, "replace", real_replace)
    assert _snapshot(store.path("tiny_ppo", "cpu")) == before


def test_crash_between_renames_is_recovered(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run1", scenario), scenario, "cpu")
    final = store.path("tiny_ppo", "cpu")
    before = _snapshot(final)
    os.replace(final, final.parent / ".cpu.old-12345")  # what a kill -9 after the first rename leaves
    assert store.load(scenario, "cpu").manifest["scenario"] == "tiny_ppo"
    assert _snapshot(final) == before


def test_missing_golden_names_command(tmp_path: Path, scenario: Scenario) -> None:
    with pytest.raises(
        GoldenMissingError,
        match=r"no golden for scenario tiny_ppo on cpu; "
        r"record it with: pytest .*tiny_ppo.yaml --precision-golden missing",
    ):
        GoldenStore(tmp_path / "golden").load(scenario, "cpu")


def test_corrupt_manifest(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    manifest = store.path("tiny_ppo", "cpu") / "manifest.json"
    manifest.write_text("{")
    with pytest.raises(GoldenCorruptError, match=r"manifest.json: unreadable manifest"):
        store.load(scenario, "cpu")
    manifest.write_text(json.dumps({"format": 1}))
    with pytest.raises(GoldenCorruptError, match=r"manifest.json: <top level>: 'scenario' is a required property"):
        store.load(scenario, "cpu")


def test_edited_golden_file_fails_sha256(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    g = store.load(scenario, "cpu")
    rel = "step_1/actor_update/step0/rank0/dump.json"
    (g.path / rel).write_text((g.path / rel).read_text().replace("12.5", "12.6"))
    with pytest.raises(GoldenCorruptError, match=r"sha256 differs from manifest\.json"):
        g.verify_file(rel)


def test_stale_scenario_hash_and_level(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    other = tmp_path / "s" / "tiny_ppo.yaml"
    other.parent.mkdir()
    other.write_text(
        TINY.read_text().replace("num_hidden_layers: 1", "num_hidden_layers: 2").replace("level: L1", "level: mix")
    )
    with pytest.raises(GoldenStaleError) as exc:
        store.load(Scenario.load(other), "cpu")
    msg = str(exc.value)
    assert "golden is stale" in msg and "msprobe level L1 (now mix)" in msg and "scenario hash" in msg
    assert "--precision-golden update" in msg


@pytest.mark.parametrize(
    ("field", "value"),
    [("files", "../outside.json"), ("files", "/etc/hostname"), ("files", "step_1/../../x"), ("metrics", "../m.jsonl")],
)
def test_manifest_path_outside_golden_is_corrupt_and_never_read(
    tmp_path: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    manifest_path = store.path("tiny_ppo", "cpu") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if field == "files":
        manifest["files"][value] = {"sha256": "0" * 64, "bytes": 1}
    else:
        manifest["metrics"] = value
    manifest_path.write_text(json.dumps(manifest))
    opened: list[str] = []
    monkeypatch.setattr(golden_mod, "sha256_file", lambda p: opened.append(str(p)) or "0" * 64)
    with pytest.raises(GoldenCorruptError) as err:
        store.load(scenario, "cpu")
    assert f"manifest.json: {field}: {value!r} is not a relative path inside the golden" in str(err.value)
    assert "\n" not in str(err.value) and "re-record with: pytest" in str(err.value)
    assert opened == []
    problems = golden_mod.verify_golden(store.path("tiny_ppo", "cpu"))
    assert len(problems) == 1 and "is not a relative path inside the golden" in problems[0] and opened == []


@pytest.mark.parametrize(
    ("name", "device"), [("..", "cpu"), (".", "cpu"), ("a/b", "cpu"), ("tiny_ppo", ".."), ("x", "")]
)
def test_store_refuses_names_that_leave_the_golden_root(tmp_path: Path, name: str, device: str) -> None:
    with pytest.raises(UnsafePathError, match="would leave"):
        GoldenStore(tmp_path / "golden").path(name, device)
