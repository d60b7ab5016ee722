"""Typed access to the native (cffi) kernels in ``inferd._native``, with numpy fallbacks.

Every helper takes numpy arrays, checks what the C side assumes (float32, C-contiguous where the C
code walks memory linearly) and either calls C or, when the extension is missing or stale (its
ABI number differs from :data:`ABI`), a numpy implementation with the same contract. The
``numpy_*`` functions are public so tests can compare the two paths.

cffi releases the GIL around C calls; the C entry points split their work over inferd's native thread
pool (native/pool.c) themselves.
"""
from __future__ import annotations

import logging
import math
import os
import platform
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from .fileio import VECTOR_ALIGN, empty_aligned  # noqa: F401 - the kernels' name for it

log = logging.getLogger(__name__)

#: The ABI number this module was written for (``inferd_native_abi()`` in native/version.c).
ABI = 22

ffi: Any = None
lib: Any = None
AVAILABLE = False
try:
    from . import _native  # type: ignore[attr-defined]

    if _native.lib.inferd_native_abi() != ABI:
        raise ImportError(f"inferd._native has ABI {_native.lib.inferd_native_abi()}, expected {ABI} "
                          f"(rebuild with `pip install -e . --no-build-isolation`)")
    ffi, lib = _native.ffi, _native.lib
    AVAILABLE = True
except Exception as exc:  # ImportError, or a broken build
    log.warning("native kernels unavailable, using numpy fallbacks (slower): %s", exc)

#: ``INFERD_INT8_KERNELS``: "best" (default), "avx2" (on an x86 CPU with AVX-512 VNNI, the kernels a CPU without it
#: runs) or "portable" (the C without SIMD intrinsics): what a board without the fast kernels would run, measured
#: or checked here. Read once at import, before any model packs its weights for a kernel.
INT8_KERNELS = ("best", "avx2", "portable")


def _apply_int8_kernels(value: str) -> str:
    choice = value.strip().lower() or "best"
    if choice not in INT8_KERNELS:
        log.warning("INFERD_INT8_KERNELS=%r is not one of %s; the best kernels run", value, list(INT8_KERNELS))
        return "best"
    if AVAILABLE and choice != "best":
        lib.inferd_q8_cap_avx512(1 if choice == "avx2" else -1)
        lib.inferd_q8_set_isa(0 if choice == "portable" else -1)
    return choice


int8_kernels = _apply_int8_kernels(os.environ.get("INFERD_INT8_KERNELS", ""))

F32 = np.float32
Act = tuple[str, tuple[float, ...]]

#: Fused activations the C kernels apply themselves, by name -> C code (see native/inferd_native.h).
NATIVE_ACTS = {"Relu": 1, "Clip": 2, "LeakyRelu": 3, "Sigmoid": 4, "SiLU": 5, "HardSwish": 6, "HardSigmoid": 7,
               "Gelu": 8}
#: Gelu's tanh approximation (its parameter 1.0) has a code of its own: one polynomial per loop, not both
GELU_TANH_CODE = 9


def native_act(act: Act | None) -> tuple[int, float, float] | None:
    """(C code, p0, p1) of a fused activation (0 for none), or None when the C kernels do not implement it."""
    if act is not None and act[0] not in NATIVE_ACTS:
        return None
    return _act_code(act)


def _act_code(act: Act | None) -> tuple[int, float, float]:
    if act is None:
        return 0, 0.0, 0.0
    if act[0] not in NATIVE_ACTS:
        raise ValueError(f"activation {act[0]} is not native (native: {sorted(NATIVE_ACTS)})")
    p = tuple(act[1])
    p0, p1 = float(p[0]) if len(p) > 0 else 0.0, float(p[1]) if len(p) > 1 else 0.0
    if act[0] == "Gelu":
        return (GELU_TANH_CODE if p0 == 1.0 else NATIVE_ACTS["Gelu"]), 0.0, 0.0
    return NATIVE_ACTS[act[0]], p0, p1


# --------------------------------------------------------------------------- threads

def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (taskset, cgroups)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# inferd owns the cores: the C kernels split their work over one native pool (native/pool.c) whose workers
# spin briefly between layers. OpenBLAS' workers spin too (for much longer), so two pools on the same cores
# fight: measured on 2 vCPUs, a 2-thread native GEMM took 1.7x longer while OpenBLAS' idle worker spun.
# So once an executor runs, numpy's BLAS is held to one thread (the heavy GEMMs are ours; what is left on
# numpy is small), see claim_cores().
_threads = max(1, min(int(os.environ.get("INFERD_NUM_THREADS", "0") or 0) or _usable_cores(), 64))
_blas_limited = False
_blas_lock = threading.Lock()


def num_threads() -> int:
    """Threads of the native pool, the calling thread included (env ``INFERD_NUM_THREADS``, default: the
    usable cores)."""
    return _threads


def set_num_threads(n: int) -> None:
    """Resize the native pool (the calling thread counts as one)."""
    global _threads
    _threads = max(1, min(int(n), 64))
    if AVAILABLE:
        lib.inferd_pool_set_threads(_threads)


def set_caller_threads(n: int) -> None:
    """Cap the native pool's jobs that the calling thread submits at ``n`` threads (0: no cap). Per thread: another
    thread's jobs keep the whole pool. OpenBLAS (numpy's matmul) is not capped."""
    if AVAILABLE:
        lib.inferd_pool_set_caller_cap(max(0, int(n)))


def caller_threads() -> int:
    """The calling thread's cap (``set_caller_threads``; 0: none)."""
    return int(lib.inferd_pool_caller_cap()) if AVAILABLE else 0


#: OpenBLAS' thread-count setters, by the symbol prefixes of the builds numpy wheels bundle (scipy-openblas for
#: numpy 2, openblas64_ before it) and of a plain OpenBLAS
_OPENBLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads")


def _limit_bundled_openblas() -> bool:
    """Set the OpenBLAS bundled with numpy's wheel (``numpy.libs``, already loaded; scipy's too where scipy is
    imported) to one thread by a direct call: well under a millisecond, where threadpoolctl scans every loaded
    library (5-18 ms). False where numpy has no such library (a distribution's numpy on a system BLAS), for
    threadpoolctl to do it."""
    import ctypes
    import glob
    import sys

    done = False
    dirs = [os.path.dirname(sys.modules[m].__file__) + ".libs" for m in ("numpy", "scipy")
            if getattr(sys.modules.get(m), "__file__", None)]
    found = [path for d in dirs for path in glob.glob(os.path.join(d, "*openblas*.so*"))]
    for path in found:
        try:
            blas = ctypes.CDLL(path)  # numpy has it loaded: this is its handle, not a second copy
        except OSError:
            continue
        for sym in _OPENBLAS_SETTERS:
            fn = getattr(blas, sym, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                fn(1)
                done = done or "numpy.libs" in path
                break
    return done


def install_crash_report(fd: int | None = None) -> bool:
    """On a fatal signal, write the faulting thread's native frames to stderr (or file descriptor ``fd``) before
    the handler already there (faulthandler's Python frames, or the default action): a crash inside a kernel
    otherwise shows only as the Python line that called it (native/crash.c). The daemon and the test suite install
    it. False where the extension has no such entry point (an older build) or no signal could be taken."""
    if not has("inferd_install_crash_report"):
        return False
    if fd is not None and has("inferd_crash_report_fd"):
        lib.inferd_crash_report_fd(int(fd))
    return bool(lib.inferd_install_crash_report())


def claim_cores(slow_ok: bool = True) -> None:
    """Hold numpy's BLAS to one thread while the native pool uses several (once per process; best effort).
    Called when a CPU executor is built, not at import, so merely importing inferd leaves the host application's
    numpy alone. The bundled OpenBLAS is set directly (cheap enough for a cold load's path); otherwise
    threadpoolctl, which a cold load leaves to idle time after its answer (``slow_ok=False``: return without).

    Why before the first run: OpenBLAS' idle worker spins ~100 ms after each multi-threaded call, and the cold
    load's weight transforms make such calls: the first 20 runs of shufflenetv2 after a load took 5 ms instead
    of 2.6 ms on 2 vCPUs, one core spinning in OpenBLAS."""
    global _blas_limited
    if _blas_limited or _threads <= 1 or not AVAILABLE:
        return
    with _blas_lock:
        if _blas_limited:
            return
        try:
            if _limit_bundled_openblas():
                _blas_limited = True
                return
        except Exception as exc:  # an unexpected library layout: threadpoolctl below
            log.debug("could not set numpy's OpenBLAS threads directly: %s", exc)
        if not slow_ok:
            return
        _blas_limited = True
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(1, user_api="blas")
        except Exception as exc:  # threadpoolctl missing or a BLAS it does not know
            log.debug("could not limit BLAS threads: %s", exc)


if AVAILABLE:
    lib.inferd_pool_set_threads(_threads)


# --------------------------------------------------------------------------- pointers


def _check(a: np.ndarray, name: str, contiguous: bool = True) -> None:
    if a.dtype != F32:
        raise TypeError(f"{name}: expected float32, got {a.dtype}")
    if contiguous and not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")


def has(fn: str) -> bool:
    """Whether the loaded extension has C entry point ``fn`` (a kernel whose symbol is missing falls back)."""
    return AVAILABLE and hasattr(lib, fn)


def _ptr(a: np.ndarray) -> Any:
    """float* to a contiguous array (read-only arrays too: the C side does not write through const args)."""
    return ffi.cast("float *", ffi.from_buffer(a, require_writable=False))


def _rawptr(a: np.ndarray) -> Any:
    """float* to the first element of any (strided) array view."""
    return ffi.cast("float *", a.__array_interface__["data"][0])


def _vptr(a: np.ndarray) -> Any:
    """void* to the first element of any array view (the int8 kernels take 8-bit tensors of either sign)."""
    return ffi.cast("void *", a.__array_interface__["data"][0])


def _opt(a: np.ndarray | None) -> Any:
    return ffi.NULL if a is None else _ptr(a)


# --------------------------------------------------------------------------- im2col / col2im


def numpy_im2col(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int,
                 oh: int, ow: int, out: np.ndarray) -> np.ndarray:
    c, h, w = x.shape
    pb = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pl)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr)))
    o = out.reshape(c, kh, kw, oh, ow)
    for i in range(kh):
        for j in range(kw):
            o[:, i, j] = xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw]
    return out


