"""Optional device features the reduced-precision paths use: read from the driver, never assumed.

``read_features`` queries ``VkPhysicalDeviceFeatures2`` with the 16-bit storage and float16/int8
feature structs chained; ``feature_chain`` builds the pNext chain that enables the ones present at
``vkCreateDevice`` (a SPIR-V module using ``StorageBuffer16BitAccess`` is invalid on a device
created without it). ``$INFERD_VK_MASK_FEATURES`` (comma-separated names, or ``all``) hides features
as if the driver lacked them: the fallback paths are tested that way on a device that has them.

``shaderIntegerDotProduct`` (VK_KHR_shader_integer_dot_product) lets the int8 convolution use the packed 4x8-bit
dot product; ``integerDotProduct4x8Accelerated`` says the device runs it on dedicated units (every signedness)
and its driver is not one known to get it wrong (``BAD_DOT_DRIVERS``): only then is it the default.

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
            "shaderFloat16", "shaderInt8", "cooperativeMatrixNV", "shaderIntegerDotProduct",
            "integerDotProduct4x8Accelerated")
#: drivers whose "accelerated" packed integer dot products are known to compute wrong answers (AMD's drivers on
#: GCN and RDNA 1-2, design notes): the int8 kernels keep their plain int32 path there
BAD_DOT_DRIVERS = ("VK_DRIVER_ID_AMD_PROPRIETARY", "VK_DRIVER_ID_AMD_OPEN_SOURCE")
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


def _dot_accelerated(vk: Any, physical: Any, exts: set[str]) -> bool:
    """Whether the 4x8-bit packed dot products (signed, unsigned and mixed: every int8/uint8 pairing) run on the
    device's integer dot-product units, on a driver not known to get them wrong."""
    pr = vk.VkPhysicalDeviceShaderIntegerDotProductProperties()
    dr = vk.VkPhysicalDeviceDriverProperties(pNext=pr) if "VK_KHR_driver_properties" in exts else None
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=dr if dr is not None else pr))
    if dr is not None and int(dr.driverID) in {int(getattr(vk, n, -1)) for n in BAD_DOT_DRIVERS}:
        log.info("Vulkan: integer dot products reported accelerated by a driver known to get them wrong; not used")
        return False
    return bool(pr.integerDotProduct4x8BitPackedSignedAccelerated
                and pr.integerDotProduct4x8BitPackedUnsignedAccelerated
                and pr.integerDotProduct4x8BitPackedMixedSignednessAccelerated)


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
        idp = None
        if "VK_KHR_shader_integer_dot_product" in exts:
            idp = head = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(pNext=head)
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
        if idp is not None and idp.shaderIntegerDotProduct:
            out["shaderIntegerDotProduct"] = True
            try:
                out["integerDotProduct4x8Accelerated"] = _dot_accelerated(vk, physical, exts)
            except Exception as e:
                log.info("Vulkan: integer dot-product properties not readable (%s); not using them", e)
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
    head = vk.VkPhysicalDevice16BitStorageFeatures(
        storageBuffer16BitAccess=features.get("storageBuffer16BitAccess", False),
        uniformAndStorageBuffer16BitAccess=features.get("uniformAndStorageBuffer16BitAccess", False),
        storagePushConstant16=features.get("storagePushConstant16", False))
    if features.get("shaderFloat16") or features.get("shaderInt8"):
        exts.append("VK_KHR_shader_float16_int8")  # read_features reports them only where it is present
        head = vk.VkPhysicalDeviceShaderFloat16Int8Features(shaderFloat16=features.get("shaderFloat16", False),
                                                           shaderInt8=features.get("shaderInt8", False), pNext=head)
        if features.get("cooperativeMatrixNV"):
            exts += list(COOP_EXTS)
            cm = vk.VkPhysicalDeviceCooperativeMatrixFeaturesNV(cooperativeMatrix=True, pNext=head)
            head = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(vulkanMemoryModel=True, pNext=cm)
    if features.get("shaderIntegerDotProduct"):  # qconv_dot.comp's SPIR-V needs it on, accelerated or not
        exts.append("VK_KHR_shader_integer_dot_product")
        head = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(shaderIntegerDotProduct=True, pNext=head)
    return head, exts
