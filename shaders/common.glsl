// Shared helpers for every compute shader (included textually by inferd.vulkan.shaders).

// Linear invocation id over a grid that may be 2-D when the element count exceeds
// maxComputeWorkGroupCount[0] * local size (see inferd.vulkan.kernel.grid).
//
// GID_BASE offsets a dispatch that covers a slice of a larger grid: inferd.vulkan.kernel.split_rows cuts a
// 2-D grid into 1-D dispatches, because Mesa 22.3's lavapipe runs only part of every workgroup row y >= 1
// (a 640,000-element Relu as 100 x 25 groups left 612,000 outputs unwritten).
layout(constant_id = 1000) const uint GID_BASE = 0u;
uint gid() {
    return GID_BASE + gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * gl_WorkGroupSize.x) + gl_GlobalInvocationID.x;
}
