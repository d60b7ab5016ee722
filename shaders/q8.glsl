// 8-bit tensors (int8 / uint8) in 32-bit words, for devices without 8-bit storage: element i is byte
// i & 3 of word i >> 2 (little-endian, as the host lays out the bytes). Loads sign- or zero-extend;
// a shader that writes 8-bit outputs computes four consecutive elements per invocation and stores them
// as one word (Q8PACK), so no two invocations write the same word.
int q8s(uint word, uint i) { return bitfieldExtract(int(word), int((i & 3u) << 3u), 8); }
int q8u(uint word, uint i) { return int(bitfieldExtract(word, int((i & 3u) << 3u), 8)); }
#define Q8LD(signed_, buf, i) ((signed_) != 0 ? q8s(buf[(i) >> 2u], (i)) : q8u(buf[(i) >> 2u], (i)))
#define Q8PACK(word, j, v) ((word) | ((uint(v) & 0xFFu) << (8u * (j))))

// The requantisation of onnxruntime's MLAS (MlasRequantizeOutput): rint(float(acc) * m) + zp, rounding half to
// even, in float32 with no fused multiply-add (``precise``), then clamped to [lo, hi] (the type's range, or the
// integer clamp of a fused Relu/Clip).
int q8requant(int acc, float m, int zp, int lo, int hi) {
    precise float v = float(acc) * m;
    v = roundEven(v) + float(zp);
    return int(clamp(v, float(lo), float(hi)));
}
