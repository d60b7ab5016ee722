"""Optional device features the reduced-precision paths use: read from the driver, never assumed.

``read_features`` queries ``VkPhysicalDeviceFeatures2`` with the 16-bit storage and float16/int8
feature structs chained; ``feature_chain`` builds the pNext chain that enables the ones present at
``vkCreateDevice`` (a SPIR-V module using ``StorageBuffer16BitAccess`` is invalid on a device
created without it). ``$INFERD_VK_MASK_FEATURES`` (comma-separated names, or ``all``) hides features
as if the driver lacked them: the fallback paths are tested that way on a device that has them.

``cooperativeMatrixNV`` stands for what ``conv_gemm_coop.comp`` needs: VK_NV_cooperative_matrix with a
16x16x16 fp16 x fp16 + fp32 subgroup shape, the Vulkan memory model (the shader's SPIR-V declares it)
and shaderFloat16. Its shape is checked in the driver's property list when the instance can list it.
"""
from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("inferd.vulkan")

#: the features the precision planner reads (names as in the Vulkan structs)
FEATURES = ("storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess", "storagePushConstant16",
            "shaderFloat16", "shaderInt8", "cooperativeMatrixNV")
COOP_EXTS = ("VK_NV_cooperative_matrix", "VK_KHR_vulkan_memory_model")
#: VkComponentTypeNV / VkScopeNV values of the one shape conv_gemm_coop.comp uses
_FLOAT16, _FLOAT32, _SCOPE_SUBGROUP = 0, 1, 3
MASK_ENV = "INFERD_VK_MASK_FEATURES"


def masked() -> set[str]:
    raw = os.environ.get(MASK_ENV, "")
    names = {s.strip() for s in raw.split(",") if s.strip()}
    return set(FEATURES) if "all" in names else names


def _coop_shape_listed(vk: Any, instance: Any, physical: Any) -> bool:
    """Whether the driver lists the 16x16x16 fp16 x fp16 + fp32 -> fp32 subgroup shape."""
    get = vk.vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV")
    for c in get(physical):
        if (int(c.MSize), int(c.NSize), int(c.KSize)) == (16, 16, 16) and int(c.scope) == _SCOPE_SUBGROUP and \
                (int(c.AType), int(c.BType), int(c.CType), int(c.DType)) == (_FLOAT16, _FLOAT16, _FLOAT32, _FLOAT32):
            return True
    return False


def read_features(vk: Any, physical: Any, api_version: int, instance: Any = None) -> dict[str, bool]:
    """The optional features of ``physical`` (all False on a driver that cannot report them)."""
    out = {f: False for f in FEATURES}
    try:
        exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)}
        coop = all(e in exts for e in COOP_EXTS)
        f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features()
        s16 = vk.VkPhysicalDevice16BitStorageFeatures(pNext=f16)
        cm = mm = None
        head: Any = s16
        if coop:
            cm = vk.VkPhysicalDeviceCooperativeMatrixFeaturesNV(pNext=s16)
            mm = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(pNext=cm)
            head = mm
        f2 = vk.VkPhysicalDeviceFeatures2(pNext=head)
        vk.vkGetPhysicalDeviceFeatures2(physical, f2)
        for f in FEATURES[:3]:
            out[f] = bool(getattr(s16, f))
        # the instance asks for Vulkan 1.1: float16/int8 come through their extension (core only in 1.2)
        if "VK_KHR_shader_float16_int8" in exts:
            out["shaderFloat16"] = bool(f16.shaderFloat16)
            out["shaderInt8"] = bool(f16.shaderInt8)
        if coop and cm is not None and mm is not None and cm.cooperativeMatrix and mm.vulkanMemoryModel \
                and out["shaderFloat16"]:
            try:
                out["cooperativeMatrixNV"] = instance is not None and _coop_shape_listed(vk, instance, physical)
            except Exception as e:
                log.info("Vulkan: cooperative-matrix shapes not readable (%s); not using them", e)
    except Exception as e:  # a 1.0-only driver: no optional features
        log.info("Vulkan: device features not readable (%s); assuming none", e)
    hide = masked()
    if hide:
        log.info("Vulkan: features masked by $%s: %s", MASK_ENV, ", ".join(sorted(hide & set(FEATURES))))
        for f in hide & set(FEATURES):
            out[f] = False
    return out


def feature_chain(vk: Any, features: dict[str, bool], api_version: int) -> tuple[Any, list[str]]:
    """(pNext chain for ``VkDeviceCreateInfo``, extensions to enable) turning on the present features."""
    exts: list[str] = []
    s16 = vk.VkPhysicalDevice16BitStorageFeatures(
        storageBuffer16BitAccess=features.get("storageBuffer16BitAccess", False),
        uniformAndStorageBuffer16BitAccess=features.get("uniformAndStorageBuffer16BitAccess", False),
        storagePushConstant16=features.get("storagePushConstant16", False))
    if not (features.get("shaderFloat16") or features.get("shaderInt8")):
        return s16, exts
    exts.append("VK_KHR_shader_float16_int8")  # read_features reports them only where it is present
    f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(shaderFloat16=features.get("shaderFloat16", False),
                                                      shaderInt8=features.get("shaderInt8", False), pNext=s16)
    if not features.get("cooperativeMatrixNV"):
        return f16, exts
    exts += list(COOP_EXTS)
    cm = vk.VkPhysicalDeviceCooperativeMatrixFeaturesNV(cooperativeMatrix=True, pNext=f16)
    return vk.VkPhysicalDeviceVulkanMemoryModelFeatures(vulkanMemoryModel=True, pNext=cm), exts
