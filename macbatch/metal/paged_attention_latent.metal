// Varlen paged attention over latent pages (MLA): the work list, split-KV parts and output of
// paged_attention.metal, for rows of D columns whose leading DV columns are the values.
//   work[w] = {seq, kv_head, qv_start, qv_count, part}
// A token's cache is one row of one KV head: each chunk of TK rows is read from the pages once
// (dequantized once when quantized) into threadgroup memory and serves as both keys and values.
// Every query head of a wide group (16 to 128 heads share the one latent head) reads the same
// chunk, MAXQV = NSG * QPS query vectors per threadgroup.
// The row is too wide for a lane to hold a whole key (576 = 512 + 64 columns), so the work is
// split over columns instead of keys: lane l holds columns l, l + 32, ... of its SIMD-group's
// QPS query vectors in registers and of their DV-wide accumulators; a key's score is a
// simd_sum of the lanes' partial dot products (reads of the chunk are consecutive across lanes,
// free of bank conflicts), and the online softmax (base 2, float32) advances a chunk at a time.
// Sparse attention (SPARSE) as in paged_attention.metal: a tile holds query heads of one row, its
// chunks are entries of the row's list of selected positions, each row loaded from wherever the
// block table puts it and only when the row may see it.
// A second source of rows (ROWS, with SPARSE; DeepSeek V4's compressed rows): after its top_k
// token entries (padded to whole chunks) a tile's range holds the row_top_k entries of its row's
// list of rows (`row_selected`, -1: none), each found through the rows' own block table
// (`row_table`, RBS rows per block) in `row_pages` (`row_scales`), in the same format as the
// token pages; a chunk holds entries of one source only, so everything after the load, the
// split parts and the merge are unchanged. The caller lists only rows the query row may read.
// Template: T, D (row width), DV (value width), BS, TK, NSG, QPS, SOFTCAP, SINKS, BITS, GS,
// SPARSE, ROWS, RBS.
// params_i = {num_q_heads, num_kv_heads, max_blocks, sliding_window (0: none), num_splits, top_k,
//             row_top_k, row_max_blocks}
// params_f = {scale, softcap}

constexpr int MAXQV = NSG * QPS;
constexpr int DE = (D + 31) / 32;    // row columns per lane
constexpr int DVE = (DV + 31) / 32;  // value columns per lane
constexpr int NT = NSG * 32;
constexpr int NGS = BITS > 0 ? D / GS : 1;    // scale groups per row
constexpr int EPB = BITS > 0 ? 8 / BITS : 1;  // codes per byte
constexpr int RB = D / EPB;                   // bytes of codes per row

const int tid = int(thread_index_in_threadgroup);
const int sg = int(simdgroup_index_in_threadgroup);
const int lane = int(thread_index_in_simdgroup);
const int w = int(threadgroup_position_in_grid.x);

const AttentionWork item = read_work_item(work, params_i, seq_lens, cu_seqlens_q, w);
const int seq = item.seq;
const int kvh = item.kvh;
const int qv0 = item.qv0;
const int nqv = item.nqv;
const int part = item.part;
const int hq = item.hq;
const int hkv = item.hkv;
const int max_blocks = item.max_blocks;
const int window = item.window;
const int num_splits = item.num_splits;
const int group = item.group;
const int q_begin = item.q_begin;
const int first_pos = item.first_pos;  // position of the sequence's first query row
const int top_k = item.top_k;
const int table_base = seq * max_blocks;
// Sparse: the tile's row, its position and its list of selected positions.
const int row_pos = first_pos + qv0 / group;
const int list_base = (q_begin + qv0 / group) * top_k;
// The second source: its entries follow the tokens' at split_at, a chunk boundary.
const int row_top_k = ROWS ? params_i[6] : 0;
const int split_at = ROWS ? (top_k + TK - 1) / TK * TK : top_k;
const int row_list_base = (q_begin + qv0 / group) * row_top_k;
const int row_table_base = ROWS ? seq * params_i[7] : 0;

threadgroup float rows[TK * D];
threadgroup float rsb[TK * NGS * 2];  // (scale, bias) of the chunk's rows (quantized pages)

// This SIMD-group's query vectors j * NSG + sg, pre-scaled (base 2 unless softcapped).
const float q_scale = SOFTCAP ? params_f[0] : params_f[0] * M_LOG2E_F;
float qr[QPS][DE];
float m[QPS];
float l[QPS];
float acc[QPS][DVE];
for (int j = 0; j < QPS; ++j) {
  const int v = j * NSG + sg;
  const int flat = qv0 + v;
  const int head = kvh * group + flat % group;
  for (int e = 0; e < DE; ++e) {
    const int d = e * 32 + lane;
    qr[j][e] = v < nqv && d < D
                   ? float(q[((q_begin + flat / group) * hq + head) * D + d]) * q_scale
                   : 0.0f;
  }
  m[j] = -INFINITY;
  l[j] = 0.0f;
  for (int e = 0; e < DVE; ++e) {
    acc[j][e] = 0.0f;
  }
}

const KeyRange keys =
    visible_keys(first_pos, qv0, nqv, group, window, split_at + row_top_k, part, num_splits, TK);
const int k_begin = keys.begin;
const int k_end = keys.end;

