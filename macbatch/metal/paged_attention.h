// Helpers for paged_attention.metal and paged_attention_latent.metal (passed to
// mx.fast.metal_kernel as `header`). Plain MSL: no threadgroup arrays here, and no pointer
// parameter of a fixed address space (small metadata arrays may arrive in `constant`): a helper
// that reads an array is templated on its pointer type.

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

// Keys [begin, end) that query vectors [qv0, qv0 + nqv) of a sequence (`group` query heads per row,
// first row at position first_pos) can see; for a split part (part >= 0) only its share of
// them, whole chunks of tk keys each (a share may be empty). Sparse attention (top_k > 0): the
// entries [begin, end) of the tile's one row's list of selected positions instead.
struct KeyRange {
  int begin, end;
};

inline KeyRange visible_keys(
    int first_pos, int qv0, int nqv, int group, int window, int top_k, int part, int num_splits,
    int tk) {
  const int row_lo = qv0 / group;
  const int row_hi = (qv0 + nqv - 1) / group;
  int k_end = top_k > 0 ? top_k : first_pos + row_hi + 1;
  int k_begin = window > 0 && top_k == 0 ? max(0, first_pos + row_lo - window + 1) : 0;
  if (part >= 0) {
    const int base = (k_begin / tk) * tk;
    const int chunks = (k_end - base + tk - 1) / tk;
    const int per_split = (chunks + num_splits - 1) / num_splits;
    const int lo = base + (part % num_splits) * per_split * tk;
    k_begin = max(k_begin, lo);
    k_end = min(k_end, lo + per_split * tk);
  }
  return KeyRange{k_begin, k_end};
}

// The key behind entry e of a chunk (`live`: e is inside the tile's range), or -1 when the tile
// reads nothing there: dense, e itself (entries are keys); sparse, the position entry e of the
// row's list names, when that row (at pos) may see it. Templated on the pointer type, as kv_load.
template <typename S>
inline int entry_key(bool sparse, S selected, int list_base, int e, bool live, int pos, int window) {
  if (!live) {
    return -1;
  }
  if (!sparse) {
    return e;
  }
  const int key = selected[list_base + e];
  return key >= 0 && key <= pos && (window <= 0 || key > pos - window) ? key : -1;
}

// The pool row (one token of one KV head) of chunk entry t: dense, the t-th after the chunk's
// first row row0 (a chunk lies in one page); sparse, wherever the block table puts `key`.
template <typename B>
inline uint chunk_row(
    bool sparse, B block_tables, int table_base, int hkv, int kvh, int bs, uint row0, int t,
    int key) {
  if (!sparse) {
    return row0 + uint(t);
  }
  const int at = max(key, 0);
  return (uint(block_tables[table_base + at / bs]) * uint(hkv) + uint(kvh)) * uint(bs) +
         uint(at % bs);
}

// The second source of rows (the latent body's ROWS): entry e of the tile's row's list of rows
// (-1: none listed there, or e outside the tile's range). No causal or window rule: the caller
// lists only rows the query row may read.
template <typename S>
inline int listed_row(S row_selected, int list_base, int e, bool live) {
  return live ? row_selected[list_base + e] : -1;
}

// The pool row of the second source's row r (one KV head), through its own block table of rbs
// rows per block.
template <typename B>
inline uint source_row(B row_table, int table_base, int rbs, int r) {
  const int at = max(r, 0);
  return uint(row_table[table_base + at / rbs]) * uint(rbs) + uint(at % rbs);
}

// One work item of either kernel body: work[w] = {seq, kv_head, qv_start, qv_count, part}, the
// call's params_i = {num_q_heads, num_kv_heads, max_blocks, sliding_window, num_splits, top_k,
// row_top_k, row_max_blocks} (the last two: the latent body's second source) and where the
// item's sequence sits. Templated on the pointer types: small metadata arrays arrive in the
// `constant` address space.
struct AttentionWork {
  int seq, kvh, qv0, nqv, part;
  int hq, hkv, max_blocks, window, num_splits, top_k, group;
  int q_begin;    // the sequence's first query row in q
  int first_pos;  // the position of that row
};

template <typename W, typename P, typename S, typename C>
inline AttentionWork read_work_item(W work, P params_i, S seq_lens, C cu_seqlens_q, int w) {
  AttentionWork it;
  it.seq = work[w * 5 + 0];
  it.kvh = work[w * 5 + 1];
  it.qv0 = work[w * 5 + 2];
  it.nqv = work[w * 5 + 3];
  it.part = work[w * 5 + 4];
  it.hq = params_i[0];
  it.hkv = params_i[1];
  it.max_blocks = params_i[2];
  it.window = params_i[3];
  it.num_splits = params_i[4];
  it.top_k = params_i[5];
  it.group = it.hq / it.hkv;
  it.q_begin = cu_seqlens_q[it.seq];
  it.first_pos = seq_lens[it.seq] - (cu_seqlens_q[it.seq + 1] - it.q_begin);
  return it;
}