def im2col(x: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int,
           oh: int, ow: int, out: np.ndarray) -> np.ndarray:
    """Columns of one image ``x`` (C, H, W) into ``out`` (C*kh*kw, oh*ow), zeros where the taps fall in padding."""
    c, h, w = x.shape
    if out.shape != (c * kh * kw, oh * ow):
        raise ValueError(f"im2col: out shape {out.shape}, expected {(c * kh * kw, oh * ow)}")
    if not AVAILABLE:
        return numpy_im2col(x, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out)
    _check(x, "x")
    _check(out, "out")
    lib.inferd_im2col(_ptr(x), c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, _ptr(out))
    return out


def numpy_col2im(col: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int,
                 oh: int, ow: int, out: np.ndarray) -> np.ndarray:
    c, h, w = out.shape
    hp = max(h + pt, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl, (ow - 1) * sw + (kw - 1) * dw + 1)
    acc = np.zeros((c, hp, wp), F32)
    cv = col.reshape(c, kh, kw, oh, ow)
    for i in range(kh):
        for j in range(kw):
            acc[:, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw] += cv[:, i, j]
    out += acc[:, pt: pt + h, pl: pl + w]
    return out


def col2im(col: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int,
           oh: int, ow: int, out: np.ndarray) -> np.ndarray:
    """Scatter-add ``col`` (C*kh*kw, oh*ow) into ``out`` (C, H, W): the adjoint of :func:`im2col`.

    ``out`` is accumulated into (initialise it with zeros or the bias)."""
    c, h, w = out.shape
    if col.shape != (c * kh * kw, oh * ow):
        raise ValueError(f"col2im: col shape {col.shape}, expected {(c * kh * kw, oh * ow)}")
    if not AVAILABLE:
        return numpy_col2im(col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out)
    _check(col, "col")
    _check(out, "out")
    lib.inferd_col2im(_ptr(col), c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, _ptr(out))
    return out


def col2im_init(col: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int,
                oh: int, ow: int, out: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """:func:`col2im` into ``out`` first set to ``bias`` per channel (zero without one), in the same parallel pass."""
    c, h, w = out.shape
    if col.shape != (c * kh * kw, oh * ow):
        raise ValueError(f"col2im: col shape {col.shape}, expected {(c * kh * kw, oh * ow)}")
    if bias is not None and bias.shape != (c,):
        raise ValueError(f"col2im: bias shape {bias.shape}, expected {(c,)}")
    if not AVAILABLE:
        out[...] = 0.0 if bias is None else bias.reshape(c, 1, 1)
        return numpy_col2im(col, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, out)
    _check(col, "col")
    _check(out, "out")
    if bias is not None:
        _check(bias, "bias")
    lib.inferd_col2im_ex(_ptr(col), c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, _ptr(out), _opt(bias), 1)
    return out


# --------------------------------------------------------------------------- depthwise


def numpy_dwconv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, out: np.ndarray, sh: int, sw: int,
                   dh: int, dw: int, pt: int, pl: int, act: Act | None = None) -> np.ndarray:
    c, h, wd = x.shape
    cm, kh, kw = w.shape
    mult = cm // c
    _, oh, ow = out.shape
    pb = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
    pr = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - wd - pl)
    xp = np.repeat(np.pad(x, ((0, 0), (pt, pb), (pl, pr))), mult, axis=0)
    out[...] = 0 if bias is None else bias.reshape(-1, 1, 1)
    for i in range(kh):
        for j in range(kw):
            out += w[:, i, j, None, None] * xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                                               j * dw: j * dw + (ow - 1) * sw + 1: sw]
    if act is not None:
        numpy_bias_act(out, None, None, act)
    return out


def dwconv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, out: np.ndarray, sh: int, sw: int,
             dh: int, dw: int, pt: int, pl: int, act: Act | None = None) -> np.ndarray:
    """Depthwise conv of one image: ``x`` (C, H, W), ``w`` (C*mult, kh, kw), ``out`` (C*mult, OH, OW) overwritten.

    Output channel ``c*mult + k`` reads input channel ``c``; ``bias`` (C*mult) is added if given, then ``act``
    (one of :data:`NATIVE_ACTS`, or None) in the same pass."""
    code, p0, p1 = _act_code(act)
    c, h, wd = x.shape
    cm, kh, kw = w.shape
    if cm % c or out.shape[0] != cm:
        raise ValueError(f"dwconv2d: {c} input channels, weights {w.shape}, out {out.shape}")
    if not AVAILABLE:
        return numpy_dwconv2d(x, w, bias, out, sh, sw, dh, dw, pt, pl, act)
    for a, n in ((x, "x"), (w, "w"), (out, "out")):
        _check(a, n)
    if bias is not None:
        _check(bias, "bias")
    mult = cm // c
    _, oh, ow = out.shape

    if lib.inferd_dwconv2d(_ptr(x), _ptr(w),
                           ffi.NULL if bias is None else _ptr(bias),
                           _ptr(out), c, mult, h, wd, kh, kw, sh, sw, dh, dw, pt, pl,
                           oh, ow, code, p0, p1) != 0:
        raise MemoryError("dwconv2d: out of memory")
    return out


# --------------------------------------------------------------------------- winograd


def numpy_winograd_input(x: np.ndarray, pt: int, pl: int, th: int, tw: int, m: int, bt: np.ndarray,
                         v: np.ndarray, p0: int) -> np.ndarray:
    c, h, w = x.shape
    alpha = bt.shape[0]
    hp, wp = th * m + alpha - m, tw * m + alpha - m
    xp = np.zeros((c, hp, wp), F32)
    src = x[:, max(0, -pt): max(0, min(h, hp - pt)), max(0, -pl): max(0, min(w, wp - pl))]
    xp[:, max(0, pt): max(0, pt) + src.shape[1], max(0, pl): max(0, pl) + src.shape[2]] = src
    s = xp.strides
    tiles = np.lib.stride_tricks.as_strided(xp, (c, th, tw, alpha, alpha), (s[0], m * s[1], m * s[2], s[1], s[2]))
    vt = np.einsum("ar,ctwrq,bq->abctw", bt, tiles, bt, optimize=True).astype(F32)
    v.reshape(alpha, alpha, c, -1)[:, :, :, p0: p0 + th * tw] = vt.reshape(alpha, alpha, c, th * tw)
    return v


def winograd_input(x: np.ndarray, pt: int, pl: int, th: int, tw: int, m: int, bt: np.ndarray, v: np.ndarray,
                   p0: int = 0) -> np.ndarray:
    """Winograd input transform of one image ``x`` (C, H, W) into ``v`` (alpha*alpha, C, P) at tiles p0..p0+th*tw.

    ``v`` may be a strided view as long as its last axis is contiguous (rows of tiles are written at once)."""
    c, h, w = x.shape
    alpha = bt.shape[0]
    if v.shape[:2] != (alpha * alpha, c) or v.shape[2] < p0 + th * tw:
        raise ValueError(f"winograd_input: v shape {v.shape} for alpha {alpha}, {c} channels, {th * tw} tiles")
    if not AVAILABLE:
        return numpy_winograd_input(x, pt, pl, th, tw, m, bt, v, p0)
    _check(x, "x")
    _check(bt, "bt")
    _check(v, "v", contiguous=False)
    if v.strides[2] != 4:
        raise ValueError("winograd_input: v's last axis must be contiguous")
    ldpos, ldc = v.strides[0] // 4, v.strides[1] // 4

    if lib.inferd_winograd_input(_ptr(x), c, h, w, pt, pl, th, tw, m, alpha, _ptr(bt),
                                 _rawptr(v), ldpos, ldc, p0) != 0:
        raise MemoryError("winograd_input: out of memory")
    return v


def numpy_winograd_output(mw: np.ndarray, th: int, tw: int, m: int, at: np.ndarray, bias: np.ndarray | None,
                          out: np.ndarray, p0: int, res: np.ndarray | None = None,
                          act: Act | None = None) -> np.ndarray:
    cout, oh, ow = out.shape
    alpha = at.shape[1]
    mt = mw[:, :, p0: p0 + th * tw].reshape(alpha, alpha, cout, th, tw)
    y = np.einsum("ia,abctw,jb->ctiwj", at, mt, at, optimize=True).reshape(cout, th * m, tw * m)
    out[...] = y[:, :oh, :ow]
    if bias is not None:
        out += bias.reshape(-1, 1, 1)
    if res is not None or act is not None:
        numpy_bias_act(out, None, res, act)
    return out


def winograd_output(mw: np.ndarray, th: int, tw: int, m: int, at: np.ndarray, bias: np.ndarray | None,
                    out: np.ndarray, p0: int = 0, res: np.ndarray | None = None,
                    act: Act | None = None) -> np.ndarray:
    """Winograd output transform of ``mw`` (alpha*alpha, Cout, P) at tiles p0.. into ``out`` (Cout, OH, OW) + bias,
    then + ``res`` (out's shape, contiguous) and the native activation ``act``, fused per channel."""
    cout, oh, ow = out.shape
    alpha = at.shape[1]
    if mw.shape[:2] != (alpha * alpha, cout) or mw.shape[2] < p0 + th * tw:
        raise ValueError(f"winograd_output: m shape {mw.shape} for alpha {alpha}, {cout} channels, {th * tw} tiles")
    if res is not None and res.shape != out.shape:
        raise ValueError(f"winograd_output: residual shape {res.shape}, expected {out.shape}")
    code, a0, a1 = _act_code(act)  # raises for an activation the C epilogue does not know
    if not AVAILABLE:
        return numpy_winograd_output(mw, th, tw, m, at, bias, out, p0, res, act)
    _check(mw, "m", contiguous=False)
    _check(at, "at")
    _check(out, "out")
    if bias is not None:
        _check(bias, "bias")
    if mw.strides[2] != 4:
        raise ValueError("winograd_output: m's last axis must be contiguous")
    ldpos, ldc = mw.strides[0] // 4, mw.strides[1] // 4

    if res is not None:
        _check(res, "res")
    if lib.inferd_winograd_output_ex(_rawptr(mw), cout, oh, ow, th, tw, m, alpha, _ptr(at),
                                     ffi.NULL if bias is None else _ptr(bias), _ptr(out),
                                     ldpos, ldc, p0, _opt(res), code, a0, a1) != 0:
        raise MemoryError("winograd_output: out of memory")
    return out


