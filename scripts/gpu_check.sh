#!/usr/bin/env bash
# One real SGLang 0.5.23 server on one GPU, launched as `dflash fleet up` launches it (at the ceiling: radix cache
# off, --max-running-requests planned from the GPU's memory), then the protocol tests that run against a real
# server and a short `dflash tune`; prints the measured cap, output tok/s and accept length, and writes the measured
# curve as a GPU profile (measured_profile.json in the work dir) compared with the built-in profile of this GPU
# (`dflash profile compare`: per point ratio and a verdict). Unattended, under 9 minutes on one H200.
#
#   scripts/gpu_check.sh                         # random weights (--load-format dummy), the shipped config.json
#   scripts/gpu_check.sh --model /models/Qwen3.6-27B   # real weights
#
# Options:
#   --model PATH      a local Qwen3.6-27B checkpoint (default: none, random weights of the real shapes)
#   --gpu N           the GPU (default 0)
#   --python PATH     a python with sglang 0.5.23 and this project installed (default: .venv/bin/python,
#                     else python3); `pip install -e '.[gpu,dev]'` makes one
#   --port N          the server's port (default 30000)
#   --keep            leave the server running at the end (`dflash fleet down` stops it)
#
# Random weights give the real memory, pools, cap and step times; their accept length means nothing (a random
# MTP layer agrees with a random target by chance only) and is reported as such. GPU nodes are often offline:
# with random weights nothing is downloaded (HF_HUB_OFFLINE=1). Exit status: 0 all passed, 1 a check failed,
# 3 this node cannot run the check (no GPU, no sglang), 124 the time budget ran out.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL=""
GPU=0
PORT=30000
KEEP=0
PYTHON=""
BUDGET_S=540          # 9 minutes, everything included
STARTUP_TIMEOUT_S=300 # weights (random or read), CUDA graphs for every decode batch size up to the cap
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --gpu) GPU="$2"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -z "$PYTHON" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi

STARTED=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
export DFLASH_WORK_DIR="$WORK/work" DFLASH_STORE="$WORK/store" DFLASH_FLEET_DIR="$WORK/fleet"
unset DFLASH_SGLANG_ENDPOINTS DFLASH_SGLANG_ROUTER SGLANG_API_KEY
URL="http://127.0.0.1:$PORT"
FAILED=()

say() { printf '\n=== [%3ds] %s\n' "$((SECONDS - STARTED))" "$*"; }
left() { echo $((BUDGET_S - (SECONDS - STARTED))); }
dflash() { (cd "$ROOT" && "$PYTHON" -m dagster_project.cli "$@"); }
# Run "$@" with what is left of the budget, less `reserve` seconds kept for what follows.
within() {
    local reserve="$1"; shift
    local limit=$(( $(left) - reserve ))
    if (( limit < 10 )); then echo "no time left for: $*" >&2; return 124; fi
    timeout --kill-after=10 "$limit" "$@"
}
stop() {
    if (( KEEP == 0 )); then dflash fleet down >/dev/null 2>&1 || true; fi
}
trap stop EXIT

# ---- can this node run it? -------------------------------------------------------------------------------------
say "node: $(hostname), python $PYTHON, work dir $WORK"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -i "$GPU" --query-gpu=name,memory.total,memory.free \
        --format=csv,noheader; then
    echo "no GPU $GPU visible to nvidia-smi: nothing to check on this node" >&2; exit 3
fi
if ! "$PYTHON" -c "import sglang, sys; print('sglang', sglang.__version__); sys.exit(sglang.__version__ != '0.5.23')"; then
    echo "this python has no sglang 0.5.23: pip install -e '.[gpu,dev]' (sglang==0.5.23 pulls its CUDA torch)" >&2
    exit 3
fi
"$PYTHON" -c "import dagster_project, pytest" || { echo "the project (with its dev extras) is not installed" >&2; exit 3; }

