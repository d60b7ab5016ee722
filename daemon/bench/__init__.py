"""``inferd bench``: measurements against peers in the same run, written to bench/results/.

    inferd bench [--device cpu] [--models a,b] [--repeat N] [--out DIR]   engine vs onnxruntime
    inferd bench daemon [--out DIR]                                        daemon round trip vs in-process
    inferd bench auth [--out DIR] [--n N]                                  ipc vs TCP vs CURVE; quiet client under a flood
    inferd bench vulkan [--models a,b] [--out DIR]                         Vulkan vs ncnn Vulkan
    inferd bench cold [--device cpu|vulkan] [--models a,b] [--repeat N] [--out DIR] [--no-ncnn]
                      [--ablation] [--background]                          cold inference vs peers and floor
    inferd bench shapes [--device cpu|vulkan] [--models a,b] [--out DIR]   dynamic dims: new shape vs cold load,
                                                                           warm at 3 shapes vs onnxruntime
    inferd bench faults [--device vulkan|cpu] [--models a,b] [--repeat N]  device-loss recovery, warm restart
    inferd bench recurrent [--models a,b] [--repeat N] [--out DIR]          recurrent zoo vs onnxruntime, VAD chunk
                                                                           through the daemon vs a pyzmq echo
    inferd bench predictor [--device cpu|vulkan] [--predictor FILE] [--out DIR]  latency predictor vs measured
    inferd bench quant [--models a,b] [--schemes s,t] [--repeat N] [--out DIR]   int8 vs fp32 vs onnxruntime on
                                                                           the same quantised model
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "daemon":
        from .daemon_bench import main as daemon_main
        return daemon_main(argv[1:])
    if argv and argv[0] == "auth":
        from .auth_bench import main as auth_main
        return auth_main(argv[1:])
    if argv and argv[0] == "cold":
        from .cold_bench import main as cold_main
        return cold_main(argv[1:])
    if argv and argv[0] == "shapes":
        from .shapes_bench import main as shapes_main
        return shapes_main(argv[1:])
    if argv and argv[0] == "faults":
        from .fault_bench import main as faults_main
        return faults_main(argv[1:])
    if argv and argv[0] == "recurrent":
        from .recurrent_bench import main as rec_main
        return rec_main(argv[1:])
    if argv and argv[0] == "predictor":
        from .predictor_bench import main as predictor_main
        return predictor_main(argv[1:])
    if argv and argv[0] == "quant":
        from .quant_bench import main as quant_main
        return quant_main(argv[1:])
    if argv and argv[0] == "vulkan":
        from .vulkan_bench import main as vk_main
        return vk_main(argv[1:])
    from .engine_bench import main as engine_main
    return engine_main(argv)