# --------------------------------------------------------------------------- epilogue

def numpy_bias_act(y: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None, act: Act | None) -> np.ndarray:
    c = y.shape[0]
    y2 = y.reshape(c, -1)
    if bias is not None:
        y2 += bias.reshape(c, 1)
    if res is not None:
        y2 += res.reshape(c, -1)
    if act is not None:
        name, p = act
        if name == "Relu":
            np.maximum(y2, 0, out=y2)
        elif name == "Clip":
            np.clip(y2, F32(p[0]), F32(p[1]), out=y2)
        elif name == "LeakyRelu":
            np.multiply(y2, np.where(y2 < 0, F32(p[0]), F32(1)), out=y2)
        elif name in ("Sigmoid", "SiLU"):
            with np.errstate(over="ignore"):
                s = 1 / (1 + np.exp(-y2))
            np.multiply(y2, s, out=y2) if name == "SiLU" else np.copyto(y2, s)
        elif name == "HardSwish":
            np.multiply(y2, np.clip(y2 * F32(1 / 6) + F32(0.5), 0, 1), out=y2)
        elif name == "HardSigmoid":
            np.clip(y2 * F32(p[0]) + F32(p[1]), 0, 1, out=y2)
        elif name == "Gelu":
            y2[...] = numpy_gelu(y2, bool(p and p[0] == 1.0))
        else:
            raise ValueError(f"bias_act: activation {name} is not native")
    return y


def _rows(a: np.ndarray, name: str) -> np.ndarray:
    """``a`` as (C, n) rows without copying: contiguous arrays of any rank, or 2-D views with unit-stride rows."""
    if a.ndim == 2:
        a2 = a
    elif a.flags.c_contiguous:
        a2 = a.reshape(a.shape[0], -1)
    else:
        raise ValueError(f"{name}: needs a contiguous array or a 2-D view (got shape {a.shape}, strides {a.strides})")
    if a2.shape[1] > 1 and a2.strides[1] != 4:
        raise ValueError(f"{name}: rows must be contiguous (strides {a2.strides})")
    return a2


def bias_act(y: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None, act: Act | None) -> np.ndarray:
    """In place: ``y = act(y + bias[c] + res)`` with ``c`` the first axis of ``y``.

    ``y`` (and ``res``, same shape) is contiguous, or a 2-D (C, n) view whose rows are contiguous (a column block
    of a bigger matrix); ``act`` is one of :data:`NATIVE_ACTS` or None."""
    code, p0, p1 = _act_code(act)
    if not AVAILABLE:
        return numpy_bias_act(y, bias, res, act)
    if y.dtype != F32:
        raise TypeError(f"y: expected float32, got {y.dtype}")
    y2 = _rows(y, "y")
    c, hw = y2.shape
    r2 = None
    if res is not None:
        _check(res, "res", contiguous=False)
        if res.shape != y.shape:
            raise ValueError(f"bias_act: residual shape {res.shape} != {y.shape}")
        r2 = _rows(res, "res")
    if bias is not None:
        _check(bias, "bias")
    ldy = y2.strides[0] // 4
    ldr = 0 if r2 is None else r2.strides[0] // 4

    lib.inferd_bias_act(_rawptr(y2), ldy, ffi.NULL if bias is None else _ptr(bias),
                        ffi.NULL if r2 is None else _rawptr(r2), ldr, c, hw, code, p0, p1)
    return y


def act_bound(y: np.ndarray, act: Act) -> Callable[[], None] | None:
    """:func:`bias_act` without bias or residual resolved now into one C call on a contiguous float32 ``y`` (as
    rows the pool can split), or None where it does not fit. Checking and casting per call cost ~3 us, as much
    as the pass itself on a small map."""
    if not AVAILABLE or act is None or act[0] not in NATIVE_ACTS or y.dtype != F32 or not y.flags.c_contiguous \
            or not y.flags.writeable or y.size == 0:
        return None
    code, p0, p1 = _act_code(act)
    rows = next(r for r in (64, 16, 4, 1) if y.size % r == 0)
    fn, args = lib.inferd_bias_act, (_rawptr(y), y.size // rows, ffi.NULL, ffi.NULL, 0, rows, y.size // rows, code,
                                     p0, p1)

    def call(_keep: np.ndarray = y) -> None:
        fn(*args)

    return with_steps(call, [("inferd_bias_act", args)])


def fast_path() -> bool:
    """Whether the ``*_direct`` helpers may be used: native kernels present (they skip the argument checks,
    which cost tens of microseconds per small layer; the C side still uses the native pool)."""
    return AVAILABLE


# --------------------------------------------------------------------------- erf / GELU

def numpy_erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    try:
        from scipy.special import erf as scipy_erf  # type: ignore
    except Exception:  # pragma: no cover - scipy is optional
        import math

        r = np.vectorize(math.erf, otypes=[x.dtype])(x)
        if out is None:
            return r
        np.copyto(out, r)
        return out
    if out is None:
        return scipy_erf(x).astype(x.dtype, copy=False)
    return scipy_erf(x, out=out)


def numpy_gelu(x: np.ndarray, approximate: bool) -> np.ndarray:
    import math

    if approximate:
        t = np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x))
    else:
        t = numpy_erf(x * np.float32(1 / math.sqrt(2)))
    np.multiply(x, np.float32(0.5) * (1 + t), out=x)
    return x


