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
    echo "$want" > "$stamp"
  fi
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
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
    ;;
  *)
    echo "usage: bash scripts/dev.sh serve|test [args]" >&2
    exit 2
    ;;
esac
