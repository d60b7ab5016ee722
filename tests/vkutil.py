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


def validated_shared_device(tmp: Path) -> Iterator[Any]:
    """As ``validated_device``, but the process's shared device (what ``inferd.load`` uses), opened anew with
    validation on and closed after the module."""
    import pytest

    from inferd.vulkan import device as vd

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESA_SHADER_CACHE_DIR", str(tmp / "mesa"))
        vd.close_shared_device()
        dev = vd.get_device({"debug": True, "cache_dir": str(tmp / "cache")})
        yield dev
        errors = dev.validation_errors
        vd.close_shared_device()
    assert not errors, errors[:5]