def _native_1d(a: np.ndarray) -> bool:
    return AVAILABLE and a.dtype == F32 and a.flags.c_contiguous


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``erf(x)`` into ``out`` (or a new array). Native for contiguous float32 (``out`` may be ``x``; max abs
    error ~1e-7), numpy/scipy otherwise."""
    if out is None:
        if not _native_1d(x):
            return numpy_erf(x)
        out = np.empty_like(x)
    if not (_native_1d(x) and _native_1d(out) and out.shape == x.shape and out.flags.writeable):
        return numpy_erf(x, out)
    same = x.__array_interface__["data"][0] == out.__array_interface__["data"][0]
    if not same and np.may_share_memory(x, out):  # partial overlap: the C loop assumes none
        np.copyto(out, numpy_erf(x))
        return out
    xf, of = x.reshape(-1), out.reshape(-1)
    n = xf.size

    if n:  # the C side splits it over the native pool
        lib.inferd_erf(_ptr(xf), _rawptr(of), n)
    return out


def gelu_(x: np.ndarray, approximate: bool = False) -> np.ndarray:
    """GELU of ``x`` in place: ``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate`` the tanh form.
    Native for contiguous float32 (GELU(-inf) = -0 there, NaN from the numpy path), numpy otherwise."""
    if not (_native_1d(x) and x.flags.writeable):
        return numpy_gelu(x, approximate)
    xf = x.reshape(-1)
    n = xf.size
    flag = 1 if approximate else 0

    if n:  # the C side splits it over the native pool
        lib.inferd_gelu(_rawptr(xf), n, flag)
    return x


# --------------------------------------------------------------------------- packed GEMM (native/gemm.c)

#: Rows per packed A panel (fixed across ISAs, so packed weights in a compiled package are portable).
GEMM_MR = 8


def gemm_packed_shape(m: int, k: int) -> tuple[int, int, int]:
    """Shape of a packed A (M x K): (panels, K, 8), rows past M zero."""
    return (-(-m // GEMM_MR), k, GEMM_MR)


def numpy_gemm_pack_a(a: np.ndarray) -> np.ndarray:
    m, k = a.shape
    p = np.zeros(gemm_packed_shape(m, k), F32)
    full = np.zeros((p.shape[0] * GEMM_MR, k), F32)
    full[:m] = a
    p[...] = full.reshape(p.shape[0], GEMM_MR, k).transpose(0, 2, 1)
    return p


def gemm_pack_a(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Pack a weight matrix A (M x K, any strides, cast to float32) for :func:`gemm` (into ``out`` if given:
    a C-contiguous float32 array of :func:`gemm_packed_shape`)."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise ValueError(f"gemm_pack_a: expected a 2-D matrix, got shape {a.shape}")
    m, k = a.shape
    if out is None:
        out = empty_aligned(gemm_packed_shape(m, k), F32)
    if not AVAILABLE:
        out[...] = numpy_gemm_pack_a(a.astype(F32, copy=False))
        return out
    _pack_into(lib.inferd_gemm_pack_a, a, out)
    return out


def _pack_into(pack: Any, a: np.ndarray, out: np.ndarray) -> None:
    """Call a C packer ``pack(src, stride0, stride1, dim0, dim1, dst)`` on a 2-D ``a``: float32 views are read
    in place through their strides, anything else through a contiguous float32 copy."""
    r, c = a.shape
    if a.dtype == F32 and a.size:
        s = _strides_of(a)
        pack(_rawptr(a), s[0], s[1], r, c, _ptr(out))
    else:
        ac = np.ascontiguousarray(a, dtype=F32)
        pack(_ptr(ac), c, 1, r, c, _ptr(out))


def gemm_unpack_a(ap: np.ndarray, m: int) -> np.ndarray:
    """The M x K matrix a packed A holds (tests, numpy fallback)."""
    return ap.transpose(0, 2, 1).reshape(ap.shape[0] * ap.shape[2], ap.shape[1])[:m]


def _strides_of(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def gemm(ap: np.ndarray, m: int, b: np.ndarray, c: np.ndarray, bias: np.ndarray | None = None,
         res: np.ndarray | None = None, act: Act | None = None, max_threads: int = 0) -> np.ndarray:
    """``c = act(A @ b + bias[:, None] + res)`` with A packed by :func:`gemm_pack_a` (``m`` rows).

    ``b`` (K x N) and ``c``/``res`` (M x N) are float32 2-D views with any strides (a transposed view stores
    C^T, which is how linear layers use it); with a leading batch axis, ``ap`` (B, panels, K, 8), ``b``
    (B, K, N), ``c`` (B, M, N) and ``bias`` (B, M) run one product per batch item."""
    batched = ap.ndim == 4
    aps = ap if batched else ap[None]
    bs, cs = (b, c) if batched else (b[None], c[None])
    rs = None if res is None else (res if batched else res[None])
    nb, k, n = bs.shape
    bform = aps.shape[-1] == GEMM_NBP  # A^T packed as B panels (see pack_weights)
    want = gemm_packed_b_shape(k, m) if bform else gemm_packed_shape(m, k)
    if aps.shape[1:] != want or cs.shape != (nb, m, n) or aps.shape[0] != nb:
        raise ValueError(f"gemm: packed A {ap.shape} (m={m}), b {b.shape}, c {c.shape} do not agree")
    if rs is not None and rs.shape != cs.shape:
        raise ValueError(f"gemm: residual shape {res.shape if res is not None else None}, expected {c.shape}")
    bias2 = None if bias is None else np.ascontiguousarray(bias, F32).reshape(nb, m)
    if not AVAILABLE or any(x.dtype != F32 for x in (bs, cs)) or (rs is not None and rs.dtype != F32):
        for q in range(nb):
            y = (gemm_unpack_b(aps[q], m).T if bform else gemm_unpack_a(aps[q], m)) @ bs[q]
            if bias2 is not None:
                y += bias2[q][:, None]
            if rs is not None:
                y += rs[q]
            if act is not None:
                numpy_bias_act(y, None, None, act)
            cs[q] = y
        return c
    _check(aps, "ap")
    code, p0, p1 = _act_code(act)
    sb, sc = _strides_of(bs), _strides_of(cs)
    sr = _strides_of(rs) if rs is not None else sc
    if rs is not None and sr != sc:
        r2 = np.empty_like(cs)  # same memory order as C; the C side reads R with C's strides
        r2[...] = rs
        rs, sr = r2, _strides_of(r2)
        if sr != sc:  # C is a view with gaps: compute into a compact buffer, then copy
            tmp = np.empty_like(r2)
            gemm(ap, m, b, tmp if batched else tmp[0], bias, r2 if batched else r2[0], act, max_threads)
            cs[...] = tmp
            return c
    rc = lib.inferd_gemm_ex(*_gemm_args(aps, m, k, n, nb, bs, sb, cs, sc, bias2, rs, sr[0], code, p0, p1, max_threads,
                                        bform))
    if rc != 0:
        raise MemoryError("gemm: out of memory")
    return c


def _gemm_args(aps: np.ndarray, m: int, k: int, n: int, nb: int, bs: np.ndarray, sb: tuple[int, ...],
               cs: np.ndarray, sc: tuple[int, ...], bias2: np.ndarray | None, rs: np.ndarray | None, r_bs: int,
               code: int, p0: float, p1: float, max_threads: int, bform: bool) -> tuple:
    """inferd_gemm_ex's arguments for C = A B with A packed either way. In the B form the product runs
    transposed, C^T = B^T A^T: the activations become the row operand (packed per call, no padding of a short
    pixel axis to the micro-kernel's width) and the weights the prepacked column operand."""
    bias = ffi.NULL if bias2 is None else _ptr(bias2)
    r = ffi.NULL if rs is None else _rawptr(rs)
    if bform:
        return (n, k, m, nb, _rawptr(bs), sb[2], sb[1], sb[0], 0, _ptr(aps), 0, 0, aps.shape[1] * k * GEMM_NBP, 1,
                _rawptr(cs), sc[2], sc[1], sc[0], bias, m, 1, r, r_bs, code, p0, p1, max_threads)
    return (m, k, n, nb, _ptr(aps), 0, 0, aps.shape[1] * k * GEMM_MR, 1, _rawptr(bs), sb[1], sb[2], sb[0], 0,
            _rawptr(cs), sc[1], sc[2], sc[0], bias, m, 0, r, r_bs, code, p0, p1, max_threads)


def numpy_gemm_koff(a: np.ndarray, xflat: np.ndarray, boff: np.ndarray, coff: np.ndarray) -> np.ndarray:
    """The reference of :func:`gemm_koff` without bias/residual/activation: ``a @ xflat[boff[:, None] + coff]``."""
    return (a.astype(np.float64) @ xflat[boff[:, None] + coff[None, :]].astype(np.float64)).astype(F32)


def gemm_koff(ap: np.ndarray, m: int, xflat: np.ndarray, boff: np.ndarray, coff: np.ndarray, c: np.ndarray,
              bias: np.ndarray | None = None, res: np.ndarray | None = None, act: Act | None = None,
              max_threads: int = 0) -> np.ndarray:
    """``c = act(A @ B + bias[:, None] + res)`` with A packed by :func:`gemm_pack_a` (``m`` rows) and B never stored:
    ``B[k, n] = xflat[boff[k] + coff[n]]`` (an implicit im2col). ``c``/``res`` (M, N) C-contiguous float32;
    ``boff``/``coff`` int64 offsets that must lie inside ``xflat`` (checked)."""
    k, n = boff.size, coff.size
    if ap.shape != gemm_packed_shape(m, k) or c.shape != (m, n) or (res is not None and res.shape != c.shape):
        raise ValueError(f"gemm_koff: packed A {ap.shape} (m={m}), {k} row and {n} column offsets, c {c.shape}")
    if boff.dtype != np.int64 or coff.dtype != np.int64 or not (boff.flags.c_contiguous and coff.flags.c_contiguous):
        raise ValueError("gemm_koff: offsets must be contiguous int64")
    if k and n and (int(boff.min()) + int(coff.min()) < 0 or int(boff.max()) + int(coff.max()) >= xflat.size):
        raise ValueError("gemm_koff: an offset points outside the input")
    if not AVAILABLE or xflat.dtype != F32 or c.dtype != F32 or not c.flags.c_contiguous or \
            (res is not None and (res.dtype != F32 or not res.flags.c_contiguous)) or not xflat.flags.c_contiguous:
        y = numpy_gemm_koff(gemm_unpack_a(ap, m), np.asarray(xflat, F32).ravel(), boff, coff)
        c[...] = numpy_bias_act(y, bias, res, act) if (bias is not None or res is not None or act is not None) else y
        return c
    code, p0, p1 = _act_code(act)
    b2 = None if bias is None else np.ascontiguousarray(bias, F32).reshape(m)
    rc = lib.inferd_gemm_koff(_ptr(ap), m, k, n, _ptr(xflat), ffi.cast("const long long*", boff.ctypes.data),
                              ffi.cast("const long long*", coff.ctypes.data), _ptr(c), n, _opt(b2), _opt(res), code,
                              p0, p1, max_threads)
    if rc != 0:
        raise MemoryError("gemm_koff: out of memory")
    return c


def fma_peak(threads: int | None = None, seconds: float = 0.2) -> float:
    """FLOP/s the cores reach on independent FMA chains in their widest vectors (``threads`` pool threads,
    default all): the measured peak a roofline divides by. 0.0 without native code."""
    if not AVAILABLE:
        return 0.0
    n = num_threads() if threads is None else max(1, int(threads))
    lib.inferd_fma_peak(1000, n)  # wake the pool's threads
    iters = 1 << 16
    while True:  # grow the run until it is long enough to time
        t = time.perf_counter()
        rate = float(lib.inferd_fma_peak(iters, n))
        if time.perf_counter() - t >= seconds / 4 or iters >= 1 << 30:
            break
        iters *= 4
    # the best of three: a core taken away for a moment lowers a run, nothing raises one
    return max([rate] + [float(lib.inferd_fma_peak(iters, n)) for _ in range(2)])


def gemm_isa() -> int:
    """The GEMM micro-kernel in use: 0 baseline (SSE2/NEON), 1 AVX2+FMA, 2 AVX-512; -1 without native code."""
    return int(lib.inferd_gemm_isa()) if AVAILABLE else -1


def int8_isa() -> int:
    """The int8 kernels in use: 0 portable C, 1 VNNI (x86-64) or sdot (aarch64), 2 VNNI with AMX tiles for
    convolutions and GEMMs, 3 AVX2 (an x86 CPU without AVX-512 VNNI); -1 without native code."""
    return int(lib.inferd_q8_isa()) if AVAILABLE else -1


def kernel_names() -> dict[str, str]:
    """The fp32 GEMM's and the int8 kernels' instruction sets in use, by name (``inferd info``, the benches' machine
    records)."""
    gemm = {-1: "none", 0: "baseline", 1: "avx2", 2: "avx512"}.get(gemm_isa(), "?")
    int8 = {-1: "none", 0: "portable", 1: "vnni" if platform.machine() == "x86_64" else "sdot", 2: "amx",
            3: "avx2"}.get(int8_isa(), "?")
    return {"gemm": gemm, "int8": int8}


def gemm_set_isa(level: int) -> int:
    """Force a GEMM micro-kernel level (tests); -1 restores the best. Returns the level in use."""
    return int(lib.inferd_gemm_set_isa(level)) if AVAILABLE else -1


def gemm_bound(ap: np.ndarray, m: int, b: np.ndarray, c: np.ndarray, bias: np.ndarray | None,
               res: np.ndarray | None, code: int, p0: float, p1: float) -> Callable[[], None] | None:
    """:func:`gemm` with every argument resolved now: returns a no-argument call (one C call, no checks at run
    time), or None where the arrays do not fit the C contract (then use :func:`gemm`). The arrays must stay
    alive and in place (an arena, packed weights); ``act`` is given as its C code."""
    if not AVAILABLE:
        return None
    batched = ap.ndim == 4
    aps = ap if batched else ap[None]
    bs, cs = (b, c) if batched else (b[None], c[None])
    rs = None if res is None else (res if batched else res[None])
    if any(x.dtype != F32 for x in (aps, bs, cs)) or not aps.flags.c_contiguous:
        return None
    nb, k, n = bs.shape
    bform = aps.shape[-1] == GEMM_NBP
    want = gemm_packed_b_shape(k, m) if bform else gemm_packed_shape(m, k)
    if aps.shape[1:] != want or cs.shape != (nb, m, n) or aps.shape[0] != nb:
        return None
    sb, sc = _strides_of(bs), _strides_of(cs)
    if rs is not None and (rs.dtype != F32 or rs.shape != cs.shape or _strides_of(rs) != sc):
        return None
    bias2 = None if bias is None else bias.reshape(nb, m)
    if bias2 is not None and (bias2.dtype != F32 or not bias2.flags.c_contiguous):
        return None
    keep = (aps, bs, cs, rs, bias2)  # the closure keeps the buffers the pointers point into alive
    args = _gemm_args(aps, m, k, n, nb, bs, sb, cs, sc, bias2, rs, sc[0], code, p0, p1, 0, bform)
    fn = lib.inferd_gemm_ex

    def call(_keep: Any = keep) -> None:
        if fn(*args) != 0:
            raise MemoryError("gemm: out of memory")

    return with_steps(call, [("inferd_gemm_ex", args)])


def dwconv2d_bound(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, out: np.ndarray, sh: int, sw: int,
                   dh: int, dw: int, pt: int, pl: int, code: int, p0: float, p1: float,
                   res: np.ndarray | None = None) -> Callable[[], None] | None:
    """:func:`dwconv2d` (then ``act(y + res)`` when a residual is given) resolved now into a no-argument call,
    or None where the arrays do not fit (see :func:`gemm_bound`)."""
    if not AVAILABLE:
        return None
    arrs = [x, w, out] + ([bias] if bias is not None else []) + ([res] if res is not None else [])
    if any(a.dtype != F32 or not a.flags.c_contiguous for a in arrs):
        return None
    c, h, wd = x.shape
    cm, kh, kw = w.shape
    _, oh, ow = out.shape
    if res is not None and res.size != out.size:
        return None
    conv = lib.inferd_dwconv2d
    cargs = (_ptr(x), _ptr(w), ffi.NULL if bias is None else _ptr(bias), _ptr(out), c, cm // c, h, wd, kh, kw, sh, sw,
             dh, dw, pt, pl, oh, ow, 0 if res is not None else code, p0, p1)
    keep = tuple(arrs)
    if res is None:
        def call(_keep: Any = keep) -> None:
            if conv(*cargs) != 0:
                raise MemoryError("dwconv2d: out of memory")
        return with_steps(call, [("inferd_dwconv2d", cargs)])
    hw = oh * ow
    ba = lib.inferd_bias_act
    bargs = (_ptr(out), hw, ffi.NULL, _ptr(res), hw, cm, hw, code, p0, p1)

    def call_res(_keep: Any = keep) -> None:  # the residual is added before the activation
        if conv(*cargs) != 0:
            raise MemoryError("dwconv2d: out of memory")
        ba(*bargs)

    return with_steps(call_res, [("inferd_dwconv2d", cargs), ("inferd_bias_act", bargs)])


def nchwc_group_blocks() -> int:
    """Output blocks per group of packed blocked-conv weights: the current ISA's tiles' (4 on AVX-512, 1 on AVX2 and
    NEON), so a tile reads its weights as one run of memory; 4 without the native build."""
    return int(lib.inferd_nchwc_group_blocks()) if has("inferd_nchwc_group_blocks") else 4


def nchwc_scratch_nbytes(cin: int, cpb: int, h: int, w: int, cout: int, kh: int, kw: int, sh: int, sw: int, pt: int,
                         pl: int, oh: int, ow: int, dh: int = 1, dw: int = 1) -> int:
    """Bytes native/nchwc.c's conv of this geometry allocates while it runs (``cpb`` 16: a blocked input, 1: NCHW);
    0 without the native build."""
    if not has("inferd_nchwc_scratch_bytes"):
        return 0
    return int(lib.inferd_nchwc_scratch_bytes(cin, cpb, h, w, cout, kh, kw, sh, sw, pt, pl, oh, ow, dh, dw))


def nchwc_conv_bound(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None, y: np.ndarray,
                     kh: int, kw: int, sh: int, sw: int, pt: int, pl: int, code: int, p0: float, p1: float,
                     depthwise: bool = False, cin: int | None = None, cout: int | None = None,
                     grouped: tuple[int, int] | None = None,
                     dilation: tuple[int, int] | None = None) -> Callable[[], None] | None:
    """native/nchwc.c's conv (``depthwise``: its depthwise conv) over each image of blocked ``x`` (N, Cin/16, H,
    W, 16), or of an NCHW ``x`` (N, Cin, H, W), into ``y`` (N, Cout/16, OH, OW, 16), ``res`` (y's shape) added
    before the activation; ``w`` packed by ``ops.conv_nchwc.pack_weights``. A no-argument call, or None where the
    arrays do not fit (see :func:`gemm_bound`). ``cin``, ``cout``: the real channel counts of a blocked input and
    output, where a last block holds fewer than 16 (the rest padding lanes the tiles then skip, or write as
    zeros). ``grouped``: (gi, go), a grouped conv as groups of gi input and go output blocks
    (``inferd_nchwc_conv_grouped``; ``w`` packed by ``ops.conv_nchwc.pack_grouped``). ``dilation``: (dh, dw) of
    a dense stride-1 conv (``inferd_nchwc_conv_dilated``; ``sh``, ``sw`` must be 1)."""
    nchw = x.ndim == 4 and not depthwise  # a stem's NCHW input: (N, Cin, H, W), w packed with one-channel blocks
    name = "inferd_nchwc_dwconv" if depthwise else ("inferd_nchwc_conv_nchw" if nchw else "inferd_nchwc_conv")
    cin = cin if cin is not None and -(-cin // 16) == x.shape[1] else 16 * x.shape[1]
    cout = cout if cout is not None and -(-cout // 16) == y.shape[1] else 16 * y.shape[1]
    part = not nchw and not depthwise and (cin % 16 != 0 or cout % 16 != 0) and has("inferd_nchwc_conv_ch")
    if part:
        name = "inferd_nchwc_conv_ch"
    if grouped is not None:
        if nchw or depthwise:
            return None
        name, part = "inferd_nchwc_conv_grouped", True
    if dilation is not None:
        if nchw or depthwise or grouped is not None or (sh, sw) != (1, 1):
            return None
        name, part = "inferd_nchwc_conv_dilated", True
    if not has(name):
        return None
    arrs = [x, w, y] + [a for a in (bias, res) if a is not None]
    if any(a.dtype != F32 or not a.flags.c_contiguous for a in arrs) or (res is not None and res.shape != y.shape):
        return None
    n, cib, h, wd = x.shape[:4]
    _, cob, oh, ow, _ = y.shape
    fn = getattr(lib, name)
    per = [(_ptr(x[i]), _ptr(y[i]), ffi.NULL if res is None else _ptr(res[i])) for i in range(n)]
    wp, bp = _ptr(w), _opt(bias)
    # the two entry points differ only in the output block count the depthwise one does not take
    head = (cib, h, wd, wp) if depthwise else (cin, h, wd, wp, cout) if part else (cib, h, wd, wp, cob)
    keep = [tuple(arrs)]

    geo = (kh, kw) + (tuple(dilation) if dilation is not None else (sh, sw)) + (pt, pl, oh, ow) + (
        tuple(grouped) if grouped is not None else ())

    def call() -> None:
        for xp, yp, rp in per:
            if fn(xp, *head, *geo, bp, rp, yp, code, p0, p1) != 0:
                raise ValueError(f"{name}: bad arguments")

    me = weakref.ref(call)

    def retarget(a: np.ndarray) -> None:
        _check_retarget(a, x)
        per[:] = [(_ptr(a[i]), yp, rp) for i, (_xp, yp, rp) in enumerate(per)]
        keep[0] = (a, *arrs[1:])
        for st, (xp, _yp, _rp) in zip(_steps_of(me), per):
            st.set_ptr(0, xp)

    return with_steps(_retargetable(call, retarget),
                      [(name, (xp, *head, *geo, bp, rp, yp, code, p0, p1)) for xp, yp, rp in per])


def _check_retarget(a: np.ndarray, like: np.ndarray) -> None:
    if type(a) is not np.ndarray or a.shape != like.shape or a.dtype != like.dtype or not a.flags.c_contiguous \
            or not a.flags.aligned:
        raise ValueError(f"retarget: an aligned C-contiguous {like.dtype} array of shape {like.shape} is needed, got "
                         f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}")


def _steps_of(ref: "weakref.ref[Callable[[], None]]") -> Sequence[Any]:
    """The native steps of the call ``ref`` names. A retarget reaches its call through a weak reference: the call
    holds the retarget (``call.retarget``), and a strong one back made the pair a cycle that kept the layer's
    arrays (a model's arena, its weights: resnet18's 41 MB of the host pool) alive after its model closed, until
    a full collection, which a daemon seldom runs."""
    c = ref()
    return getattr(c, "steps", ()) if c is not None else ()


def _retargetable(call: Callable[[], None], retarget: Callable[[np.ndarray], None]) -> Callable[[], None]:
    """``call`` with ``call.retarget(a)``: read input 0 from ``a`` (the shape and dtype bound, C-contiguous,
    aligned) from now on, where it was bound to read the array it was made with. The CPU executor points a layer
    that reads a graph input at the caller's array rather than copying that array into the arena each run."""
    call.retarget = retarget  # type: ignore[attr-defined]
    return call


# --------------------------------------------------------------------------- runs of bound calls (steps.c)

_STEP_KINDS: dict[str, tuple[int, str]] = {}


class NativeStep:
    """One bound call of a C entry point as ``inferd_steps_run`` takes it: the entry point's kind and its
    arguments in 64-bit slots (cffi memory this object owns), filled by the entry point's argument letters."""

    __slots__ = ("kind", "sig", "args")

    def __init__(self, kind: int, sig: str, values: Sequence[Any]) -> None:
        self.kind, self.sig = kind, sig
        self.args = ffi.new("inferd_arg[]", len(sig))
        for j, (c, v) in enumerate(zip(sig, values)):
            if c == "p":
                self.args[j].p = ffi.cast("void *", v)
            elif c == "f":
                self.args[j].f = float(v)
            else:
                self.args[j].i = int(v)

    def set_ptr(self, slot: int, p: Any) -> None:
        """Point pointer argument ``slot`` elsewhere (a retargeted input)."""
        if self.sig[slot] != "p":
            raise ValueError(f"argument {slot} of this step is not a pointer")
        self.args[slot].p = ffi.cast("void *", p)


def _step_kind(name: str) -> tuple[int, str] | None:
    got = _STEP_KINDS.get(name)
    if got is None:
        if not has("inferd_steps_run"):
            return None
        sig = ffi.new("const char **")
        k = int(lib.inferd_steps_kind(name.encode(), sig))
        got = _STEP_KINDS[name] = (k, ffi.string(sig[0]).decode() if k >= 0 else "")
    return got if got[0] >= 0 else None


def with_steps(call: Callable[[], None], recs: Sequence[tuple[str, Sequence[Any]]]) -> Callable[[], None]:
    """``call`` with ``call.steps``: the same work as native steps, one per (entry point name, its arguments as
    the call passes them) of ``recs``, for :func:`fuse_calls`. Left without where an entry point is not one the
    runner knows or the arguments do not match its prototype (the call then runs from Python as before)."""
    steps = []
    for name, values in recs:
        ks = _step_kind(name)
        if ks is None or len(ks[1]) != len(values):
            return call
        steps.append(NativeStep(ks[0], ks[1], values))
    call.steps = steps  # type: ignore[attr-defined]
    return call


def fuse_calls(calls: Sequence[Callable[[], None]], min_run: int = 2) -> list[Callable[[], None]]:
    """``calls`` with each run of at least ``min_run`` consecutive calls that carry native steps (``call.steps``,
    :func:`with_steps`; a call with an empty list does nothing and joins any run) made one call of
    ``inferd_steps_run``: the layers then follow each other in C, the GIL released once (a small model's warm
    run had spent ~9% of its calling thread in Python and cffi between layers). Where a step fails, its call and
    those after it in the run are called from Python, which raises that call's own error or takes its own
    fallback (a strided copy's numpy copy). A run's steps hold the calls' argument memory: a retarget (the
    executor's direct inputs) changes the steps the run reads."""
    out: list[Callable[[], None]] = []
    run: list[Callable[[], None]] = []

    def flush() -> None:
        work = [c for c in run if getattr(c, "steps")]
        if len(work) >= min_run:
            out.append(_steps_call(work))
        else:
            out.extend(work)
        run.clear()

    for c in calls:
        if getattr(c, "steps", None) is not None:
            run.append(c)
        else:
            flush()
            out.append(c)
    flush()
    return out


def _step_array(steps: Sequence[NativeStep]) -> Any:
    """``steps`` as the C runner's ``inferd_step[]`` (it points into each step's argument memory, which the caller
    keeps alive as long as the array)."""
    arr = ffi.new("inferd_step[]", len(steps))
    for i, st in enumerate(steps):
        arr[i].kind, arr[i].nargs, arr[i].a = st.kind, len(st.sig), st.args
    return arr


def _steps_call(calls: list[Callable[[], None]]) -> Callable[[], None]:
    steps = [st for c in calls for st in getattr(c, "steps")]
    owner = [j for j, c in enumerate(calls) for _ in getattr(c, "steps")]
    n = len(steps)
    arr = _step_array(steps)
    fn = lib.inferd_steps_run

    def call(_keep: Any = (steps, calls)) -> None:
        done = fn(arr, n)
        if done != n:
            for c in calls[owner[done]:]:
                c()

    call.fused = calls  # type: ignore[attr-defined]
    return call


def run_timed(calls: Sequence[Callable[[], None]]) -> list[float]:
    """Run ``calls`` in order and return ``time.perf_counter()`` at the end of each. Consecutive calls that carry
    native steps (:func:`with_steps`) run as one ``inferd_steps_run_timed``, the GIL released once, each one's end
    read from the clock after its last step; where a step fails, its call and those after it in the run are called
    from Python, as :func:`fuse_calls`' runs do. Why: a cold load's first run executes the layers that are ready
    as one call (the executor otherwise took the GIL back after every layer, from the loader thread that holds it
    binding the next ones) and still times each layer for the cold timeline and the plan's refinement."""
    ends: list[float] = []
    timed = has("inferd_steps_run_timed")
    i, n = 0, len(calls)
    while i < n:
        if not timed or getattr(calls[i], "steps", None) is None:
            calls[i]()
            ends.append(time.perf_counter())
            i += 1
            continue
        j = i
        while j < n and getattr(calls[j], "steps", None) is not None:
            j += 1
        group = calls[i:j]
        steps = [st for c in group for st in getattr(c, "steps")]
        t0 = time.perf_counter()
        done, t = 0, None
        if steps:
            t = ffi.new("double[]", len(steps))
            done = int(lib.inferd_steps_run_timed(_step_array(steps), len(steps), t))
        k, last = 0, t0
        for c in group:
            m = len(getattr(c, "steps"))
            if k + m <= done:
                last = t[k + m - 1] if m else last  # (a call with no steps does nothing)
            else:
                c()  # (its own error, or its own fallback; the rest of the run after it too)
                last = time.perf_counter()
            ends.append(last)
            k += m
        i = j
    return ends


def nchwc_maxpool_bound(x: np.ndarray, y: np.ndarray, kh: int, kw: int, sh: int, sw: int, pt: int,
                        pl: int) -> Callable[[], None] | None:
    """native/nchwc.c's MaxPool over each image of blocked ``x`` into ``y``; None where it does not apply."""
    if not has("inferd_nchwc_maxpool") or any(a.dtype != F32 or not a.flags.c_contiguous for a in (x, y)):
        return None
    n, cb, h, wd, _ = x.shape
    _, _, oh, ow, _ = y.shape
    fn = lib.inferd_nchwc_maxpool
    per = [(_ptr(x[i]), _ptr(y[i])) for i in range(n)]

    def call(_keep: Any = (x, y)) -> None:
        for xp, yp in per:
            if fn(xp, cb, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, yp) != 0:
                raise ValueError("nchwc_maxpool: bad arguments")
    return with_steps(call, [("inferd_nchwc_maxpool", (xp, cb, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, yp))
                             for xp, yp in per])


def nchwc_reorder_bound(x: np.ndarray, y: np.ndarray, to_blocked: bool) -> Callable[[], None] | None:
    """NCHW ``x`` (N, C, H, W) to blocked ``y`` (N, ceil(C/16), H, W, 16), or back (``to_blocked`` False; ``y``'s
    C then says how many channels come back), as one native call; None where it does not apply."""
    if not has("inferd_nchwc_reorder") or any(a.dtype != F32 or not a.flags.c_contiguous for a in (x, y)):
        return None
    plain, blocked = (x, y) if to_blocked else (y, x)
    if plain.ndim != 4 or blocked.ndim != 5 or blocked.shape[4] != 16:
        return None
    n, c, h, w = (int(d) for d in plain.shape)
    if blocked.shape[:4] != (n, -(-c // 16), h, w):
        return None
    fn, args = lib.inferd_nchwc_reorder, [_ptr(x), n, c, h * w, _ptr(y), int(to_blocked)]
    keep = [(x, y)]

    def call() -> None:
        if fn(*args) != 0:
            raise ValueError("nchwc_reorder: bad arguments")

    me = weakref.ref(call)

    def retarget(a: np.ndarray) -> None:
        _check_retarget(a, x)
        args[0] = _ptr(a)
        keep[0] = (a, y)
        for st in _steps_of(me):
            st.set_ptr(0, args[0])

    return with_steps(_retargetable(call, retarget), [("inferd_nchwc_reorder", args)])


def nchwc_gap_bound(x: np.ndarray, y: np.ndarray) -> Callable[[], None] | None:
    """The global average pool of blocked ``x`` (N, ceil(C/16), H, W, 16) into ``y`` (N, C, 1, 1); None where it
    does not apply."""
    if not has("inferd_nchwc_gap") or any(a.dtype != F32 or not a.flags.c_contiguous for a in (x, y)):
        return None
    if x.ndim != 5 or x.shape[4] != 16 or y.ndim != 4 or y.shape[0] != x.shape[0] or y.shape[2:] != (1, 1):
        return None
    n, c = int(y.shape[0]), int(y.shape[1])
    if -(-c // 16) != x.shape[1]:
        return None
    fn, args = lib.inferd_nchwc_gap, (_ptr(x), n, c, int(x.shape[2]) * int(x.shape[3]), _ptr(y))

    def call(_keep: Any = (x, y)) -> None:
        if fn(*args) != 0:
            raise ValueError("nchwc_gap: bad arguments")
    return with_steps(call, [("inferd_nchwc_gap", args)])


def nchwc_scale_bound(x: np.ndarray, s: np.ndarray, y: np.ndarray, mult: float = 1.0,
                      act: Act | None = None) -> Callable[[], None] | None:
    """Blocked ``x`` (N, ceil(C/16), H, W, 16) times a scale per channel ``s`` (N or 1, C, 1, 1) into ``y`` (x's
    shape), then times ``mult`` and through ``act`` (one that keeps zero at zero) in the same pass; None where it
    does not apply."""
    fused = mult != 1.0 or act is not None
    if not has("inferd_nchwc_scale_act" if fused else "inferd_nchwc_scale") \
            or any(a.dtype != F32 or not a.flags.c_contiguous for a in (x, s, y)):
        return None
    if x.ndim != 5 or x.shape[4] != 16 or y.shape != x.shape or s.ndim != 4 or s.shape[2:] != (1, 1):
        return None
    n, c = int(x.shape[0]), int(s.shape[1])
    if -(-c // 16) != x.shape[1] or s.shape[0] not in (1, n):
        return None
    stride = 0 if s.shape[0] == 1 else c
    common = (_ptr(x), n, c, int(x.shape[2]) * int(x.shape[3]), _ptr(s), stride)
    if fused:
        name, args = "inferd_nchwc_scale_act", (*common, float(mult), *_act_code(act), _ptr(y))
    else:
        name, args = "inferd_nchwc_scale", (*common, _ptr(y))
    fn = getattr(lib, name)

    def call(_keep: Any = (x, s, y)) -> None:
        if fn(*args) != 0:
            raise ValueError("nchwc_scale: bad arguments")
    return with_steps(call, [(name, args)])


#: Columns per prepacked B panel (native/gemm.c NBP): a multiple of every micro-kernel's width.
GEMM_NBP = 96


def gemm_packed_b_shape(k: int, n: int) -> tuple[int, int, int]:
    """Shape of a prepacked B (K x N): (panels, K, 96), columns past N zero."""
    return (-(-n // GEMM_NBP), k, GEMM_NBP)


def gemm_pack_b(b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Pack a constant right-hand matrix B (K x N, any strides) for :func:`linear` (into ``out`` if given)."""
    b = np.asarray(b)
    if b.ndim != 2:
        raise ValueError(f"gemm_pack_b: expected a 2-D matrix, got shape {b.shape}")
    k, n = b.shape
    if out is None:
        out = empty_aligned(gemm_packed_b_shape(k, n), F32)
    if not AVAILABLE:
        full = np.zeros((k, out.shape[0] * GEMM_NBP), F32)
        full[:, :n] = b
        out[...] = full.reshape(k, out.shape[0], GEMM_NBP).transpose(1, 0, 2)
        return out
    _pack_into(lib.inferd_gemm_pack_b, b, out)
    return out


def gemm_unpack_b(bp: np.ndarray, n: int) -> np.ndarray:
    return bp.transpose(1, 0, 2).reshape(bp.shape[1], bp.shape[0] * bp.shape[2])[:, :n]


def _linear_args(x: np.ndarray, bp: np.ndarray, n: int, y: np.ndarray, bias: np.ndarray | None,
                 res: np.ndarray | None, code: int, p0: float, p1: float) -> tuple | None:
    rows, k = x.shape
    if (bp.shape != gemm_packed_b_shape(k, n) or y.shape != (rows, n) or x.dtype != F32 or y.dtype != F32
            or bp.dtype != F32 or not bp.flags.c_contiguous):
        return None
    sx, sy = _strides_of(x), _strides_of(y)
    if res is not None and (res.shape != y.shape or res.dtype != F32 or _strides_of(res) != sy):
        return None
    if bias is not None and (bias.dtype != F32 or bias.shape != (n,) or not bias.flags.c_contiguous):
        return None
    return (rows, k, n, 1, _rawptr(x), sx[0], sx[1], 0, 0, _ptr(bp), 0, 0, 0, 1, _rawptr(y), sy[0], sy[1], 0,
            ffi.NULL if bias is None else _ptr(bias), 0, 1, ffi.NULL if res is None else _rawptr(res), 0,
            code, p0, p1, 0)


def linear(x: np.ndarray, bp: np.ndarray, n: int, y: np.ndarray, bias: np.ndarray | None = None,
           res: np.ndarray | None = None, act: Act | None = None) -> np.ndarray:
    """``y = act(x @ B + bias + res)`` with B prepacked by :func:`gemm_pack_b` (``n`` columns); ``x`` (rows, K),
    ``y`` and ``res`` (rows, N) float32 with any strides, ``bias`` (N,)."""
    code, p0, p1 = _act_code(act)
    args = _linear_args(x, bp, n, y, bias, res, code, p0, p1) if AVAILABLE else None
    if args is None:
        if x.shape[1] != bp.shape[1] or y.shape != (x.shape[0], n):
            raise ValueError(f"linear: x {x.shape}, packed B {bp.shape} (n={n}), y {y.shape} do not agree")
        t = x.astype(F32) @ gemm_unpack_b(bp, n)
        if bias is not None:
            t += bias
        if res is not None:
            t += res
        if act is not None:
            numpy_bias_act(t, None, None, act)
        y[...] = t
        return y
    if lib.inferd_gemm_ex(*args) != 0:
        raise MemoryError("linear: out of memory")
    return y


def linear_bound(x: np.ndarray, bp: np.ndarray, n: int, y: np.ndarray, bias: np.ndarray | None,
                 res: np.ndarray | None, code: int, p0: float, p1: float) -> Callable[[], None] | None:
    """:func:`linear` resolved now into a no-argument call (see :func:`gemm_bound`), or None."""
    if not AVAILABLE:
        return None
    args = _linear_args(x, bp, n, y, bias, res, code, p0, p1)
    if args is None:
        return None
    fn, keep = lib.inferd_gemm_ex, (x, bp, y, bias, res)

    def call(_keep: Any = keep) -> None:
        if fn(*args) != 0:
            raise MemoryError("linear: out of memory")

    return with_steps(call, [("inferd_gemm_ex", args)])


#: Fewer elements than this: numpy's own assignment is cheaper than a native call's set-up.
STRIDED_COPY_MIN = 4096


def strided_copy_bound(dst: np.ndarray, src: np.ndarray) -> Callable[[], None] | None:
    """``dst[...] = src`` resolved now into one native call (copy.c) for a C-contiguous ``dst`` and a view ``src``
    of the same shape and dtype with any strides (a Transpose's permuted input, a stepped slice); None where it
    does not apply. The call holds both arrays: their buffers are the ones bound here."""
    if (not AVAILABLE or src.dtype != dst.dtype or src.shape != dst.shape or not dst.flags.c_contiguous
            or src.dtype.hasobject or src.ndim > 8 or not has("inferd_strided_copy")
            or np.may_share_memory(dst, src)):  # overlapping: numpy's assignment buffers it
        return None
    shape = ffi.new("long long[]", [int(d) for d in src.shape] or [1])
    strides = ffi.new("long long[]", [int(d) for d in src.strides] or [0])
    args = (_vptr(dst), _vptr(src), src.ndim, shape, strides, src.itemsize)
    fn = lib.inferd_strided_copy

    def call(_keep: Any = (dst, src, shape, strides)) -> None:
        if fn(*args) != 0:
            dst[...] = src
    return with_steps(call, [("inferd_strided_copy", args)])


def matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``c[q] = a[q] @ b[q]`` for float32 (Q, M, K) @ (Q, K, N) -> (Q, M, N) views with any strides (a batch
    stride 0 broadcasts), both operands packed per call: the product of two activations (attention)."""
    q, m, k = a.shape
    if b.shape[0] != q or b.shape[1] != k or c.shape != (q, m, b.shape[2]):
        raise ValueError(f"matmul: a {a.shape}, b {b.shape}, c {c.shape} do not agree")
    if not AVAILABLE or any(x.dtype != F32 for x in (a, b, c)):
        np.matmul(a, b, out=c)
        return c
    if lib.inferd_gemm_ex(*_matmul_args(a, b, c)) != 0:
        raise MemoryError("matmul: out of memory")
    return c


def _matmul_args(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[Any, ...]:
    """``inferd_gemm_ex``'s arguments for :func:`matmul` on agreeing float32 (Q, M, K), (Q, K, N), (Q, M, N) views:
    both operands plain strided matrices, no bias, residual or activation."""
    q, m, k = a.shape
    n = b.shape[2]
    sa, sb, sc = _strides_of(a), _strides_of(b), _strides_of(c)
    return (m, k, n, q, _rawptr(a), sa[1], sa[2], sa[0], 0, _rawptr(b), sb[1], sb[2], sb[0], 0,
            _rawptr(c), sc[1], sc[2], sc[0], ffi.NULL, 0, 0, ffi.NULL, 0, 0, 0.0, 0.0, 0)


def matmul_bound(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None] | None:
    """:func:`matmul` resolved now into a no-argument call (one C call, no checks at run time), or None where the
    arrays do not fit it (not float32 views of agreeing shapes). The arrays must stay alive and in place (an
    arena); the call holds them."""
    if not AVAILABLE or a.ndim != 3 or b.ndim != 3 or c.ndim != 3 or any(x.dtype != F32 for x in (a, b, c)):
        return None
    q, m, k = a.shape
    if b.shape[0] != q or b.shape[1] != k or c.shape != (q, m, b.shape[2]):
        return None
    args = _matmul_args(a, b, c)
    fn = lib.inferd_gemm_ex

    def call(_keep: Any = (a, b, c)) -> None:
        if fn(*args) != 0:
            raise MemoryError("matmul: out of memory")

    return with_steps(call, [("inferd_gemm_ex", args)])


#: Below this many columns (pixels, Winograd tiles) a layer's weights are packed in the B form (see
#: :func:`_gemm_args`). It was 64 while a ragged column panel cost a whole zero-padded 32-column panel (then
#: 512->512 3x3 on a 7x7 map ran 1.5x faster in the B form); since the GEMM runs the ragged panel as single
#: vectors plus a column tail, the A form wins from 16 columns on (Zen 4, one thread, Winograd F(2,3): 512->512
#: on 7x7, 16 tiles, 4.2 -> 2.3 ms; 256->256 on 14x14, 49 tiles, 2.3 -> 1.7 ms; 64->256 on 13x13 0.61 -> 0.48).
GEMM_BFORM_MAX_COLS = 8


def pack_weights(w3: np.ndarray, ncols: int) -> np.ndarray:
    """(G, M, K) constant weights packed for :func:`gemm` against B operands of ``ncols`` columns: the A form
    (G, panels, K, 8), or for few columns the B form (G, panels, K, 96) of W^T. :func:`gemm` tells them apart."""
    g, m, k = w3.shape
    if ncols < GEMM_BFORM_MAX_COLS:
        out = empty_aligned((g,) + gemm_packed_b_shape(k, m), F32)
        for q in range(g):
            gemm_pack_b(w3[q].T, out[q])
    else:
        out = empty_aligned((g,) + gemm_packed_shape(m, k), F32)
        for q in range(g):
            gemm_pack_a(w3[q], out[q])
    return out


def packed_weights_nbytes(groups: int, m: int, k: int, ncols: int) -> int:
    shape = gemm_packed_b_shape(k, m) if ncols < GEMM_BFORM_MAX_COLS else gemm_packed_shape(m, k)
    return groups * int(math.prod(shape)) * 4  # math.prod: cost models ask per layer, np.prod is ~50x slower


#: Upper bound of the native GEMM's per-thread packing scratch (native/gemm.c: a B block of at most 256 x 512
#: floats -- kc up to 1024 only for correspondingly fewer columns -- plus one 8-row A panel of kc <= 1024),
#: allocated on a thread's first GEMM and kept for its life. Not part of any layer's workspace_nbytes: the memory
#: planner counts it once per pool thread.
GEMM_SCRATCH_BYTES_PER_THREAD = (256 * 512 + 8 * 1024 + 1) * 4


def native_scratch_bytes() -> int:
    """Memory the native kernels keep outside the arena: the GEMM scratch of every pool thread."""
    return GEMM_SCRATCH_BYTES_PER_THREAD * num_threads() if AVAILABLE else 0


def _elem_strides(a: np.ndarray) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


#: activation name (lower case) -> (C code in native/rnn.c, uses alpha, uses beta, default alpha, default beta)
ACTS: dict[str, tuple[int, bool, bool, float, float]] = {
    "sigmoid": (0, False, False, 0.0, 0.0), "tanh": (1, False, False, 0.0, 0.0), "relu": (2, False, False, 0.0, 0.0),
    "affine": (3, True, True, 1.0, 0.0), "leakyrelu": (4, True, False, 0.01, 0.0),
    "thresholdedrelu": (5, True, False, 1.0, 0.0), "scaledtanh": (6, True, True, 1.0, 1.0),
    "hardsigmoid": (7, True, True, 0.2, 0.5), "elu": (8, True, False, 1.0, 0.0), "softsign": (9, False, False, 0.0, 0.0),
    "softplus": (10, False, False, 0.0, 0.0),
}

#: an activation of a recurrent layer: (name in lower case, alpha, beta)
Act = tuple[str, float, float]


def apply_act(x: np.ndarray, act: Act) -> np.ndarray:
    name, a, b = act
    with np.errstate(over="ignore"):
        if name == "sigmoid":
            return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)
        if name == "tanh":
            return np.tanh(x)
        if name == "relu":
            return np.maximum(x, 0)
        if name == "affine":
            return (a * x + b).astype(x.dtype)
        if name == "leakyrelu":
            return np.where(x >= 0, x, a * x).astype(x.dtype)
        if name == "thresholdedrelu":
            return np.where(x > a, x, 0).astype(x.dtype)
        if name == "scaledtanh":
            return (a * np.tanh(b * x)).astype(x.dtype)
        if name == "hardsigmoid":
            return np.clip(a * x + b, 0, 1).astype(x.dtype)
        if name == "elu":
            return np.where(x >= 0, x, a * (np.exp(x) - 1)).astype(x.dtype)
        if name == "softsign":
            return (x / (1 + np.abs(x))).astype(x.dtype)
        if name == "softplus":
            return np.log1p(np.exp(x)).astype(x.dtype)
    raise AssertionError(name)


def numpy_rnn_dir(kind: int, seq: int, batch: int, h: int, xw: np.ndarray, rt: np.ndarray, rb: np.ndarray,
                  peep: np.ndarray | None, lens: np.ndarray, reverse: int, hs: np.ndarray, cs: np.ndarray,
                  y: np.ndarray | None, acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float,
                  input_forget: int, lbr: int) -> None:
    """:func:`rnn_dir` in numpy (the same contract): the fallback and the C code's test oracle."""
    names = {v[0]: k for k, v in ACTS.items()}

    def act(v: np.ndarray, i: int) -> np.ndarray:
        return apply_act(v, (names[int(acts[i])], float(alphas[i]), float(betas[i])))

    def cl(v: np.ndarray) -> np.ndarray:
        return np.clip(v, -clip, clip) if clip > 0 else v

    for t in range(seq):
        for b in range(batch):
            n = int(lens[b])
            if t >= n:
                continue
            tt = n - 1 - t if reverse else t
            xr, hb = xw[tt, b], hs[b]
            if kind == 0:
                hb[...] = act(cl(xr + hb @ rt), 0)
            elif kind == 1:
                zr = act(cl(xr[:2 * h] + hb @ rt[:, :2 * h]), 0)
                z, r = zr[:h], zr[h:]
                if lbr:
                    pre = xr[2 * h:] + r * (hb @ rt[:, 2 * h:] + rb[2 * h:])
                else:
                    pre = xr[2 * h:] + (r * hb) @ rt[:, 2 * h:] + rb[2 * h:]
                hc = act(cl(pre), 1)
                hb[...] = (1 - z) * hc + z * hb
            else:
                cb = cs[b]
                g = xr + hb @ rt
                p = peep if peep is not None else np.zeros(3 * h, F32)
                i = act(cl(g[:h] + p[:h] * cb), 0)
                f = 1 - i if input_forget else act(cl(g[2 * h:3 * h] + p[2 * h:] * cb), 0)
                c_ = act(cl(g[3 * h:]), 1)
                cb[...] = f * cb + i * c_
                o = act(cl(g[h:2 * h] + p[h:2 * h] * cb), 0)
                hb[...] = o * act(cb.copy(), 2)
            if y is not None:
                y[tt, b] = hb


def rnn_dir_bound(kind: int, seq: int, batch: int, h: int, xw: np.ndarray, rt: np.ndarray, rb: np.ndarray,
                  peep: np.ndarray | None, lens: np.ndarray, reverse: int, hs: np.ndarray, cs: np.ndarray,
                  y: np.ndarray | None, acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float,
                  input_forget: int, lbr: int, ws: np.ndarray) -> Callable[[], None]:
    """:func:`rnn_dir` on these very arrays resolved into a no-argument call (the C arguments built once)."""
    g = {0: 1, 1: 3, 2: 4}[kind]
    ok = (AVAILABLE and xw.dtype == F32 and xw.strides[2] == 4 and rt.flags.c_contiguous and rt.shape == (h, g * h)
          and hs.flags.c_contiguous and cs.flags.c_contiguous and lens.dtype == np.int32 and lens.flags.c_contiguous
          and rb.flags.c_contiguous and (peep is None or peep.flags.c_contiguous)
          and (y is None or y.strides[2] == 4) and ws.size >= (g + 2) * h and ws.flags.c_contiguous)
    if not ok:
        return lambda: numpy_rnn_dir(kind, seq, batch, h, xw, rt, rb, peep, lens, reverse, hs, cs, y, acts, alphas,
                                     betas, clip, input_forget, lbr)
    acts = np.ascontiguousarray(acts, np.int32)
    alphas, betas = np.ascontiguousarray(alphas, F32), np.ascontiguousarray(betas, F32)
    sx = _elem_strides(xw)
    sy = _elem_strides(y) if y is not None else (0, 0, 0)
    args = (kind, seq, batch, h, _rawptr(xw), sx[0], sx[1], _ptr(rt), _ptr(rb), _opt(peep),
            ffi.cast("const int*", ffi.from_buffer(lens)), reverse, _ptr(hs), _ptr(cs),
            ffi.NULL if y is None else _rawptr(y), sy[0], sy[1], ffi.cast("const int*", ffi.from_buffer(acts)),
            _ptr(alphas), _ptr(betas), float(clip), int(input_forget), int(lbr), _ptr(ws))
    fn, keep = lib.inferd_rnn_dir, (xw, rt, rb, peep, lens, hs, cs, y, acts, alphas, betas, ws)

    def call(_keep: Any = keep) -> None:
        fn(*args)

    return call


def rnn_bidir_bound(kind: int, seq: int, batch: int, h: int, xw: np.ndarray, rt: np.ndarray, rb: np.ndarray,
                    peep: np.ndarray | None, lens: np.ndarray, hs: np.ndarray, cs: np.ndarray, y: np.ndarray | None,
                    acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float, input_forget: int, lbr: int,
                    ws: np.ndarray) -> Callable[[], None] | None:
    """Both directions of a bidirectional layer as one call running them on two pool threads (native/rnn.c
    ``inferd_rnn_bidir``), or None where the arrays do not fit it (then :func:`rnn_dir_bound` per direction).
    ``xw`` (seq, batch, 2*G*H) (last axis contiguous), ``rt`` (2, H, G*H), ``rb`` (2, G*H), ``peep`` (2, 3H) or
    None, ``hs``/``cs`` (2, batch, H), ``y`` (seq, 2, batch, H) view (last axis contiguous) or None; ``acts``,
    ``alphas``, ``betas`` (2, 3); ``ws`` 2 * (G + 2) * H floats."""
    g = {0: 1, 1: 3, 2: 4}[kind]
    gh = g * h
    ok = (AVAILABLE and xw.dtype == F32 and xw.strides[2] == 4 and xw.shape[2] == 2 * gh
          and rt.flags.c_contiguous and rt.shape == (2, h, gh) and rb.flags.c_contiguous and rb.shape == (2, gh)
          and hs.flags.c_contiguous and cs.flags.c_contiguous and hs.shape == (2, batch, h) and cs.shape == hs.shape
          and lens.dtype == np.int32 and lens.flags.c_contiguous
          and (peep is None or (peep.flags.c_contiguous and peep.shape == (2, 3 * h)))
          and (y is None or y.strides[3] == 4) and ws.size >= 2 * (g + 2) * h and ws.flags.c_contiguous)
    if not ok:
        return None
    acts = np.ascontiguousarray(acts, np.int32).reshape(2, 3)
    alphas = np.ascontiguousarray(alphas, F32).reshape(2, 3)
    betas = np.ascontiguousarray(betas, F32).reshape(2, 3)
    sx = _elem_strides(xw)
    sy = _elem_strides(y) if y is not None else (0, 0, 0, 0)
    args = (kind, seq, batch, h, _rawptr(xw), sx[0], sx[1], gh, _ptr(rt), _ptr(rb), _opt(peep),
            ffi.cast("const int*", ffi.from_buffer(lens)), _ptr(hs), _ptr(cs), ffi.NULL if y is None else _rawptr(y),
            sy[0], sy[2], sy[1], ffi.cast("const int*", ffi.from_buffer(acts)), _ptr(alphas), _ptr(betas),
            float(clip), int(input_forget), int(lbr), _ptr(ws), 0)
    fn, keep = lib.inferd_rnn_bidir, (xw, rt, rb, peep, lens, hs, cs, y, acts, alphas, betas, ws)

    def call(_keep: Any = keep) -> None:
        fn(*args)

    return call


def rnn_dir(kind: int, seq: int, batch: int, h: int, xw: np.ndarray, rt: np.ndarray, rb: np.ndarray,
            peep: np.ndarray | None, lens: np.ndarray, reverse: int, hs: np.ndarray, cs: np.ndarray,
            y: np.ndarray | None, acts: np.ndarray, alphas: np.ndarray, betas: np.ndarray, clip: float,
            input_forget: int, lbr: int, ws: np.ndarray) -> None:
    """One direction of an RNN (``kind`` 0), GRU (1) or LSTM (2) over ``seq`` steps (native/rnn.c): ``xw``
    (seq, batch, G*H) projections (any strides, last axis contiguous), ``rt`` (H, G*H) contiguous, ``rb``
    (G*H,), ``peep`` (3H,) or None, ``lens`` (batch,) int32, ``hs``/``cs`` (batch, H) contiguous states updated
    in place, ``y`` (seq, batch, H) view (last axis contiguous) or None, ``ws`` (G + 2) * H floats."""
    rnn_dir_bound(kind, seq, batch, h, xw, rt, rb, peep, lens, reverse, hs, cs, y, acts, alphas, betas, clip,
                  input_forget, lbr, ws)()
