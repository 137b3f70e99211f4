"""GoldenStore: layout, manifest, atomic promote, corrupt/stale/missing errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from harness_testing import TINY, base_data, write_dump

from precision_harness.dumps.files import sha256_file
from precision_harness.errors import GoldenCorruptError, GoldenMissingError, GoldenStaleError, UnsafePathError
from precision_harness.goldens import golden as golden_mod
from precision_harness.goldens import golden_codec, verification
from precision_harness.goldens import store as store_mod
from precision_harness.goldens.store import GoldenStore
from precision_harness.scenarios import identity
from precision_harness.scenarios.scenario import Scenario


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
    dump = g.path / "step_2/actor_update/step0/rank0/dump.json.zst"
    assert dump.is_file() and (dump.parent / "construct.json.zst").is_file()
    assert (g.path / "metrics.jsonl.zst").is_file()
    assert not list(g.path.rglob("stack.json*")) and not list(g.path.rglob("run.json*"))
    stored = sorted(p.relative_to(g.path).as_posix() for p in g.path.rglob("*") if p.is_file())
    assert stored == sorted([*g.manifest["files"], "manifest.json"])  # payloads compressed, the manifest plain
    assert all(name.endswith(".zst") for name in g.manifest["files"])
    # identical-to-golden needs the content digest: the run's dump.json, not the stored frame
    run_dump = tmp_path / "run/step_2/actor_update/step0/rank0/dump.json"
    assert g.digests(2, "actor_update") == {"rank0": sha256_file(run_dump)}
    assert g.load_dump(2, "actor_update", "rank0") == json.loads(run_dump.read_text())
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


def _interrupt_before_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every golden write stops after its copy is complete, before the old golden is moved aside."""
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name.startswith(".cpu.old-"):  # the swap's first rename
            raise OSError("simulated interruption before the swap")
        return real_replace(src, dst)

    monkeypatch.setattr(store_mod.os, "replace", replace)


