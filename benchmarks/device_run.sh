#!/usr/bin/env bash
# The GPU device run of issue 39, in one call on the device machine (docs/levels.md, "The GPU device run"):
# installs the carried wheels (benchmarks/device_wheels.py) with pip --no-index, then runs
#   2 goldens      the single-rank built-in scenarios recorded on DEVICE into golden/<scenario>/DEVICE/
#                  (fp32 with TF32 off, as runs/numerics/devices.py sets CUDA up, and the bf16 ones), with the
#                  accelerator stack each manifest records;
#   3 determinism  two fresh processes per scenario with the determinism environment, and two without it
#                  (tests/hooks' `nondeterministic`): which dump rows move, and by how much;
#   4 cross        the CPU checked against DEVICE's goldens (--precision-golden-device): per stage the worst
#                  ratio under tolerance.cross_device, and the judgement lines;
#   5 gate         on DEVICE: a planted regression (`tf32`; `linear_bf16` on cpu) caught at its stage, a
#                  change that must not matter (`cublas_workspace`; `sum_order` on cpu) passing, and
#                  `precision-harness calibrate` with the tolerance block it proposes;
#   6 cost         the largest built-in model without msprobe and at L0, L1, auto: wall per step, dump size.
# Each item runs under `timeout` (its own process group, so nothing of it outlives it), writes its log and
# figures into WORK/item<N>-<name>/, and is packed into OUT_DIR/item<N>-<name>.tar.gz as soon as it ends; a
# failed item does not stop the next. OUT_DIR/summary.md holds every item's status, wall time and figures.
# The device tool returns at most 8 files, so OUT_DIR holds only those (7 at most).
#
# Usage: benchmarks/device_run.sh OUT_DIR
# Environment (defaults are the GPU run's; tests/test_device_run.py runs it with DEVICE=cpu):
#   DEVICE (cuda)  ITEMS ("2 3 4 5 6")  PYTHON (python3)  WHEELS (<repo>/.device-wheels)  WORK (a new
#   temporary folder)  JOBS (nproc)  TRANSFORMERS (5.10.4: the version the import check demands)
#   WORKER (warm: pytest's --precision-worker; fresh if forked workers misbehave on the GPU)
#   GOLDEN_SCENARIOS  DET_SCENARIOS  CROSS_SCENARIOS  GATE_SCENARIO  PLANT  BENIGN  EXPECT_FIRST
#   COST_SCENARIO  CALIBRATE_RUNS (4)  T_INSTALL T2 T3 T4 T5 T6: each step's limit in seconds.
# Exit status: 0 when every item succeeded, 1 when one failed or timed out, 2 on bad usage or a failed install.
set -uo pipefail

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
cd "$REPO" || exit 2

DEVICE=${DEVICE:-cuda}
ITEMS=${ITEMS:-2 3 4 5 6}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-$REPO/.device-wheels}
JOBS=${JOBS:-$(nproc)}
TRANSFORMERS=${TRANSFORMERS:-5.10.4}
WORKER=${WORKER:-warm}
# the single-rank built-in scenarios (ppo_dp2_tiny needs Ray, whose wheel is too big to travel)
GOLDEN_SCENARIOS=${GOLDEN_SCENARIOS:-grpo_tiny ppo_gae_tiny grpo_is_token_truncate ppo_is_sequence_clip_veto \
grpo_is_geometric grpo_is_metrics_only grpo_reward_model grpo_bf16_actor grpo_bf16_rollout}
DET_SCENARIOS=${DET_SCENARIOS:-grpo_tiny grpo_bf16_actor}
CROSS_SCENARIOS=${CROSS_SCENARIOS:-grpo_tiny ppo_gae_tiny grpo_bf16_actor grpo_bf16_rollout}
GATE_SCENARIO=${GATE_SCENARIO:-grpo_tiny}
if [ "$DEVICE" = cpu ]; then
    PLANT=${PLANT:-linear_bf16} BENIGN=${BENIGN:-sum_order}
else
    PLANT=${PLANT:-tf32} BENIGN=${BENIGN:-cublas_workspace}
fi
# the first profiled stage reads the first products of the step (and, through the rollout, the model's)
EXPECT_FIRST=${EXPECT_FIRST:-actor_compute_log_prob[step_1]}
COST_SCENARIO=${COST_SCENARIO:-benchmarks/scenarios/grpo_deep24.yaml}
CALIBRATE_RUNS=${CALIBRATE_RUNS:-4}
T_INSTALL=${T_INSTALL:-45} T2=${T2:-90} T3=${T3:-90} T4=${T4:-80} T5=${T5:-110} T6=${T6:-85}
export DEVICE PYTHON WHEELS JOBS TRANSFORMERS WORKER GOLDEN_SCENARIOS DET_SCENARIOS CROSS_SCENARIOS GATE_SCENARIO
export PLANT BENIGN EXPECT_FIRST COST_SCENARIO CALIBRATE_RUNS

