#!/usr/bin/env bash
# One-command set-up for lookhere-dense.
#
#   bash setup.sh                                  # creates ./.venv, builds mmcv from source
#   bash setup.sh --mmcv-wheels ../shared/wheels   # or take a prebuilt mmcv wheel that matches
#   (MMCV_WHEEL_DIR=DIR does the same as --mmcv-wheels DIR)
#
# Installs torch 2.14.1 + torchvision 0.29.1, mmengine, mmcv 2.1.0 WITH compiled ops,
# mmsegmentation 1.2.2, mmdet 3.3.0, timm and this package (editable) into .venv.
# Idempotent: a second run only checks what is there and returns in seconds.
#
# mmcv 2.1.0 has no wheel for torch 2.14; it is taken from MMCV_WHEEL_DIR when a wheel
# there matches this Python/platform, otherwise built from the PyPI sdist with its
# '-std=c++17' flags raised to '-std=c++20' (torch 2.14 headers need C++20). The build
# takes 30-50 minutes on 2 cores. With nvcc and a CUDA GPU present, CUDA ops are built
# too (FORCE_CUDA=1). Built wheels are kept in .cache/wheels for the next run.
# Last, it compiles the fused CPU attention kernel (lookhere_dense/lookhere/attention/csrc, ~20 s,
# kept in PyTorch's extension directory); without a compiler the project still works
# (attn_backend='auto' then uses the tiled backend).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
while [ $# -gt 0 ]; do
  case "$1" in
    --mmcv-wheels) MMCV_WHEEL_DIR="$(cd "$2" && pwd)"; shift 2 ;;
    --mmcv-wheels=*) MMCV_WHEEL_DIR="$(cd "${1#*=}" && pwd)"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
WHEEL_CACHE="$ROOT/.cache/wheels"
MMCV_VERSION=2.1.0
TORCH_SPEC=(torch==2.14.1 torchvision==0.29.1)

log() { printf '[setup] %s\n' "$*"; }
pip_install() {  # pip install, without the per-package "Location ... is ignored" noise
  "$VPY" -m pip install "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

if [ ! -x "$VPY" ]; then
  log "creating virtual environment at $VENV"
  "$PYTHON" -m venv "$VENV"
fi

have() {  # have "import stmt"  -> succeeds when the import works in the venv
  "$VPY" - "$1" >/dev/null 2>&1 <<'PY'
import sys
exec(sys.argv[1])
PY
}

# 1. base tooling (setuptools<82 keeps pkg_resources, needed by mmcv's setup.py and
#    mmengine's package-scoped config inheritance).
if ! have "import setuptools, wheel, ninja, pkg_resources; assert int(setuptools.__version__.split('.')[0]) < 82"; then
  log "installing build tooling"
  pip_install -q --upgrade 'pip' 'setuptools>=77.0.3,<82' wheel ninja
fi

# 2. torch
if ! have "import torch, torchvision; assert torch.__version__.startswith('2.14.1') and torchvision.__version__.startswith('0.29.1')"; then
  log "installing ${TORCH_SPEC[*]} (about 2 minutes)"
  pip_install -q "${TORCH_SPEC[@]}"
fi

# 3. mmcv 2.1.0 with compiled ops
mmcv_ok() { have "import mmcv, mmcv.ops; from mmcv.ops import nms; assert mmcv.__version__ == '$MMCV_VERSION'"; }
if ! mmcv_ok; then
  pip_install -q 'numpy<2.5' 'setuptools>=77.0.3,<82' wheel ninja
  TAG=$("$VPY" -c "import sys; print(f'cp{sys.version_info.major}{sys.version_info.minor}')")
  PLAT=$("$VPY" -c "import sysconfig; print(sysconfig.get_platform().replace('-', '_').replace('.', '_'))")
  CUDA_BUILD=0
  if command -v nvcc >/dev/null 2>&1 && "$VPY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    CUDA_BUILD=1
  fi
  WHEEL=""
  # A prebuilt wheel offered by the caller has CPU ops only; on a CUDA machine build instead.
  for dir in ${MMCV_WHEEL_DIR:-} "$WHEEL_CACHE"; do
    [ -d "$dir" ] || continue
    for w in "$dir"/mmcv-$MMCV_VERSION-$TAG-$TAG-$PLAT.whl; do
      [ -f "$w" ] || continue
      if [ "$CUDA_BUILD" = 1 ] && [ "$dir" != "$WHEEL_CACHE" ]; then
        log "ignoring $w: it has CPU ops only and this machine has CUDA + nvcc"; continue
      fi
      WHEEL="$w"; break 2
    done
  done
  if [ -z "$WHEEL" ]; then
    log "no matching mmcv wheel offered: building mmcv $MMCV_VERSION from source (FORCE_CUDA=$CUDA_BUILD; 30-50 min on 2 cores)"
    SRC="$ROOT/.cache/mmcv-src"
    rm -rf "$SRC"; mkdir -p "$SRC" "$WHEEL_CACHE"
    "$VPY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
      "mmcv==$MMCV_VERSION" -d "$SRC" 2> >(grep -v "is ignored: it is neither" >&2)
    tar -xzf "$SRC"/mmcv-$MMCV_VERSION.tar.gz -C "$SRC"
    sed -i "s/-std=c++17/-std=c++20/g" "$SRC/mmcv-$MMCV_VERSION/setup.py"
    grep -q -- "-std=c++20" "$SRC/mmcv-$MMCV_VERSION/setup.py" || { log "could not patch mmcv setup.py"; exit 1; }
    MMCV_WITH_OPS=1 FORCE_CUDA=$CUDA_BUILD MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      "$VPY" -m pip wheel --no-deps --no-build-isolation "$SRC/mmcv-$MMCV_VERSION" -w "$WHEEL_CACHE"
    WHEEL=$(ls "$WHEEL_CACHE"/mmcv-$MMCV_VERSION-*.whl | head -n 1)
  fi
  log "installing $WHEEL"
  pip_install -q --no-deps "$WHEEL"
  pip_install -q addict 'numpy<2.5' packaging Pillow pyyaml yapf 'opencv-python-headless' mmengine==0.10.7
  mmcv_ok || { log "mmcv installed but mmcv.ops does not import"; exit 1; }
fi

# 4. the rest, pinned in requirements.txt, and this package (editable)
if ! have "import mmengine, mmseg, mmdet, timm, lookhere_dense, pytest; assert mmseg.__version__ == '1.2.2' and mmdet.__version__ == '3.3.0'" \
   || ! "$VPY" -m pip show -q lookhere-dense >/dev/null 2>&1; then
  log "installing requirements.txt and lookhere_dense (editable)"
  pip_install -q -r requirements.txt
  pip_install -q --no-deps --no-build-isolation -e .
fi

# 5. the fused CPU attention kernel (lookhere_dense/lookhere/attention/csrc), compiled once per machine
#    into PyTorch's extension directory (~20 s); without it `auto` uses the tiled backend
if ! "$VPY" -c "from lookhere_dense.lookhere.fused import load_fused_ops; load_fused_ops()"; then
  log "WARNING: the fused CPU attention kernel could not be built (see above); attn_backend='auto' uses 'tiled' instead"
fi

"$VPY" - <<'PY'
import torch, mmcv, mmengine, mmseg, mmdet, timm
from mmcv.ops import nms  # compiled ops present
import lookhere_dense
print(f'[setup] ok: torch {torch.__version__}, mmcv {mmcv.__version__} (ops), mmengine {mmengine.__version__}, '
      f'mmseg {mmseg.__version__}, mmdet {mmdet.__version__}, timm {timm.__version__}, '
      f'cuda={torch.cuda.is_available()}')
from lookhere_dense.lookhere.fused import fused_available
print(f'[setup] fused CPU attention kernel: {"built" if fused_available() else "not built"}')
PY
