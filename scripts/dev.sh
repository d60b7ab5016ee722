#!/usr/bin/env bash
# One entry point for a fresh Debian/Ubuntu machine (as root, or a user with sudo):
#   bash scripts/dev.sh serve   install what is needed, then start the daemon on the bundled zoo models
#   bash scripts/dev.sh test    install what is needed, then run the test suite
# Everything Python goes into ./.venv (PEP 668 systems refuse system-wide pip installs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${INFERD_VENV:-$ROOT/.venv}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

APT_PKGS=(python3 python3-venv python3-dev gcc pkg-config libsystemd-dev mesa-vulkan-drivers libvulkan1
          vulkan-tools glslang-tools vulkan-validationlayers systemd)

# The test suite also checks the native C on the other architecture (cross compiler + qemu user mode).
if [ "$(uname -m)" = "x86_64" ]; then
  TEST_APT_PKGS=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
else
  TEST_APT_PKGS=()
fi

install_system() {
  local missing=()
  for p in "${APT_PKGS[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[dev] installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

install_python() {
  local py=${PYTHON:-python3}
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[dev] creating $VENV"
    "$py" -m venv --system-site-packages "$VENV"
  fi
  local stamp="$VENV/.inferd-installed"
  local want
  want=$(cat pyproject.toml setup.py native/*.c native/*.h native/*.py | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[dev] installing inferd and its Python dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel cffi >/dev/null
    "$VENV/bin/python" -m pip install -q --no-build-isolation -e ".[test]"
    install_corpus
    install_exporters
    echo "$want" > "$stamp"
  fi
}

# The export corpus (tests/test_export_corpus.py) needs torch; only a CPU build is installed here (a CUDA build
# brings several GB of CUDA packages): one already in the venv, or one pip resolves torch==2.13.0 to (a local
# CPU wheel). Otherwise the corpus tests skip. INFERD_TEST_CORPUS=0 leaves it out (and the exporters below).
install_corpus() {
  [ "${INFERD_TEST_CORPUS:-1}" = 1 ] || return 0
  local py="$VENV/bin/python"
  if ! "$py" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" 2>/dev/null; then
    "$py" -m pip install -q --dry-run --no-deps --report - "torch==2.13.0" 2>/dev/null \
      | grep -q '"version": "2.13.0+cpu"' || { echo "[dev] no CPU build of torch 2.13.0 found: the export corpus tests will skip (README, Tests)"; return 0; }
  fi
  echo "[dev] installing the export corpus's test dependencies (torch CPU, torchvision, timm, onnxscript)"
  "$py" -m pip install -q "torch==2.13.0"
  # torchvision's wheel is a CUDA build: --no-deps keeps pip from replacing torch; its model definitions are
  # pure Python (tests/export_corpus.py registers the few compiled ops the corpus needs when _C cannot load)
  "$py" -m pip install -q --no-deps "torchvision==0.28.0" "timm>=1.0"
  "$py" -m pip install -q "onnxscript>=0.5" pillow pyyaml huggingface_hub safetensors
}

# The corpus's TensorFlow and Paddle models (the `exporters` extra): tensorflow-cpu + tf2onnx, paddlepaddle +
# paddle2onnx. About 2 GB installed, 1 to 2.5 min to install and 3 min for the first exports on a 2-core machine
# (README, Tests). INFERD_TEST_EXPORTERS=0 leaves them out; each family that pip cannot install here (no wheel
# for this Python or architecture) is left out with a message and its tests skip.
install_exporters() {
  [ "${INFERD_TEST_CORPUS:-1}" = 1 ] && [ "${INFERD_TEST_EXPORTERS:-1}" = 1 ] || return 0
  local py="$VENV/bin/python"
  echo "[dev] installing the export corpus's TensorFlow and Paddle exporters (tensorflow-cpu, tf2onnx, paddlepaddle, paddle2onnx)"
  "$py" -m pip install -q "tensorflow-cpu==2.21.0" "tf2onnx==1.17.0" \
    || echo "[dev] tensorflow-cpu/tf2onnx did not install here: the Keras exports of the corpus will skip"
  # paddle2onnx 2.1 pins onnx<=1.17 for its optional onnxoptimizer pass; its converter is compiled in and works
  # with the onnx this venv has, so it goes in without deps, with what its default constant folding (polygraphy)
  # imports named here: paddle2onnx turns on polygraphy's auto-install, which pip-installs missing modules
  # during an export otherwise
  { "$py" -m pip install -q "paddlepaddle==3.3.1" \
      && "$py" -m pip install -q --no-deps "paddle2onnx==2.1.0" "polygraphy>=0.49" "onnx_graphsurgeon>=0.5" \
      && "$py" -m pip install -q sympy; } \
    || echo "[dev] paddlepaddle/paddle2onnx did not install here: the Paddle exports of the corpus will skip"
}

cmd=${1:-}
shift || true
case "$cmd" in
  serve)
    install_system; install_python
    exec "$VENV/bin/inferd" demo "$@"
    ;;
  test)
    install_system "${TEST_APT_PKGS[@]}"; install_python
    # one pytest-xdist worker per core, at most 4 (INFERD_TEST_JOBS to choose; 1: in this process): on 2 cores
    # the suite took 24 min in one process and 10 with two workers, whose tests wait on children, compilers
    # and daemons a good part of their time
    jobs=${INFERD_TEST_JOBS:-$(nproc)}
    [ "$jobs" -le 4 ] || jobs=4
    [ "$jobs" -gt 1 ] || jobs=0
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "$jobs" "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh serve|test [args]" >&2
    exit 2
    ;;
esac