# the gate loaded from this tree: -p no:precision drops an installed copy's entry point, if there is one
PYTEST=("$PYTHON" -m pytest -p no:precision -p pytest_precision -p no:cacheprovider -q --precision-worker "$WORKER")
CLI=("$PYTHON" -m precision_harness.cli)
FIGURES=("$PYTHON" "$REPO/benchmarks/device_figures.py")

paths() {  # "NAME NAME ..." -> scenarios/<NAME>.yaml, one a line
    local names name
    read -ra names <<<"$1"
    for name in "${names[@]}"; do printf 'scenarios/%s.yaml\n' "$name"; done
}

item_install() {
    local wheels=("$WHEELS"/*.whl)
    if [ ! -e "${wheels[0]}" ]; then
        echo "no wheels in $WHEELS: run python benchmarks/device_wheels.py on the CPU machine and carry .device-wheels"
        return 1
    fi
    if [ "$DEVICE" = cuda ]; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$ITEM_DIR/figures.txt"
    fi
    lscpu | grep -m1 'Model name' >>"$ITEM_DIR/figures.txt"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
        --target "$SITE" "${wheels[@]}" || return 1
    "$PYTHON" - "$TRANSFORMERS" <<'EOF' | tee -a "$ITEM_DIR/figures.txt"
import importlib.metadata as md
import sys

import jsonschema, msprobe, torch, transformers, zstandard  # noqa: E401,F401  (each must import)

for dist in ("torch", "transformers", "tokenizers", "mindstudio-probe", "jsonschema", "zstandard", "numpy"):
    print(f"{dist} {md.version(dist)}")
print(f"cuda available {torch.cuda.is_available()}; torch.version.cuda {torch.version.cuda}")
if transformers.__version__ != sys.argv[1]:
    sys.exit(f"transformers {transformers.__version__} from {transformers.__file__}, not {sys.argv[1]}: the "
             "goldens' key sets need it; carry its wheel (benchmarks/device_wheels.py)")
EOF
}

item_goldens() {
    mapfile -t files < <(paths "$GOLDEN_SCENARIOS")
    "${PYTEST[@]}" "${files[@]}" --precision-device "$DEVICE" --precision-golden update --precision-jobs "$JOBS" \
        --precision-artifacts "$WORK/artifacts2" --precision-report "$ITEM_DIR/report"
    local rc=$?
    echo "pytest exit $rc" >>"$ITEM_DIR/figures.txt"
    local file name names=()
    for file in "${files[@]}"; do names+=("$(basename "$file" .yaml)"); done
    "${FIGURES[@]}" manifests golden "$DEVICE" "${names[@]}" >>"$ITEM_DIR/figures.txt" || return 1
    for file in "${files[@]}"; do
        name=$(basename "$file" .yaml)
        [ -d "golden/$name/$DEVICE" ] || { echo "no golden/$name/$DEVICE was recorded"; return 1; }
        mkdir -p "$ITEM_DIR/golden/$name" && cp -r "golden/$name/$DEVICE" "$ITEM_DIR/golden/$name/"
    done
    return $rc
}

det_run() {  # FILE MODE I: one fresh run, with (on) or without (off) the determinism environment
    local out
    out=$WORK/det/$(basename "$1" .yaml)-$2-$3
    if [ "$2" = on ]; then
        "${CLI[@]}" run "$1" --device "$DEVICE" --out "$out"
    else
        PYTHONPATH="$REPO/tests/hooks:$PYTHONPATH" PRECISION_TEST_PLANT=nondeterministic \
            "${CLI[@]}" run "$1" --device "$DEVICE" --out "$out"
    fi
}

item_determinism() {
    local file name mode i pid rc=0 pids=()
    mapfile -t files < <(paths "$DET_SCENARIOS")
    # every run at once (fresh processes all): the item's time is one run's, not eight
    for file in "${files[@]}"; do
        for mode in on off; do
            for i in 1 2; do
                det_run "$file" "$mode" "$i" &
                pids+=($!)
            done
        done
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    for file in "${files[@]}"; do
        name=$(basename "$file" .yaml)
        for mode in on off; do
            {
                echo "$name, determinism environment $mode (two fresh processes):"
                "${FIGURES[@]}" diff "$WORK/det/$name-$mode-1" "$WORK/det/$name-$mode-2"
            } >>"$ITEM_DIR/figures.txt" || rc=1
        done
    done
    return $rc
}

item_cross() {
    mapfile -t files < <(paths "$CROSS_SCENARIOS")
    "${PYTEST[@]}" "${files[@]}" --precision-device cpu --precision-golden-device "$DEVICE" --precision-jobs "$JOBS" \
        --precision-artifacts "$WORK/artifacts4" --precision-report "$ITEM_DIR/report"
    local rc=$?
    echo "pytest exit $rc (1: drift beyond tolerance.cross_device)" >>"$ITEM_DIR/figures.txt"
    "${FIGURES[@]}" report "$ITEM_DIR/report/report.json" >>"$ITEM_DIR/figures.txt" || return 1
    # 0 and 1 (drift) are both figures; anything else (usage, collection, internal error) is a failed item
    [ $rc -le 1 ]
}

gate_check() {  # NAME PLANT: the gate scenario checked on DEVICE with PLANT planted; figures under NAME
    PYTHONPATH="$REPO/tests/hooks:$PYTHONPATH" PRECISION_TEST_PLANT=$2 "${PYTEST[@]}" "scenarios/$GATE_SCENARIO.yaml" \
        --precision-device "$DEVICE" --precision-artifacts "$WORK/artifacts5-$1" --precision-report "$ITEM_DIR/$1"
    local rc=$?
    {
        echo "$1: PRECISION_TEST_PLANT=$2, pytest exit $rc"
        "${FIGURES[@]}" report "$ITEM_DIR/$1/report.json"
    } >>"$ITEM_DIR/figures.txt"
    return $rc
}

item_gate() {
    local rc=0
    gate_check planted "$PLANT"
    if [ $? -ne 1 ]; then
        echo "planted $PLANT: expected the gate to fail (exit 1)" | tee -a "$ITEM_DIR/figures.txt"
        rc=1
    elif ! grep -qF "first failing item of $GATE_SCENARIO: scenarios/$GATE_SCENARIO.yaml::$EXPECT_FIRST" \
        "$ITEM_DIR/figures.txt"; then
        echo "planted $PLANT: not first caught at $EXPECT_FIRST" | tee -a "$ITEM_DIR/figures.txt"
        rc=1
    fi
    if ! gate_check benign "$BENIGN"; then
        echo "benign $BENIGN: expected the gate to pass" | tee -a "$ITEM_DIR/figures.txt"
        rc=1
    fi
    "${CLI[@]}" calibrate "scenarios/$GATE_SCENARIO.yaml" --device "$DEVICE" --runs "$CALIBRATE_RUNS" \
        --work-dir "$WORK/calibrate" | tee -a "$ITEM_DIR/figures.txt" || rc=1
    cp "golden/$GATE_SCENARIO/$DEVICE/manifest.json" "$ITEM_DIR/calibrated-manifest.json" || rc=1
    return $rc
}

item_cost() {
    "${FIGURES[@]}" cost "$COST_SCENARIO" --device "$DEVICE" --work "$WORK/cost" >>"$ITEM_DIR/figures.txt"
}

# ---- one item, in its own process under timeout (the script calls itself)
if [ "${1:-}" = --item ]; then
    ITEM_DIR=$3 SITE=$WORK/site
    export ITEM_DIR
    case $2 in
        0) item_install ;;
        2) item_goldens ;;
        3) item_determinism ;;
        4) item_cross ;;
        5) item_gate ;;
        6) item_cost ;;
        *) echo "unknown item $2" && exit 2 ;;
    esac
    exit $?
fi

[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 2
WORK=${WORK:-$(mktemp -d /tmp/device-run.XXXXXX)}
mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd)
export WORK PYTHONPATH="$REPO:$REPO/plugins:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY=$OUT/summary.md
failed=0

declare -A NAMES=([0]=install [2]=goldens [3]=determinism [4]=cross [5]=gate [6]=cost)
declare -A LIMITS=([0]=$T_INSTALL [2]=$T2 [3]=$T3 [4]=$T4 [5]=$T5 [6]=$T6)

{
    echo "# Device run ($DEVICE), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); items: install $ITEMS; jobs $JOBS"
} >"$SUMMARY"

run_item() {  # N: run item N under its limit, pack its folder into OUT, add its status and figures to the summary
    local n=$1 name=${NAMES[$1]:-} dir status start rc
    [ -n "$name" ] || { echo "unknown item $n (expected 2 3 4 5 6)" >&2; failed=1; return 1; }
    dir=$WORK/item$n-$name
    mkdir -p "$dir" && : >"$dir/figures.txt"
    start=$SECONDS
    timeout --kill-after=10 "${LIMITS[$n]}" bash "$SELF" --item "$n" "$dir" >"$dir/log.txt" 2>&1
    rc=$?
    case $rc in
        0) status=ok ;;
        124 | 137) status="timed out after ${LIMITS[$n]} s" ;;
        *) status="failed (exit $rc)" ;;
    esac
    [ $rc -eq 0 ] || failed=1
    tar -czf "$OUT/item$n-$name.tar.gz" -C "$WORK" "item$n-$name"
    {
        printf '\n## item %s %s: %s, %d s\n\n```\n' "$n" "$name" "$status" $((SECONDS - start))
        cat "$dir/figures.txt"
        [ $rc -eq 0 ] || { echo "--- end of log.txt"; tail -n 20 "$dir/log.txt"; }
        printf '```\n'
    } >>"$SUMMARY"
    echo "item $n $name: $status"
    return $rc
}

run_item 0 || exit 2
read -ra items <<<"$ITEMS"
for n in "${items[@]}"; do
    run_item "$n"
done
exit $failed
