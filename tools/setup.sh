#!/usr/bin/env bash
# One-command set-up: a virtual environment at .venv with torch, timm, fvcore, detectron2,
# mmcv (compiled ops), mmengine, mmsegmentation, mmdet and this package (editable).
#
# Idempotent: every step first checks whether its result is already there.
# Environment knobs:
#   SRVIT_VENV        where the environment goes (default: <repo>/.venv)
#   SRVIT_PYTHON      interpreter used to create it (default: python3.11, else python3)
#   SRVIT_CACHE       wheel cache kept outside the repository (default: ~/.cache/srvit-backbones)
#   SRVIT_USE_CURRENT_ENV=1   install into the active interpreter instead of creating .venv
#   DETECTRON2_GIT    upstream detectron2 repository tried before the PyPI snapshot
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SRVIT_CACHE:-$HOME/.cache/srvit-backbones}"
WHEELS="$CACHE/wheels"
CONSTRAINTS="$REPO/tools/constraints.txt"
DETECTRON2_GIT="${DETECTRON2_GIT:-https://github.com/facebookresearch/detectron2.git}"
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1)
MMCV_VERSION=2.1.0
START=$(date +%s)

STEP="start"
trap 'echo "[setup] FAILED at step: $STEP (see the messages above)" >&2' ERR
step() { STEP="$1"; echo "[setup] == $1"; }
elapsed() { echo $(( $(date +%s) - START ))s; }

mkdir -p "$WHEELS"

step "python environment"
if [[ "${SRVIT_USE_CURRENT_ENV:-0}" == "1" ]]; then
  PY="$(command -v python)"
  echo "[setup] using the current interpreter: $PY"
else
  VENV="${SRVIT_VENV:-$REPO/.venv}"
  if [[ ! -x "$VENV/bin/python" ]]; then
    BASE_PY="${SRVIT_PYTHON:-$(command -v python3.11 || command -v python3)}"
    echo "[setup] creating $VENV with $BASE_PY"
    "$BASE_PY" -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 9), sys.version' \
  || { echo "[setup] Python >= 3.9 is required" >&2; false; }
PIP=("$PY" -m pip --disable-pip-version-check)
have() { "$PY" -c "$1" >/dev/null 2>&1; }
# what is already there (package metadata only: fast); refreshed after each install
status() { STATUS="$("$PY" "$REPO/tools/env_status.py" "$REPO" 2>/dev/null || true)"; }
present() { grep -qx "$1=ok" <<<"$STATUS"; }
status

step "torch ${TORCH_PINS[*]}"
if present torch; then
  echo "[setup] torch already present"
else
  "${PIP[@]}" install "${TORCH_PINS[@]}"
fi

step "python requirements"
REQ_STAMP="$("$PY" -c 'import sys,hashlib; print(hashlib.sha1(b"".join(open(f,"rb").read() for f in sys.argv[1:])).hexdigest())' "$REPO/tools/requirements.txt" "$REPO/tools/requirements-no-deps.txt" "$CONSTRAINTS")"
STAMP_FILE="$("$PY" -c 'import sys; print(sys.prefix)')/.srvit_requirements_stamp"
if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$REQ_STAMP" ]]; then
  echo "[setup] requirements already installed"
else
  "${PIP[@]}" install -c "$CONSTRAINTS" "${TORCH_PINS[@]}" -r "$REPO/tools/requirements.txt"
  "${PIP[@]}" install --no-deps -r "$REPO/tools/requirements-no-deps.txt"
  echo "$REQ_STAMP" > "$STAMP_FILE"
fi

step "detectron2"
if present detectron2; then
  echo "[setup] detectron2 already installed (collect_env below shows which)"
