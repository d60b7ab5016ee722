#!/usr/bin/env bash
# Run test files against the native extension built with AddressSanitizer, in a worktree of HEAD (the checkout and
# its extension stay as they are). For a crash the suite cannot reproduce on demand: an out-of-bounds access or a
# use of freed memory in native/ is reported where it happens, not where a later victim segfaults.
#   bash scripts/asan_tests.sh tests/test_conv.py tests/test_import.py      (default: the native kernel tests)
# Reports go to $ASAN_LOG_DIR (default /tmp/inferd-asan/log.PID). Expected reports: the crash-report tests (a child
# that reads address 0 on purpose) and the ThreadSanitizer harness (it cannot run under ASan). Builds in ~5 min.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WT=${ASAN_WORKTREE:-/tmp/inferd-asan/tree}
LOGS=${ASAN_LOG_DIR:-/tmp/inferd-asan}
PY="$ROOT/.venv/bin/python"
mkdir -p "$LOGS"
if [ ! -d "$WT" ] || [ "$(git -C "$WT" rev-parse HEAD 2>/dev/null)" != "$(git rev-parse HEAD)" ]; then
  git worktree remove --force "$WT" 2>/dev/null || true
  git worktree add -f --detach "$WT" HEAD >/dev/null
  sed -i 's/extra_compile_args=\["-O3"/extra_link_args=["-fsanitize=address"], extra_compile_args=["-fsanitize=address", "-fno-omit-frame-pointer", "-g", "-O3"/' \
    "$WT/native/build_native.py"
  (cd "$WT" && "$PY" setup.py -q build_ext --inplace >"$LOGS/build.log" 2>&1) || { tail -20 "$LOGS/build.log"; exit 1; }
fi
PKG="$LOGS/pkg"
mkdir -p "$PKG"
ln -sfn "$WT/daemon" "$PKG/inferd"
ln -sfn "$WT/client" "$PKG/inferd_client"
# libstdc++ after libasan: ASan's __cxa_throw interceptor needs the real one loaded (onnx's C++ throws)
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so.6)"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:log_path=$LOGS/log"
export PYTHONPATH="$PKG"
cd "$WT"
[ $# -gt 0 ] || set -- tests/test_conv.py tests/test_native_gemm.py tests/test_nchwc.py tests/test_ops_native_hot.py
rc=0
"$PY" -m pytest -q -n 2 -p no:cacheprovider -k "not threadsanitizer" "$@" || rc=$?
ls "$LOGS"/log.* 2>/dev/null && echo "ASan reports above (in $LOGS)" || echo "no ASan report"
exit $rc
