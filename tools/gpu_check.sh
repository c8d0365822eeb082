#!/usr/bin/env bash
# The one prepared GPU run, for a machine with only torch (2.5+) and CUDA (timm for the
# peer rows; no OpenMMLab, no install step). From the repository root:
#
#     bash tools/gpu_check.sh                  # writes $OUT/gpu_check.json where $OUT is
#                                              # set, else docs/benchmark_cuda.json
#     bash tools/gpu_check.sh --simulate-cpu   # the same sections, cases, compile calls,
#                                              # checks and JSON layout on CPU, tiny sizes
#     bash tools/gpu_check.sh --out FILE.json  # elsewhere (other flags: --help)
#
# What it runs (research/benchmark/gpu_check.py; docs/gpu.md says how to read it): env
# (versions, Triton, C compiler, one compiled flex probe), correctness (flex forward and
# q/k/v/slope gradients vs the reference in bfloat16, float16, then float32, at stated
# tolerances; in bfloat16 / float16 also the forward's rounding bound: the score_mod and
# softmax in float32), attn (1k-32k tokens: check, warm-up, 5 timed rounds, medians, peak
# memory; flex, flex computing every tile, SDPA without bias, SDPA with the dense bias;
# forward and forward + backward; first the parts case, where flex's time
# goes: flex alone, our tiles, the block mask, the table score_mod, the reorder), peer (timm's ViT-B vs our trunk without bias and lh180
# / lh90 / lh45 through flex: frames 1024x2048 and 2048x4096, train steps 512 and 1024,
# one process per case). The JSON is rewritten after every case: a kill at any moment
# leaves valid JSON with everything finished; with $OUT set, all output also goes to
# $OUT/gpu_check.log (the device returns files under $OUT, only the tail of stdout), and
# the generated flex kernels to $OUT/gpu_check_kernels.txt.
#
# Budget: 400 s of sections (env 20, correctness 70, attn 110, peer 200), each enforced (a
# case that would start too late is recorded as skipped; a section that ran over leaves
# the later ones only what is left of the 400 s), plus ~15 s of imports. The estimate
# behind it, one H200 (~990 dense bf16 TFLOP/s, say 400 reached): the work is small (attn
# at 32k tokens: 4*T^2*d*heads = 3.3 TFLOP forward, ~10 ms; a ViT-B frame of 2048x4096 =
# 32k tokens: ~12 * (24*T*D^2 + 4*T^2*D) = 50 TFLOP, ~0.15 s); compilation dominates. Flex
# compiles once per (shape, dtype, grad mode): measured here on CPU, aot_eager 1-2 s per
# shape and inductor's CPU kernel 24 s; on the GPU Triton's forward and backward kernels
# are assumed at ~10 s and ~25 s (not measured: no GPU was lent): correctness 6 cases x
# ~(10 + 25) s would need 210 s, so the 70 s budget may skip the learnable and float32
# cases (bfloat16 and float16 fixed first; the first H200 runs: ~10-18 s per case); attn
# 5 sizes x ~40 s plus the parts case (~8 compiles, ~80 s) need 280 s, so 110 s covers
# the parts case and 8k, 137 s (--budget-scale 1.25) about one more size; peer 19 processes x
# (~8 s start + compile; the 4 Triton frame rows first after timm's and ours without bias)
# fit the first ~13 rows in 200 s. Raise it with --budget-scale
# where time allows (1.25: 500 s of sections, cap 570 s + 30 s to stop, inside a 10-minute
# limit per command; 2: 12 min). A hard cap of budget + 70 s (timeout, SIGINT) stops a
# hung run; the run still writes its JSON and says so.
set -uo pipefail
cd "$(dirname "$0")/.."

py="${PYTHON:-}"
if [[ -z $py ]]; then
    py="$(command -v python3 || command -v python || true)"
fi
if [[ -z $py ]]; then
    echo 'tools/gpu_check.sh: no python3 or python on PATH (set PYTHON=...)' >&2
    exit 2
fi
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "tools/gpu_check.sh: $py cannot import torch (set PYTHON=/path/to/python)" >&2
    exit 2
fi
if [[ " $* " == *" -h "* || " $* " == *" --help "* ]]; then
    exec "$py" -m research.benchmark.gpu_check --help
fi
scale=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    if [[ ${args[i]} == --budget-scale ]]; then
        scale="${args[i + 1]:-1}"
    elif [[ ${args[i]} == --budget-scale=* ]]; then
        scale="${args[i]#--budget-scale=}"
    fi
done
# one compile thread: no pool of compile workers that Ctrl-C or the cap would not reach;
# LOOKHERE_TIMM=0: importing lookhere_dense does not register our models with timm (the
# peer is timm's own ViT-B; a timm whose internals differ must not stop the run)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1 LOOKHERE_TIMM=0
# a fresh inductor cache per run (the children share it): first-call times are compile
# times, and gpu_check_kernels.txt holds this run's kernels only (unless one is given)
if [[ -z ${TORCHINDUCTOR_CACHE_DIR:-} ]]; then
    TORCHINDUCTOR_CACHE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_inductor.XXXXXX")"
    export TORCHINDUCTOR_CACHE_DIR
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
cap="$("$py" -c "print(int(400 * float('$scale') + 70))" 2>/dev/null || echo 470)"
if [[ " $* " == *" --simulate-cpu "* ]]; then
    cap=$((cap * 10))
fi
log_pid=
if [[ -n ${OUT:-} ]] && mkdir -p "$OUT" 2>/dev/null && : >>"$OUT/gpu_check.log" 2>/dev/null; then
    # everything printed (progress, warnings, tracebacks) also goes to $OUT/gpu_check.log:
    # the device tool returns files under $OUT but only the tail of the output
    exec > >(tee -a "$OUT/gpu_check.log") 2>&1
    log_pid=$!
fi
cmd=("$py" -m research.benchmark.gpu_check "$@")
if command -v timeout >/dev/null; then
    echo "tools/gpu_check.sh: $py, hard cap ${cap} s"
    timeout --signal=INT --kill-after=30 "$cap" "${cmd[@]}"
else
    echo "tools/gpu_check.sh: $py, no timeout(1) here: no hard cap (the section budgets hold)"
    "${cmd[@]}"
fi
rc=$?
case $rc in
    0) echo 'tools/gpu_check.sh: finished, every case ok' ;;
    3) echo 'tools/gpu_check.sh: finished; some cases failed or were skipped (see the table)' ;;
    2) echo 'tools/gpu_check.sh: did not start (see above)' ;;
    124 | 130) echo "tools/gpu_check.sh: stopped (exit $rc: the ${cap} s cap or Ctrl-C);" \
        'the JSON holds every case finished before' ;;
    *) echo "tools/gpu_check.sh: crashed (exit $rc); the JSON holds every case finished before" ;;
esac
if [[ -n $log_pid ]]; then  # let tee finish writing the log before the machine is read
    exec >&- 2>&-
    wait "$log_pid" 2>/dev/null
fi
exit $rc
