// Helpers for paged_attention.metal (passed to mx.fast.metal_kernel as `header`).
// Plain MSL: no threadgroup arrays here, no pointers to metadata arrays (those may arrive in the
// `constant` address space when small).

// Every K/V page read goes through here (a float page element, a byte of quantized codes or a
// float16 scale or bias), so the emulator (which defines MSLEMU_COUNT_BYTES; a Metal build never
// does) can count the bytes moved per dispatch. Templated on the pointer type: with float pages
// the unused scales argument is a 1-element placeholder passed as `constant`.
template <typename P>
inline float kv_load(P pages, uint index) {
#ifdef MSLEMU_COUNT_BYTES
  mslemu_count_bytes(sizeof(pages[index]));
#endif
  return float(pages[index]);
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
