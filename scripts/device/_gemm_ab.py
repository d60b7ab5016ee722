"""One build of inferd._native (a file path) against onnxruntime on linear-layer shapes.

python3 _gemm_ab.py SO ISA_LEVEL THREADS (see gemm-ab.sh)."""
import sys, time, importlib.util, os
import numpy as np
so, level, th = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = importlib.util.spec_from_file_location("_native", so)
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
ffi, lib = mod.ffi, mod.lib
lib.inferd_pool_set_threads(th)
got = lib.inferd_gemm_set_isa(level)
import onnx, onnx.helper as h, onnx.numpy_helper as nh, onnxruntime as ort, tempfile
shapes = [(197, 192, 576), (197, 192, 192), (197, 192, 768), (197, 768, 192), (197, 384, 1536), (197, 1536, 384),
          (3136, 96, 384), (784, 192, 768)]
def med(f, n=int(os.environ.get("NRUN", 300))):
    for _ in range(30): f()
    ts=[]
    for _ in range(n):
        a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
    return np.median(ts)*1e6
P = lambda a: ffi.cast("float*", a.ctypes.data)
for M,K,N in shapes:
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((K,N))*0.05).astype(np.float32); B = rng.standard_normal(N).astype(np.float32)
    x = rng.standard_normal((M,K)).astype(np.float32); y = np.empty((M,N),np.float32)
    raw = np.empty(lib.inferd_gemm_packed_b_size(K,N)+64, np.float32)
    off = (-raw.ctypes.data % 64) // 4; bp = raw[off:off + lib.inferd_gemm_packed_b_size(K,N)]
    assert bp.ctypes.data % 64 == 0
    lib.inferd_gemm_pack_b(P(W), N, 1, K, N, P(bp))
    args = (M,K,N,1,P(x),K,1,0,0,P(bp),0,0,0,1,P(y),N,1,0,P(B),0,1,ffi.NULL,0,0,0.0,0.0,0)
    call = lambda: lib.inferd_gemm_ex(*args)
    call(); err = float(np.abs(y - (x.astype(np.float64)@W+B)).max())
    g = h.make_graph([h.make_node("Gemm",["x","W","B"],["y"])], "g", [h.make_tensor_value_info("x",1,[M,K])],
        [h.make_tensor_value_info("y",1,[M,N])],[nh.from_array(W,"W"), nh.from_array(B,"B")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("",17)]); m.ir_version=8
    p = tempfile.mkdtemp()+"/g.onnx"; onnx.save(m,p)
    so_ = ort.SessionOptions(); so_.intra_op_num_threads = th
    s = ort.InferenceSession(p, so_, providers=["CPUExecutionProvider"])
    ri, ro = [], []
    for r in range(int(os.environ.get("ROUNDS", 4))):
        ri.append(med(call)); ro.append(med(lambda: s.run(None, {"x": x})))
    ti, to = min(ri), min(ro); fl = 2*M*K*N
    print(f"{os.path.basename(so)} isa{got} th{th} {M}x{K}x{N}: inferd {ti:8.1f} us ({fl/ti/1e3:4.0f} GF/s) "
          f"ort {to:8.1f} us ({fl/to/1e3:4.0f} GF/s) ratio {ti/to:.3f} err {err:.1e}", flush=True)
