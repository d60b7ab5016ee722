"""A Vulkan device for one test module, with the validation layers on: the module fails if they report any error."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator


def validated_device(tmp: Path) -> Iterator[Any]:
    """Yield a debug ``VulkanDevice`` whose caches (and Mesa's shader cache) live under ``tmp``; on teardown,
    assert that the validation layers reported nothing. Use as a module fixture's body (``yield from``)."""
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    os.environ["MESA_SHADER_CACHE_DIR"] = str(tmp / "mesa")
    dev = VulkanDevice(VulkanConfig(debug=True, cache_dir=str(tmp / "cache")))
    yield dev
    errors = dev.validation_errors
    dev.close()
    assert not errors, f"validation layer errors: {errors[:5]}"