# ---- the model ------------------------------------------------------------------------------------------------
LOAD=()
if [[ -z "$MODEL" ]]; then
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    MODEL="$WORK/qwen3.6-27b-dummy"
    (cd "$ROOT" && "$PYTHON" -m dagster_project.sglang.dummy_model "$MODEL") || exit 1
    LOAD=(--load-format dummy)
    WEIGHTS="random (--load-format dummy)"
else
    WEIGHTS="real ($MODEL)"
fi

# `dflash fleet up` as an operator runs it, within what is left of the budget less `reserve` seconds.
launch() {
    local reserve="$1"
    (cd "$ROOT" && within "$reserve" "$PYTHON" -m dagster_project.cli fleet up --gpus "$GPU" --model "$MODEL" \
        --base-port "$PORT" "${LOAD[@]}" --startup-timeout-s "$STARTUP_TIMEOUT_S") 2>&1 | tee "$WORK/fleet_up.txt"
    return "${PIPESTATUS[0]}"
}

# ---- 1. one server with the launch defaults ----------------------------------------------------------------
say "1. dflash fleet up --gpus $GPU (weights: $WEIGHTS)"
if ! launch 240; then
    # The multimodal front end needs an image/video processor that this node's transformers may not build from the
    # shipped configs: fall back to serving the language model alone (memory then differs: no vision encoder).
    if [[ ${#LOAD[@]} -gt 0 ]] && grep -qiE "processor|preprocessor|image|video" "$WORK"/fleet/*.log 2>/dev/null; then
        say "the multimodal processor did not load: retrying with the language model alone (text-only config)"
        dflash fleet down >/dev/null 2>&1 || true
        (cd "$ROOT" && "$PYTHON" -m dagster_project.sglang.dummy_model "$MODEL" --text-only) || exit 1
        WEIGHTS="$WEIGHTS, language model only (no vision encoder: memory differs from the real launch)"
        launch 200 || { tail -n 60 "$WORK"/fleet/*.log; exit 1; }
    else
        tail -n 60 "$WORK"/fleet/*.log 2>/dev/null; exit 1
    fi
fi
dflash fleet status
dflash fleet status --json > "$WORK/fleet_status.jsonl"  # what each server reported, read below

# ---- 2. the protocol tests that run against a real server ---------------------------------------------------
say "2. protocol tests against $URL"
(cd "$ROOT" && SGLANG_TEST_SERVER_URL="$URL" SGLANG_PYTHON="$PYTHON" SGLANG_TEST_MODEL="$MODEL" \
    within 200 "$PYTHON" -m pytest -q -p no:cacheprovider tests/integration/test_server_protocol.py \
    "tests/unit/sglang/test_launch.py::test_real_sglang_parses_the_command") || FAILED+=("protocol tests")

# ---- 3. a short dflash tune ---------------------------------------------------------------------------------
CAP="$("$PYTHON" - "$WORK/fleet_status.jsonl" <<'EOF'
import json, sys
print(json.loads(open(sys.argv[1]).readline()).get("max_running_requests") or 64)
EOF
)"
HALF=$(( CAP / 2 > 8 ? CAP / 2 : 8 ))
WINDOW=$(( (CAP * 5 + 3) / 4 ))
say "3. dflash tune: 600-token prompts, 128-token answers, concurrency 1 (the prefill alone), 8, $HALF, $CAP, $WINDOW (the dispatcher's window)"
within 20 bash -c "cd '$ROOT' && '$PYTHON' -m dagster_project.cli tune --endpoints '$URL' --synthetic-prompt-tokens 600 \
    --sample 256 --max-new-tokens 128 --ignore-eos --concurrencies 1,8,$HALF,$CAP,$WINDOW --rounds 3 --min-requests 8 \
    --refine 1 --request-timeout-s 300 --out '$WORK/tune'" || FAILED+=("dflash tune")

# ---- 4. the measured curve as a GPU profile, against the built-in one ------------------------------------------
# The tune's points in the profile format (decode step per running count: `dflash plan --project --profile` takes
# it), then compared with the roofline profile of this GPU and weights: per point ratio and a verdict.
if [[ -f "$WORK/tune/report.json" ]]; then
    read -r PROFILE_GPU PROFILE_WEIGHTS MEMORY_GIB SERVED_WEIGHTS_GIB KV_DTYPE SSM_DTYPE < <("$PYTHON" - "$URL" "$MODEL" \
        "$(nvidia-smi -i "$GPU" --query-gpu=name,memory.total --format=csv,noheader,nounits)" <<'EOF'
import json, pathlib, sys, urllib.request
url, model, smi = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
name, total_mib = (part.strip() for part in smi.rsplit(",", 1))
gpu = next((g for g in ("h200", "b200") if g in name.lower()), name.lower().replace(" ", "-"))
config = json.loads((model / "config.json").read_text()) if (model / "config.json").is_file() else {}
quant = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config") or {}
weights = "fp8" if "fp8" in json.dumps(quant).lower() else "bf16"
info = json.load(urllib.request.urlopen(url + "/server_info", timeout=30))
state = (info.get("internal_states") or [{}])[0]
print(gpu, weights, float(total_mib) / 1024, (state.get("memory_usage") or {}).get("weight", 0.0),
      info.get("kv_cache_dtype") or "auto", info.get("mamba_ssm_dtype") or "float32")
EOF
    )
    DUMMY=()
    if [[ ${#LOAD[@]} -gt 0 ]]; then DUMMY=(--random-weights); fi
    say "4. measured curve -> $WORK/measured_profile.json, compared with profile $PROFILE_GPU-$PROFILE_WEIGHTS"
    if dflash profile measure --tune-report "$WORK/tune/report.json" --gpu "$PROFILE_GPU" \
            --weights "$PROFILE_WEIGHTS" --memory-gib "$MEMORY_GIB" --weights-gib "$SERVED_WEIGHTS_GIB" \
            --kv-cache-dtype "$KV_DTYPE" --mamba-ssm-dtype "$SSM_DTYPE" "${DUMMY[@]}" \
            --source "scripts/gpu_check.sh on $(hostname), $(date -u +%F), weights: $WEIGHTS" \
            --out "$WORK/measured_profile.json"; then
        dflash profile compare "$WORK/measured_profile.json" --profile "$PROFILE_GPU-$PROFILE_WEIGHTS" \
            --json "$WORK/profile_comparison.json" || echo "no built-in profile for $PROFILE_GPU-$PROFILE_WEIGHTS"
    else
        FAILED+=("measured profile")
    fi
fi

# ---- summary --------------------------------------------------------------------------------------------------
say "summary"
"$PYTHON" - "$WORK" "$WEIGHTS" <<'EOF'
import json, pathlib, sys
work, weights = pathlib.Path(sys.argv[1]), sys.argv[2]
status = json.loads((work / "fleet_status.jsonl").read_text().splitlines()[0])
plan = [line.strip() for line in (work / "fleet_up.txt").read_text().splitlines() if line.startswith(("plan:", "  http"))]
print(f"weights: {weights}")
print(f"server cap (effective_max_running_requests_per_dp): {status.get('max_running_requests')}")
for line in plan:
    print(f"  {line}")
report = work / "tune" / "report.json"
if report.exists():
    data = json.loads(report.read_text())
    dummy = weights.startswith("random")
    for point in data["points"]:
        accept = point["accept_length"]
        shown = "—" if accept is None else f"{accept:.2f}" + (" (meaningless: random weights)" if dummy else "")
        print(
            f"  concurrency {point['concurrency']:>4}: {point['output_tok_per_s']:>9,.0f} output tok/s, "
            f"accept length {shown}, latency p50 {point['latency_p50_s'] or 0:.2f} s, errors {point['errors']}"
        )
    print(data["recommendation"])
    print("recommended flags:", " ".join(data["recommended_flags"]))
EOF
say "done in $((SECONDS - STARTED)) s; logs and reports in $WORK"
if (( ${#FAILED[@]} )); then echo "FAILED: ${FAILED[*]}" >&2; exit 1; fi
echo "gpu_check: all passed"
