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
    inferd bench memory [--models a,b] [--points N] [--repeat N] [--out DIR] [--no-ncnn]  models inside memory
                                                                           budgets vs ncnn/onnxruntime peak memory
    inferd bench ops [--repeat N] [--out DIR]                              TopK, NMS, RoiAlign nodes vs onnxruntime
    inferd bench coexec [--testbed a|none] [--parts sync,layers,e2e] [--models a,b] [--out DIR]
                                                                           CPU-GPU co-execution vs either alone
    inferd bench precision [--device vulkan|cpu] [--models a,b] [--arms fp32,fp16] [--no-ncnn]
                                                                           fp32 vs fp16 (warm, cold, bytes, error)
                                                                           vs ncnn's default fp16
    inferd bench quant [--models a,b] [--schemes s,t] [--repeat N] [--out DIR]   int8 vs fp32 vs onnxruntime on
                                                                           the same quantised model
"""
from __future__ import annotations

import sys


#: subcommand -> module (in this package) whose ``main(argv)`` runs it; no subcommand: the engine bench
BENCHES = {
    "daemon": "daemon_bench", "auth": "auth_bench", "cold": "cold_bench", "shapes": "shapes_bench",
    "faults": "fault_bench", "recurrent": "recurrent_bench", "predictor": "predictor_bench",
    "memory": "memory_bench", "ops": "ops_bench", "coexec": "coexec_bench", "precision": "precision_bench",
    "quant": "quant_bench",
    "vulkan": "vulkan_bench",
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in BENCHES:
        return int(importlib.import_module(f".{BENCHES[argv[0]]}", __name__).main(argv[1:]))
    from .engine_bench import main as engine_main
    return engine_main(argv)
