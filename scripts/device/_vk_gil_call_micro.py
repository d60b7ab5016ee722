"""Executor-side vkCmd* calls while Python threads run: cffi (GIL released per call) against ctypes PYFUNCTYPE (held).
argv: spinning threads (default 2); SW: the switch interval (default 0.5 ms, the cold window's)."""
import ctypes, os, sys, threading, time
from inferd.vulkan.device import get_device
from inferd.vulkan import raw
sys.setswitchinterval(float(os.environ.get("SW", "0.0005")))
dev = get_device()
ffi, lib = raw.ffi, raw.lib
pool = dev._cmd_pool
cb = raw.allocate_command_buffer(dev.device, pool)
addr = int(ffi.cast("uintptr_t", lib.vkCmdDispatch))
P, U = ctypes.c_void_p, ctypes.c_uint32
gil_dispatch = ctypes.PYFUNCTYPE(None, P, U, U, U)(addr)
cbp = int(ffi.cast("uintptr_t", cb))
stop = False
def spin():
    x = 0
    while not stop:
        x += 1
nthr = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ths = [threading.Thread(target=spin, daemon=True) for _ in range(nthr)]
for t in ths: t.start()
time.sleep(0.05)
N = 200
for arm in ["cffi", "ctypes_gil", "cffi", "ctypes_gil"]:
    t0 = time.perf_counter()
    for i in range(N):
        if arm == "cffi":
            lib.vkCmdDispatch(cb, 0, 0, 0)
        else:
            gil_dispatch(cbp, 0, 0, 0)
    dt = time.perf_counter() - t0
    print(f"{arm:12s} {dt/N*1e6:8.1f} us per call with {nthr} spinning threads")
stop = True