def test_interrupted_copy_leaves_old_golden(
    tmp_path: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run1", scenario), scenario, "cpu")
    before = _snapshot(store.path("tiny_ppo", "cpu"))
    _interrupt_before_swap(monkeypatch)
    with pytest.raises(OSError, match="simulated interruption"):
        store.promote(fake_run(tmp_path / "run2", scenario, norm=13.0), scenario, "cpu")
    monkeypatch.undo()
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

    monkeypatch.setattr(store_mod.os, "replace", flaky_replace)
    with pytest.raises(OSError, match="disk full"):
        store.promote(fake_run(tmp_path / "run2", scenario, norm=13.0), scenario, "cpu")
    monkeypatch.setattr(store_mod.os, "replace", real_replace)
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
    rel = "step_1/actor_update/step0/rank0/dump.json.zst"
    (g.path / rel).write_bytes((g.path / rel).read_bytes() + b"\0")
    with pytest.raises(GoldenCorruptError, match=r"dump\.json\.zst: sha256 differs from manifest\.json"):
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


def _stale_message(store: GoldenStore, scenario: Scenario) -> str:
    with pytest.raises(GoldenStaleError) as exc:
        store.load(scenario, "cpu")
    assert "\n" not in str(exc.value) and "re-record with: pytest" in str(exc.value)
    return str(exc.value)


def _edited(tmp_path: Path, text: str, old: str, new: str) -> Scenario:
    """``text`` with ``old`` replaced by ``new``, as ``tiny_ppo.yaml`` in a folder of its own."""
    assert old in text
    path = tmp_path / "edited" / "tiny_ppo.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace(old, new))
    return Scenario.load(path)


def test_stale_names_the_structural_setting_and_both_values(tmp_path: Path, scenario: Scenario) -> None:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    assert store.load(scenario, "cpu").manifest["identity"] == scenario.identity
    edited = _edited(tmp_path, TINY.read_text(), "hidden_size: 16", "hidden_size: 24")
    msg = _stale_message(store, edited)
    assert f"(now {edited.hash[:12]}: model.hidden_size: 16 -> 24); re-record with" in msg
    assert "model, data, batch or algorithm settings changed" not in msg


def test_stale_golden_recorded_without_identity_says_so(tmp_path: Path, scenario: Scenario) -> None:
    """A golden recorded before the manifest kept its identity still loads; stale, it falls back to the hash."""
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    manifest_path = store.path("tiny_ppo", "cpu") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["identity"]
    manifest_path.write_text(json.dumps(manifest))
    assert store.load(scenario, "cpu").scenario == "tiny_ppo"
    msg = _stale_message(store, _edited(tmp_path, TINY.read_text(), "hidden_size: 16", "hidden_size: 24"))
    assert (
        "model, data, batch or algorithm settings changed; the golden does not record its identity components, "
        "so the change cannot be named)" in msg
    )


COMMAND = """command: [python, train.py, --lr=1]
inputs: [data/prompts.jsonl]
env: {MODE: fast}
global_profiler:
  steps: [1, 2]
  global_tool_config:
    precision_debugger: {stages: [actor_update], strict: true}
"""


@pytest.fixture
def command_golden(tmp_path: Path) -> tuple[GoldenStore, Path]:
    """A recorded golden of a command scenario whose input is a data file; returns the store and the file."""
    data = tmp_path / "edited" / "data" / "prompts.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text('{"prompt": "1 + 1"}\n')
    recorded = _edited(tmp_path, COMMAND, "", "")
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", recorded), recorded, "cpu")
    return store, data


def test_stale_command_scenario_names_the_argv_element(tmp_path: Path, command_golden) -> None:
    store, _ = command_golden
    msg = _stale_message(store, _edited(tmp_path, COMMAND, "--lr=1]", "--lr=2]"))
    assert ": argv[2]: --lr=1 -> --lr=2); re-record with" in msg


def test_stale_command_scenario_names_the_input_file(tmp_path: Path, command_golden) -> None:
    store, data = command_golden
    old = hashlib.sha256(data.read_bytes()).hexdigest()
    data.write_text('{"prompt": "2 + 2"}\n')
    new = hashlib.sha256(data.read_bytes()).hexdigest()
    msg = _stale_message(store, _edited(tmp_path, COMMAND, "", ""))
    assert f": input data/prompts.jsonl changed (sha256 {old[:8]} -> {new[:8]})); re-record with" in msg


def test_stale_command_scenario_names_env_and_settings(tmp_path: Path, command_golden) -> None:
    store, _ = command_golden
    edited = COMMAND.replace("{MODE: fast}", "{MODE: slow, EXTRA: '1'}") + "settings: {model: {path: qwen}}\n"
    msg = _stale_message(store, _edited(tmp_path, edited, "", ""))
    assert ": env.EXTRA: (unset) -> 1; env.MODE: fast -> slow; settings.model.path: (unset) -> qwen)" in msg


def test_identity_changes_in_argv_order_and_capped() -> None:
    old = {f"argv[{i}]": f"a{i}" for i in range(12)} | {"inputs[d.bin]": "1" * 64}
    new = {f"argv[{i}]": f"b{i}" for i in range(11)} | {"inputs[e.bin]": "2" * 64}
    lines = identity.changes(old, new)
    assert lines[:3] == ["argv[0]: a0 -> b0", "argv[1]: a1 -> b1", "argv[2]: a2 -> b2"]
    assert lines[10:] == [
        "argv[10]: a10 -> b10",
        "argv[11]: a11 -> (unset)",
        "input d.bin no longer listed",
        "input e.bin added",
    ]
    assert identity.summary(lines).endswith("argv[4]: a4 -> b4; and 9 more")


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
        manifest["files"][value] = {"sha256": "0" * 64, "bytes": 1, "content_sha256": "0" * 64, "content_bytes": 1}
    else:
        manifest["metrics"] = value
    manifest_path.write_text(json.dumps(manifest))
    opened: list[str] = []
    monkeypatch.setattr(golden_mod.Golden, "_verified_bytes", lambda self, rel: opened.append(rel) or b"")
    with pytest.raises(GoldenCorruptError) as err:
        store.load(scenario, "cpu")
    assert f"manifest.json: {field}: {value!r} is not a relative path inside the golden" in str(err.value)
    assert "\n" not in str(err.value) and "re-record with: pytest" in str(err.value)
    assert opened == []
    problems = verification.verify_golden(store.path("tiny_ppo", "cpu")).problems
    assert len(problems) == 1 and "is not a relative path inside the golden" in problems[0] and opened == []


@pytest.mark.parametrize(
    ("name", "device"), [("..", "cpu"), (".", "cpu"), ("a/b", "cpu"), ("tiny_ppo", ".."), ("x", "")]
)
def test_store_refuses_names_that_leave_the_golden_root(tmp_path: Path, name: str, device: str) -> None:
    with pytest.raises(UnsafePathError, match="would leave"):
        GoldenStore(tmp_path / "golden").path(name, device)


def _compressed(tmp_path: Path, scenario: Scenario) -> tuple[GoldenStore, Path, dict]:
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    path = store.path("tiny_ppo", "cpu")
    return store, path, json.loads((path / "manifest.json").read_text())


def _restamp(path: Path, manifest: dict, stored: str, data: bytes) -> None:
    """Replace a stored payload and make the manifest's stored digest match it (as a careless edit would)."""
    (path / stored).write_bytes(data)
    manifest["files"][stored].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_truncated_payload_is_a_one_line_corrupt_golden(tmp_path: Path, scenario: Scenario) -> None:
    store, path, manifest = _compressed(tmp_path, scenario)
    stored = "step_1/actor_update/step0/rank0/dump.json.zst"
    _restamp(path, manifest, stored, (path / stored).read_bytes()[:40])
    with pytest.raises(GoldenCorruptError) as err:
        store.load(scenario, "cpu").load_dump(1, "actor_update", "rank0")
    assert f"{stored}: " in str(err.value) and "\n" not in str(err.value)
    assert "truncated" in str(err.value) or "corrupt" in str(err.value)
    _restamp(path, manifest, stored, b"not a zstandard frame at all")
    with pytest.raises(GoldenCorruptError, match=r"dump\.json\.zst: corrupt or truncated zstandard payload"):
        store.load(scenario, "cpu").load_dump(1, "actor_update", "rank0")


def test_decompression_bomb_is_refused(tmp_path: Path, scenario: Scenario) -> None:
    """A payload that decompresses past the size its manifest records is refused, never fully inflated."""
    store, path, manifest = _compressed(tmp_path, scenario)
    stored = "metrics.jsonl.zst"
    bomb = golden_codec.compress(b"0" * 50_000_000)  # 50 MB of zeros in a few kB
    _restamp(path, manifest, stored, bomb)
    with pytest.raises(GoldenCorruptError, match=r"metrics\.jsonl\.zst: decompresses to more than the \d+ bytes"):
        store.load(scenario, "cpu").metrics()
    manifest["files"][stored]["content_bytes"] = golden_codec.MAX_CONTENT_BYTES + 1
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GoldenCorruptError, match="refused"):
        store.load(scenario, "cpu").metrics()


