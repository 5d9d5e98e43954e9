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

// Keys [x, y) that query vectors [qv0, qv0 + nqv) of a sequence (`group` query heads per row,
// first row at position first_pos) can see; for a split part (part >= 0) only its share of
// them, whole chunks of tk keys each (a share may be empty).
inline int2 visible_keys(
    int first_pos, int qv0, int nqv, int group, int window, int part, int num_splits, int tk) {
  const int row_lo = qv0 / group;
  const int row_hi = (qv0 + nqv - 1) / group;
  int k_end = first_pos + row_hi + 1;
  int k_begin = window > 0 ? max(0, first_pos + row_lo - window + 1) : 0;
  if (part >= 0) {
    const int base = (k_begin / tk) * tk;
    const int chunks = (k_end - base + tk - 1) / tk;
    const int per_split = (chunks + num_splits - 1) / num_splits;
    const int lo = base + (part % num_splits) * per_split * tk;
    k_begin = max(k_begin, lo);
    k_end = min(k_end, lo + per_split * tk);
  }
  return int2{k_begin, k_end};
}
