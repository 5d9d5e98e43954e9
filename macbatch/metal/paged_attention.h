// Helpers for paged_attention.metal (passed to mx.fast.metal_kernel as `header`).
// Plain MSL: no threadgroup arrays here, no pointers to metadata arrays (those may arrive in the
// `constant` address space when small).

// Every K/V page element the kernel reads goes through here, so the emulator (which defines
// MSLEMU_COUNT_BYTES; a Metal build never does) can count the bytes moved per dispatch.
template <typename T>
inline float kv_load(const device T* pages, uint index) {
#ifdef MSLEMU_COUNT_BYTES
  mslemu_count_bytes(sizeof(T));
#endif
  return float(pages[index]);
}

// Quantized pages (format in quant.py): one byte of codes, and one float16 of a (scale, bias)
// pair, counted the same way. Templated on the pointer type so that, with float pages (where the
// scales argument is a 1-element placeholder passed as `constant`), the unused branch still
// compiles.
template <typename P>
inline uint kv_load_byte(P codes, uint index) {
#ifdef MSLEMU_COUNT_BYTES
  mslemu_count_bytes(1);
#endif
  return uint(codes[index]);
}

template <typename S>
inline float kv_load_scale(S scales, uint index) {
#ifdef MSLEMU_COUNT_BYTES
  mslemu_count_bytes(2);
#endif
  return float(scales[index]);
}

// Gemma-style logit softcap: cap * tanh(score / cap).
inline float soft_cap(float score, float cap) {
  return cap * metal::precise::tanh(score / cap);
}

// Rescale factor of an online-softmax state whose running max moves from m_old to m_new (base 2).
// Nothing seen yet (both -inf) leaves the state unchanged.
inline float rescale_factor(float m_old, float m_new) {
  return m_new == -INFINITY ? 1.0f : metal::exp2(m_old - m_new);
}