def test_lfs_pointer_says_git_lfs_pull(tmp_path: Path, scenario: Scenario) -> None:
    store, path, _ = _compressed(tmp_path, scenario)
    stored = path / "metrics.jsonl.zst"
    stored.write_bytes(golden_codec.LFS_POINTER + b"\noid sha256:" + b"0" * 64 + b"\nsize 123\n")
    with pytest.raises(GoldenCorruptError, match=r"metrics\.jsonl\.zst: .*Git LFS pointer: run git lfs pull"):
        store.load(scenario, "cpu").metrics()


def _plain_golden(store: GoldenStore, scenario: Scenario) -> dict[str, bytes]:
    """Turn the store's compressed golden into a plain (format 1) one, as goldens were before compression."""
    golden = store.load(scenario, "cpu")
    contents = {name: golden.read(name) for name in golden.contents}
    path = golden.path
    for stored in golden.manifest["files"]:
        (path / stored).unlink()
    files = {}
    for name, content in contents.items():
        (path / name).write_bytes(content)
        files[name] = {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    manifest = {k: v for k, v in golden.manifest.items() if k != "codec"}
    (path / "manifest.json").write_text(json.dumps({**manifest, "format": 1, "files": files}))
    return contents


def test_plain_golden_stays_readable_and_migrates_losslessly(tmp_path: Path, scenario: Scenario) -> None:
    store, path, _ = _compressed(tmp_path, scenario)
    contents = _plain_golden(store, scenario)
    plain = store.load(scenario, "cpu")
    assert not plain.compressed and plain.read("metrics.jsonl") == contents["metrics.jsonl"]
    assert plain.digests(1, "actor_update") == {
        "rank0": hashlib.sha256(contents["step_1/actor_update/step0/rank0/dump.json"]).hexdigest()
    }
    assert store.migrate("tiny_ppo", "cpu") is True
    migrated = store.load(scenario, "cpu")
    assert migrated.compressed and migrated.manifest["format"] == 2
    assert migrated.digests(1, "actor_update") == plain.digests(1, "actor_update")
    migrated.export(tmp_path / "export")
    exported = {
        p.relative_to(tmp_path / "export").as_posix(): p.read_bytes()
        for p in (tmp_path / "export").rglob("*")
        if p.is_file()
    }
    indexes = {n for n in contents if n.endswith("/dump.index")}
    assert indexes and exported == {n: c for n, c in contents.items() if n not in indexes}  # byte for byte
    assert all(migrated.read(n) == contents[n] for n in indexes)  # kept, though msprobe's export leaves them out
    assert verification.verify_golden(path).problems == []
    assert store.migrate("tiny_ppo", "cpu") is False  # already compressed: nothing written


def test_interrupted_migrate_leaves_the_plain_golden(
    tmp_path: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path, _ = _compressed(tmp_path, scenario)
    _plain_golden(store, scenario)
    before = _snapshot(path)
    _interrupt_before_swap(monkeypatch)
    with pytest.raises(OSError, match="simulated interruption"):
        store.migrate("tiny_ppo", "cpu")
    monkeypatch.undo()
    assert _snapshot(path) == before
    assert not store.load(scenario, "cpu").compressed


def test_rerecord_of_a_plain_golden_with_the_same_content_writes_nothing(tmp_path: Path, scenario: Scenario) -> None:
    """A plain golden is not rewritten compressed by an unchanged update (migrate does that, on purpose)."""
    store, path, _ = _compressed(tmp_path, scenario)
    _plain_golden(store, scenario)
    before = _snapshot(path)
    assert store.promote(tmp_path / "run", scenario, "cpu") is False
    assert _snapshot(path) == before


def test_rerecord_of_a_golden_without_identity_adds_it_to_the_manifest_only(tmp_path: Path, scenario: Scenario) -> None:
    """A golden recorded before manifests kept ``identity`` gains it on an unchanged re-record; nothing else moves."""
    store, path, _ = _compressed(tmp_path, scenario)
    _plain_golden(store, scenario)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["identity"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    payloads = {k: v for k, v in _snapshot(path).items() if k != "manifest.json"}
    assert store.promote(tmp_path / "run", scenario, "cpu") is False
    assert {k: v for k, v in _snapshot(path).items() if k != "manifest.json"} == payloads
    assert json.loads((path / "manifest.json").read_text()) == {**manifest, "identity": scenario.identity}


def test_lfs_pattern_routes_every_committed_payload_and_no_manifest(tmp_path: Path) -> None:
    """The documented .gitattributes line, as git itself matches it, against the committed suite."""
    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "ls-files", "golden"], cwd=root, capture_output=True, text=True, check=True)
    files = sorted(listed.stdout.split())
    payloads = [f for f in files if not f.endswith("/manifest.json")]
    manifests = [f for f in files if f.endswith("/manifest.json")]
    assert payloads and manifests and all(f.endswith(".zst") for f in payloads)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitattributes").write_text(golden_codec.LFS_ATTRIBUTES + "\n")
    out = subprocess.run(
        ["git", "check-attr", "filter", "--", *files], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    routed = {line.split(": ")[0] for line in out.splitlines() if line.endswith(": filter: lfs")}
    assert routed == set(payloads)
    assert golden_codec.LFS_ATTRIBUTES in (root / "docs" / "goldens.md").read_text()


def test_update_of_one_scenario_touches_only_its_folder(tmp_path: Path, scenario: Scenario) -> None:
    """What `git diff golden/` shows after re-recording one scenario: that scenario's folder alone."""
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    other_path = tmp_path / "s" / "other.yaml"
    other_path.parent.mkdir()
    other_path.write_text(TINY.read_text() + "name: other\n")
    other = Scenario.load(other_path)
    store.promote(fake_run(tmp_path / "run_other", other), other, "cpu")
    before = _snapshot(tmp_path / "golden")
    assert store.promote(fake_run(tmp_path / "run2", scenario, norm=13.0), scenario, "cpu") is True
    after = _snapshot(tmp_path / "golden")
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed and all(k.startswith("tiny_ppo/cpu/") for k in changed)
    assert (
        "tiny_ppo/cpu/manifest.json" in changed
        and "tiny_ppo/cpu/step_1/actor_update/step0/rank0/dump.json.zst" in changed
    )
