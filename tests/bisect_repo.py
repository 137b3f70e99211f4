"""A foreign repository for the bisect tests: a stage-API loop of its own over twelve commits.

Commit 1 holds the loop, its scenario and its recorded golden; commit 8 plants one numeric change
(the loop's learning rate in ``mylib.py``); other commits touch a notes file. ``broken`` commits make
``mylib.py`` unimportable (the next commit repairs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

COMMITS = 12
PLANTED = 8

TRAIN = textwrap.dedent(
    """
    import torch
    import precision_harness
    from mylib import LR

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    for step in (1, 2):
        with precision_harness.stage("actor_update", step=step, model=model):
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    """
)

SCENARIO = """\
description: a foreign loop bisected
command: [{python}, ../train.py]
global_profiler:
  steps: [2]
  global_tool_config:
    precision_debugger:
      stages: [actor_update]
      strict: true
      level: L1
"""

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def record(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--precision-golden", "update"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )


def make_repo(repo: Path, *, golden_from: Path | None = None, broken: tuple[int, ...] = ()) -> list[str]:
    """The twelve commits; returns their hashes, commit 1 first. The golden of commit 1 is recorded
    (or copied from ``golden_from``, a repository made here before)."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text(".precision/\n__pycache__/\n")
    (repo / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    (repo / "train.py").write_text(TRAIN)
    (repo / "mylib.py").write_text("LR = 0.1\n")
    (repo / "notes.txt").write_text("1\n")
    (repo / "scenarios").mkdir()
    (repo / "scenarios" / "loop.yaml").write_text(SCENARIO.format(python=json.dumps(sys.executable)))
    if golden_from is None:
        proc = record(repo)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        subprocess.run(["cp", "-r", str(golden_from / "golden"), str(repo / "golden")], check=True)
    shas = [commit(repo, "commit 1: the loop, its scenario and golden")]
    for n in range(2, COMMITS + 1):
        (repo / "notes.txt").write_text(f"{n}\n")
        lr = "0.11" if n >= PLANTED else "0.1"
        (repo / "mylib.py").write_text(f"LR = {lr}\n" + ("this is not python\n" if n in broken else ""))
        what = "raise the learning rate" if n == PLANTED else "cannot import mylib" if n in broken else "notes"
        shas.append(commit(repo, f"commit {n}: {what}"))
    return shas


#: a built-in GRPO scenario at ``level: auto``, as small as verl's trainer allows: one layer, two prompts
#: times n=2, two steps, the stages dumped at step 2 only (step 1's update moves the weights step 2 reads)
BUILTIN = """\
description: a built-in GRPO at level auto, bisected
seed: 3
model:
  hidden_size: 16
  intermediate_size: 32
  num_hidden_layers: 1
  num_attention_heads: 2
  num_key_value_heads: 1
data:
  train_batch_size: 2
  max_prompt_length: 8
  max_response_length: 4
trainer:
  total_training_steps: 2
  num_threads: 1
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 2
    ppo_micro_batch_size_per_gpu: 4
    optim:
      lr: {lr}
  rollout:
    n: 2
algorithm:
  adv_estimator: grpo
global_profiler:
  steps: [2]
  global_tool_config:
    precision_debugger:
      stages: [actor_compute_log_prob, actor_update]
      strict: true
      level: auto
"""
BUILTIN_COMMITS = 5
BUILTIN_PLANTED = 3


def make_builtin_repo(repo: Path, *, ini: str = "") -> list[str]:
    """Five commits of a built-in ``level: auto`` scenario; commit 3 raises its ``optim.lr``. The golden
    is recorded at commit 1 under ``golden_dir`` (from ``ini``'s ``precision_golden_dir``, else golden/)."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / ".gitignore").write_text(".precision/\n__pycache__/\n")
    (repo / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n" + ini)
    (repo / "notes.txt").write_text("1\n")
    (repo / "scenarios").mkdir()
    scenario = repo / "scenarios" / "auto.yaml"
    scenario.write_text(BUILTIN.format(lr="1.0e-3"))
    proc = record(repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shas = [commit(repo, "commit 1: the scenario and its golden")]
    for n in range(2, BUILTIN_COMMITS + 1):
        (repo / "notes.txt").write_text(f"{n}\n")
        if n == BUILTIN_PLANTED:
            scenario.write_text(BUILTIN.format(lr="2.0e-3"))
        shas.append(commit(repo, f"commit {n}: " + ("raise optim.lr" if n == BUILTIN_PLANTED else "notes")))
    return shas