for (int c = (k_begin / TK) * TK; c < k_end; c += TK) {
  threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous chunk is done
  const bool second = ROWS && c >= split_at;         // the chunk's source, uniform
  // Where the chunk's live entries end: a token chunk's before the padding up to split_at.
  const int c_end = ROWS && !second ? min(k_end, top_k) : k_end;
  const uint block = SPARSE ? 0u : uint(block_tables[table_base + c / BS]);
  const uint row0 = (block * uint(hkv) + uint(kvh)) * uint(BS) + uint(c % BS);
  if (BITS == 0) {
    for (int i = tid; i < TK * D; i += NT) {
      const int t = i / D;
      const bool live = c + t >= k_begin && c + t < c_end;
      const int key = second
                          ? listed_row(row_selected, row_list_base, c + t - split_at, live)
                          : entry_key(SPARSE, selected, list_base, c + t, live, row_pos, window);
      const uint row = second ? source_row(row_table, row_table_base, RBS, key)
                              : chunk_row(SPARSE, block_tables, table_base, hkv, kvh, BS, row0, t, key);
      const uint at = row * uint(D) + uint(i % D);
      rows[i] = key < 0 ? 0.0f : second ? kv_load(row_pages, at) : kv_load(k_pages, at);
    }
  } else {
    for (int i = tid; i < TK * NGS * 2; i += NT) {
      const int r = i / (NGS * 2);
      const bool live = c + r >= k_begin && c + r < c_end;
      const int key = second
                          ? listed_row(row_selected, row_list_base, c + r - split_at, live)
                          : entry_key(SPARSE, selected, list_base, c + r, live, row_pos, window);
      const uint row = second ? source_row(row_table, row_table_base, RBS, key)
                              : chunk_row(SPARSE, block_tables, table_base, hkv, kvh, BS, row0, r, key);
      const uint at = row * uint(NGS * 2) + uint(i % (NGS * 2));
      rsb[i] = key < 0 ? 0.0f : second ? kv_load(row_scales, at) : kv_load(k_scales, at);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = tid; i < TK * RB; i += NT) {
      const int r = i / RB;
      const bool live = c + r >= k_begin && c + r < c_end;
      const int key = second
                          ? listed_row(row_selected, row_list_base, c + r - split_at, live)
                          : entry_key(SPARSE, selected, list_base, c + r, live, row_pos, window);
      const uint row = second ? source_row(row_table, row_table_base, RBS, key)
                              : chunk_row(SPARSE, block_tables, table_base, hkv, kvh, BS, row0, r, key);
      const uint at = row * uint(RB) + uint(i % RB);
      const uint byte = key < 0    ? 0u
                        : second ? uint(kv_load(row_pages, at))
                                 : uint(kv_load(k_pages, at));
      for (int e = 0; e < EPB; ++e) {
        const int d = (i % RB) * EPB + e;
        const int sb = (r * NGS + d / GS) * 2;
        const float code = float((byte >> uint(BITS * e)) & uint((1 << BITS) - 1));
        rows[r * D + d] = code * rsb[sb] + rsb[sb + 1];
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  for (int j = 0; j < QPS; ++j) {
    const int v = j * NSG + sg;
    if (v >= nqv) {
      break;  // uniform across the SIMD-group
    }
    const int pos = first_pos + (qv0 + v) / group;
    // The chunk's scores, the same in every lane; -inf where the key is hidden.
    float p[TK];
    float chunk_max = -INFINITY;
    for (int t = 0; t < TK; ++t) {
      float dot = 0.0f;
      for (int e = 0; e < DE; ++e) {
        const int d = e * 32 + lane;
        if (d < D) {
          dot += qr[j][e] * rows[t * D + d];
        }
      }
      const float s = simd_sum(dot);
      const bool live = c + t >= k_begin && c + t < c_end;
      const int key = second ? listed_row(row_selected, row_list_base, c + t - split_at, live)
                             : entry_key(SPARSE, selected, list_base, c + t, live, pos, window);
      const bool visible =
          key >= 0 && (second || (key <= pos && (window <= 0 || key > pos - window)));
      p[t] = visible ? (SOFTCAP ? soft_cap(s, params_f[1]) * M_LOG2E_F : s) : -INFINITY;
      chunk_max = max(chunk_max, p[t]);
    }
    const float m_new = max(m[j], chunk_max);
    const float alpha = rescale_factor(m[j], m_new);
    float chunk_sum = 0.0f;
    for (int t = 0; t < TK; ++t) {
      p[t] = p[t] == -INFINITY ? 0.0f : metal::exp2(p[t] - m_new);
      chunk_sum += p[t];
    }
    l[j] = l[j] * alpha + chunk_sum;
    m[j] = m_new;
    for (int e = 0; e < DVE; ++e) {
      const int d = e * 32 + lane;
      float a = acc[j][e] * alpha;
      if (d < DV) {
        for (int t = 0; t < TK; ++t) {
          a += p[t] * rows[t * D + d];
        }
      }
      acc[j][e] = a;
    }
  }
}

for (int j = 0; j < QPS; ++j) {
  const int v = j * NSG + sg;
  if (v >= nqv) {
    break;
  }
  const int flat = qv0 + v;
  const int head = kvh * group + flat % group;
  if (part >= 0) {
    const int slot = part * MAXQV + v;
    if (lane == 0) {
      part_ml[slot * 2 + 0] = m[j];
      part_ml[slot * 2 + 1] = l[j];
    }
    for (int e = 0; e < DVE; ++e) {
      const int d = e * 32 + lane;
      if (d < DV) {
        part_acc[slot * DV + d] = acc[j][e];
      }
    }
  } else {
    float total = l[j];
    float keep = 1.0f;
    if (SINKS) {
      const float sink = sinks[head] * M_LOG2E_F;
      const float m_all = max(m[j], sink);
      keep = metal::exp2(m[j] - m_all);
      total = total * keep + metal::exp2(sink - m_all);
    }
    const float norm = keep / total;
    const int row = q_begin + flat / group;
    for (int e = 0; e < DVE; ++e) {
      const int d = e * 32 + lane;
      if (d < DV) {
        out[(row * hq + head) * DV + d] = T(acc[j][e] * norm);
      }
    }
  }
}
