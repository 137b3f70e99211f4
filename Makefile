# pytest-precision: set up .venv and run the gate, the tests, the linters or the benchmarks.
# The CPU install path pins torch (CPU wheel), transformers and every other package through
# constraints/cpu.txt; NPU/GPU users install their own torch (+ torch_npu) and run pip without it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints/cpu.txt

.PHONY: gate test lint format update-golden benchmarks stack-matrix lock clean

$(VENV)/.gate: pyproject.toml constraints/cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $@

# the upgrade the tests gate: transformers 5.23.0 beside the pinned environment (tests/test_real_upgrade.py)
UPGRADE := $(VENV)/transformers-5.23

# the stack matrix's cheap rows (benchmarks/stack_matrix.py, tests/test_stack_matrix.py): one release of
# mindstudio-probe or transformers per constraints/stacks/ file, each in .venv/stacks/<file stem>
STACKS := $(wildcard constraints/stacks/*.txt)
# pyproject.toml's mindstudio-probe floor, as a wheel: what tests/test_install.py's device-like dry run may take
MSPROBE_FLOOR := $(shell sed -n 's/.*"mindstudio-probe>=\([^"]*\)".*/\1/p' pyproject.toml)

$(VENV)/.test: $(VENV)/.gate constraints/transformers-5.23.txt $(STACKS)
	$(PIP) -e ".[test,verl]"
	rm -rf $(UPGRADE) $(VENV)/stacks
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --target $(UPGRADE) \
		-r constraints/transformers-5.23.txt
	$(BIN)/python benchmarks/stack_matrix.py --install
	rm -rf $(VENV)/wheels
	$(BIN)/python -m pip download --quiet --disable-pip-version-check --no-deps --dest $(VENV)/wheels \
		"mindstudio-probe==$(MSPROBE_FLOOR)"
	touch $@

# The project's own modules byte-compiled once: with PYTHONDONTWRITEBYTECODE set (as in many CI images) no
# process would keep what it compiled, and every worker, inner pytest session and verl process compiled them anew
# (about 0.6 s of CPU per pytest session on 2 cores). A .pyc whose source changed is recompiled, never used stale.
COMPILE := $(BIN)/python -m compileall -q -j 0 precision_harness plugins tests benchmarks > /dev/null

gate: $(VENV)/.gate          ## the main job: every scenario against golden/, plus the invariants
	$(COMPILE)
	$(BIN)/pytest scenarios precision_tests

# PRECISION_REQUIRE_VERL: the [verl] extra is installed here, so a verl that does not import fails the
# parity tests (tests/test_verl_parity.py) instead of skipping them. Three xdist workers on CI's 2 cores: a
# verl run alone kept 66 % of two cores busy (its processes' start-up waits on each other and on Ray), so two
# workers left a core idle while both ran verl. The tests that run examples/verl_cpu where it stands share one
# worker (xdist_group "verl_cpu_example").
# The gate itself (scenarios/, precision_tests/) is `make gate`; these are the harness's own tests.
# --durations: CI's log ends with the slowest tests, what to cut when `make test` nears CI's time.
# PYTHONDONTWRITEBYTECODE emptied: pytest rewrites the asserts of its plugins' packages (hydra, anyio, xdist) on
# import and keeps the result only where bytecode may be written; under a CI image's PYTHONDONTWRITEBYTECODE=1 each
# of the suite's ~300 pytest sessions rewrote them again, 2.3 instead of 1.4 CPU-s for an empty session here.
# PYTEST_ADDOPTS, which every inner session inherits: hydra's and anyio's pytest plugins, which no test uses, are not
# loaded (hydra's imports hydra.utils and hydra.compose at start-up): 1.5 -> 1.06 CPU-s for an empty session here.
TEST_WORKERS ?= 3
TEST_PLUGINS_OFF := -p no:hydra_pytest -p no:anyio

test: $(VENV)/.test          ## the harness's tests, the verl parity and the verl examples end to end
	$(COMPILE)
	PYTHONDONTWRITEBYTECODE= PYTEST_ADDOPTS="$(TEST_PLUGINS_OFF) $$PYTEST_ADDOPTS" PRECISION_REQUIRE_VERL=1 $(BIN)/pytest -p no:cacheprovider -n $(TEST_WORKERS) --durations=40 tests

lint: $(VENV)/.test          ## ruff lint and format check, import contracts (configured in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: $(VENV)/.test        ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

update-golden: $(VENV)/.gate ## re-record every golden (review the churn, then commit golden/)
	$(BIN)/pytest scenarios --precision-golden update

benchmarks: $(VENV)/.test    ## overhead and speed ratios (printed, never asserted)
	$(BIN)/python benchmarks/overhead.py

stack-matrix: $(VENV)/.test  ## the whole gate under each release of constraints/stacks/ (and torch's rows): docs/stacks.md
	$(BIN)/python benchmarks/stack_matrix.py --write-docs

lock: $(VENV)/.test          ## re-pin the resolved test environment in constraints/cpu.txt
	sed -i '/^# --- lock (make lock) ---$$/q' constraints/cpu.txt
	$(BIN)/python -m pip freeze --exclude-editable | grep -viE '^(torch|transformers)==' >> constraints/cpu.txt

clean:
	rm -rf .precision .pytest_cache
