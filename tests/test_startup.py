"""What the daemon's start imports: the libraries few models need stay out until a model needs them.

ml_dtypes 0.7 took 0.7 s to import and scipy.special 0.2 s, of the daemon's 1.34 s of imports on the 2-core VM
(a start that systemd, a restart after a crash and every `inferd.load` pay). Each assertion runs in a fresh
interpreter: this one has imported everything already."""
from __future__ import annotations

import subprocess
import sys


def _child(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_the_daemon_and_the_library_import_without_ml_dtypes_scipy_or_onnx() -> None:
    out = _child("import sys\n"
                 "import inferd, inferd.server.daemon, inferd.runtime.model\n"
                 "print(sorted({m.split('.')[0] for m in sys.modules} & {'ml_dtypes', 'scipy', 'onnx'}))\n")
    assert out.strip() == "[]", out


def test_bfloat16_maps_both_ways_when_first_asked_in_a_fresh_process() -> None:
    out = _child("import sys\n"
                 "import numpy as np\n"
                 "from inferd.errors import UnsupportedOpError\n"
                 "from inferd.ops.tensor import numpy_to_onnx, onnx_dtype\n"
                 "assert 'ml_dtypes' not in sys.modules\n"
                 "dt = onnx_dtype(16)\n"
                 "import ml_dtypes\n"
                 "assert dt == np.dtype(ml_dtypes.bfloat16), dt\n"
                 "assert numpy_to_onnx(ml_dtypes.bfloat16) == 16\n"
                 "assert numpy_to_onnx(np.float32) == 1\n"
                 "try:\n"
                 "    numpy_to_onnx(ml_dtypes.float8_e4m3fn)\n"
                 "except UnsupportedOpError as e:\n"
                 "    print('refused', e)\n")
    assert "refused" in out and "float8_e4m3fn" in out, out


def test_bfloat16_made_elsewhere_maps_before_any_model_asked() -> None:
    # an array a caller built with ml_dtypes, before inferd ever needed the type itself
    out = _child("import ml_dtypes, numpy as np\n"
                 "from inferd.ops.tensor import numpy_to_onnx\n"
                 "print(numpy_to_onnx(np.zeros(2, ml_dtypes.bfloat16).dtype))\n")
    assert out.strip() == "16", out