else
  installed=""
  if [[ "${SRVIT_SKIP_DETECTRON2_GIT:-0}" != "1" ]] && \
     timeout 60 git ls-remote --heads "$DETECTRON2_GIT" >/dev/null 2>&1; then
    echo "[setup] building detectron2 from $DETECTRON2_GIT"
    if CC="$REPO/tools/cxx20.sh" CXX="$REPO/tools/cxx20.sh" MAX_JOBS=2 \
       "${PIP[@]}" install -c "$CONSTRAINTS" --no-build-isolation "git+$DETECTRON2_GIT"; then
      installed="upstream git ($DETECTRON2_GIT)"
    else
      echo "[setup] building detectron2 from git failed; falling back to the PyPI snapshot"
    fi
  else
    echo "[setup] $DETECTRON2_GIT is not reachable; using the PyPI snapshot sal-detectron2==0.7.2"
  fi
  if [[ -z "$installed" ]]; then
    # sal-detectron2 ships only a cp310 wheel; its Python code is version-independent and
    # its compiled _C (for CPython 3.10, not loaded on 3.11) serves nothing Mask R-CNN needs:
    # rotated boxes and deformable conv use it; COCO evaluation falls back to pycocotools'.
    D2_WHEEL="$WHEELS/sal_detectron2-0.7.2-py3-none-any.whl"
    if [[ ! -f "$D2_WHEEL" ]]; then
      TMP="$(mktemp -d)"
      "${PIP[@]}" download --no-deps --only-binary=:all: --python-version 3.10 -d "$TMP" sal-detectron2==0.7.2
      cp "$TMP"/sal_detectron2-0.7.2-*.whl "$D2_WHEEL"
      rm -rf "$TMP"
    fi
    "${PIP[@]}" install --no-deps "$D2_WHEEL"
    installed="PyPI snapshot sal-detectron2==0.7.2"
  fi
  have 'import detectron2.modeling.backbone.vit, detectron2.model_zoo'
  echo "$installed" > "$("$PY" -c 'import detectron2, os; print(os.path.dirname(detectron2.__file__))')/.srvit_source"
  echo "[setup] detectron2 installed from: $installed"
fi

step "mmcv $MMCV_VERSION with compiled ops"
if present mmcv; then
  echo "[setup] mmcv $MMCV_VERSION with ops already present"
else
  # The wheel is keyed by the torch it was built against so that a cache from another
  # torch is never reused.
  TORCH_TAG="$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
  MMCV_DIR="$WHEELS/mmcv-$MMCV_VERSION-torch$TORCH_TAG"
  if ! ls "$MMCV_DIR"/mmcv-*.whl >/dev/null 2>&1; then
    echo "[setup] compiling mmcv $MMCV_VERSION (once per machine, ~11 min on 2 cores); wheel -> $MMCV_DIR"
    mkdir -p "$MMCV_DIR.partial"
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" FORCE_CUDA=0 \
      CC="$REPO/tools/cxx20.sh" CXX="$REPO/tools/cxx20.sh" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -c "$CONSTRAINTS" \
        -w "$MMCV_DIR.partial" "mmcv==$MMCV_VERSION"
    rm -rf "$MMCV_DIR" && mv "$MMCV_DIR.partial" "$MMCV_DIR"
  else
    echo "[setup] reusing the cached wheel in $MMCV_DIR"
  fi
  "${PIP[@]}" install --no-deps "$MMCV_DIR"/mmcv-*.whl
  have 'import mmcv.ops' || { "$PY" -c 'import mmcv.ops'; false; }
fi

step "mmsegmentation 1.2.2 and mmdet 3.3.0"
if present mmseg; then
  echo "[setup] mmsegmentation and mmdet already present"
else
  "${PIP[@]}" install -c "$CONSTRAINTS" "${TORCH_PINS[@]}" mmsegmentation==1.2.2 mmdet==3.3.0
fi

step "srvit_backbones (editable)"
if present srvit; then
  echo "[setup] srvit_backbones already installed from $REPO"
else
  "${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO"
fi

step "check"
"$PY" -m srvit_backbones.collect_env
echo "[setup] done in $(elapsed). Activate with: source ${VENV:-<your env>}/bin/activate"
