#!/usr/bin/env bash
# One prepared GPU run on a machine that has only torch (2.5+) and CUDA (timm for the peer
# rows): no OpenMMLab, no install step. From the repository root:
#
#     bash tools/gpu_check.sh                      # writes docs/benchmark_cuda.json
#     bash tools/gpu_check.sh OUT.json             # elsewhere
#     bash tools/gpu_check.sh --dry-run OUT.json   # the same steps on CPU at tiny sizes
#
# What it runs (tools/benchmark.py, bfloat16, one JSON file, a table on stdout):
#   attn  attention alone at 1k / 4k / 8k / 16k / 32k patches (12 heads x 64): LookHere
#         flex (compiled, block mask, tile order) vs SDPA without bias (flash) vs SDPA
#         with the dense bias as a mask; forward, and forward + backward.
#   peer  ViT-B/16 against timm's vit_base_patch16_224, a fresh process per case: the
#         whole 1024x2048 frame (8193 tokens: not a multiple of 128) for timm, our trunk
#         without bias, lh180, lh90, lh45; the 512x512 train step for timm, no bias,
#         lh180, lh90.
# Budget: at most 8 minutes on one H200, compilation included (flex compiles once per
# shape: every layer's score_mod shares one graph). The run stops itself at 470 s and
# still writes what it measured up to the section that did not finish.
set -euo pipefail
cd "$(dirname "$0")/.."

dry=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry=1
    shift
fi
out="${1:-docs/benchmark_cuda.json}"
py="${PYTHON:-python}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$py" - "$dry" <<'EOF'
import sys
import torch
dry = sys.argv[1] == '1'
print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, '
      f'device: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}')
if not dry and not torch.cuda.is_available():
    sys.exit('tools/gpu_check.sh: no CUDA device (use --dry-run to try the steps on CPU)')
try:
    import timm
    print(f'timm {timm.__version__}')
except ImportError:
    sys.exit('tools/gpu_check.sh: the peer rows need timm (pip install timm)')
EOF

if [[ $dry == 1 ]]; then
    args=(--device cpu --quick --attn-tokens 64 256 --peer-presets lh90)
    limit=900
else
    args=(--device cuda --dtype bfloat16 --attn-tokens 1024 4096 8192 16384 32768
          --peer-presets lh180 lh90 lh45 --peer-big-frame --frame-repeats 1
          --repeats 10 --child-timeout 200)
    limit=470
fi
timeout --signal=INT "$limit" "$py" tools/benchmark.py --sections attn peer "${args[@]}" \
    --json "$out"
