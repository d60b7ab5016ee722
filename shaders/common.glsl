// Shared helpers for every compute shader (included textually by inferd.vulkan.shaders).

// Linear invocation id over a grid that may be 2-D when the element count exceeds
// maxComputeWorkGroupCount[0] * local size (see inferd.vulkan.kernel.grid).
uint gid() {
    return gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * gl_WorkGroupSize.x) + gl_GlobalInvocationID.x;
}
