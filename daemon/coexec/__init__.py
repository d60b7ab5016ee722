"""CPU-GPU co-execution: layers split by output channels between inferd's CPU kernels and a Vulkan device
sharing host memory (``engine``), how a layer splits (``split_ops``); the planner is ``inferd.planner.split``."""
