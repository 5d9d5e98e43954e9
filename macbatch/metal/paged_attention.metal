// Varlen paged attention: ONE dispatch serves a whole mixed step (decode rows and prefill chunks
// of many sequences). The host (kernels.py) lists one work item per threadgroup:
//   work[w] = {seq, kv_head, qv_start, qv_count, part}
// A "query vector" (qv) is one (query row, query head) pair of the sequence; qv index
// = row * G + g for the G query heads that share kv_head. A work item owns up to MAXQV = NSG * QPS
// consecutive qvs of one sequence and one KV head, so:
//   - decode rows: the G query heads of a KV group sit in one tile and share every K/V page read
//     (each K/V byte is read once per sequence and KV head, not once per query head);
//   - prefill chunks: MAXQV / G query rows form a tile that shares each K/V load; keys above the
//     tile's causal diagonal and blocks before its sliding window are never loaded;
//   - long decode contexts with too few work items to fill the GPU are split into `num_splits`
//     key ranges (part >= 0); each writes an unnormalised partial (max, sum, acc) and a second
//     pass (a log-sum-exp merge in kernels.py) combines them.
// Inside a threadgroup: NSG SIMD-groups of 32 lanes. K/V arrive in chunks of TK keys (TK divides
// the block size, so a chunk is contiguous in one page), converted to float once, in threadgroup
// memory. SIMD-group sg owns qvs sg, sg + NSG, ...; for each, lane j scores key j of the chunk
// (q is broadcast from threadgroup memory), a simd_max / simd_sum pair updates the float32 online
// softmax in base 2 (log2(e) is folded into the query scale), and lane l accumulates output
// dimensions l, l + 32, ... from the chunk's V rows.
// Quantized pages (BITS 8 or 4, format in quant.py: uint8 codes, float16 (scale, bias) per token
// row and group of GS head-dim elements): each chunk's scales are read once into threadgroup
// memory, then every byte of codes once, dequantized straight into the same float chunk as float
// pages. BITS 0: float pages of type T; k_scales / v_scales are unused placeholders.
// Sparse attention (SPARSE, `selected` [N, top_k]: the positions each query row attends to, -1
// unused): a tile holds query heads of ONE row (rows select differently), and the chunk loop
// walks entries of that row's list instead of keys; entry t of a chunk is loaded from wherever
// the block table puts its position, only when the row may see it, so only listed rows are read.
// Everything after the load is the dense path's. Dense calls pass a 1-element placeholder.
// Template: T (element type), D (head dim), BS (block size), TK, NSG, QPS, SOFTCAP, SINKS, BITS,
// GS, SPARSE.
// params_i = {num_q_heads, num_kv_heads, max_blocks, sliding_window (0: none), num_splits, top_k}
// params_f = {scale, softcap}

constexpr int MAXQV = NSG * QPS;
constexpr int DE = (D + 31) / 32;
constexpr int NT = NSG * 32;
constexpr int NGS = BITS > 0 ? D / GS : 1;     // scale groups per key row
constexpr int EPB = BITS > 0 ? 8 / BITS : 1;   // codes per byte
constexpr int RB = D / EPB;                    // bytes of codes per key row

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

threadgroup float qs[MAXQV * D];
threadgroup float ks[TK * D];
threadgroup float vs[TK * D];
threadgroup float ps[MAXQV * 32];
threadgroup float ksb[TK * NGS * 2];  // (scale, bias) of the chunk's key rows (quantized pages)
threadgroup float vsb[TK * NGS * 2];

// The query tile, pre-scaled (and in base 2 unless the softcap needs the natural-scale score).
const float q_scale = SOFTCAP ? params_f[0] : params_f[0] * M_LOG2E_F;
for (int i = tid; i < MAXQV * D; i += NT) {
  const int v = i / D;
  float x = 0.0f;
  if (v < nqv) {
    const int flat = qv0 + v;
    const int head = kvh * group + flat % group;
    x = float(q[((q_begin + flat / group) * hq + head) * D + i % D]) * q_scale;
  }
  qs[i] = x;
}

// Keys any row of the tile can see (this split's share of them): [k_begin, k_end).
const KeyRange keys =
    visible_keys(first_pos, qv0, nqv, group, window, top_k, part, num_splits, TK);
const int k_begin = keys.begin;
const int k_end = keys.end;

float m[QPS];
float l[QPS];
float acc[QPS][DE];
for (int j = 0; j < QPS; ++j) {
  m[j] = -INFINITY;
  l[j] = 0.0f;
  for (int e = 0; e < DE; ++e) {
    acc[j][e] = 0.0f;
  }
}

for (int c = (k_begin / TK) * TK; c < k_end; c += TK) {
  threadgroup_barrier(mem_flags::mem_threadgroup);  // the previous chunk (or q tile) is done
  const uint block = SPARSE ? 0u : uint(block_tables[table_base + c / BS]);
  const uint row0 = (block * uint(hkv) + uint(kvh)) * uint(BS) + uint(c % BS);
  if (BITS == 0) {
    for (int i = tid; i < TK * D; i += NT) {
      const int key = c + i / D;  // the chunk's entry (dense: the key itself)
      const bool live = key >= k_begin && key < k_end;
      const int at_key = entry_key(SPARSE, selected, list_base, key, live, row_pos, window);
      const uint at = chunk_row(SPARSE, block_tables, table_base, hkv, kvh, BS, row0, i / D,
                                at_key) * uint(D) +
                      uint(i % D);
      ks[i] = at_key >= 0 ? kv_load(k_pages, at) : 0.0f;
      vs[i] = at_key >= 0 ? kv_load(v_pages, at) : 0.0f;
    }
  } else {
    for (int i = tid; i < TK * NGS * 2; i += NT) {
      const int r = i / (NGS * 2);
      const bool live = c + r >= k_begin && c + r < k_end;
      const int key = entry_key(SPARSE, selected, list_base, c + r, live, row_pos, window);
      const uint at = chunk_row(SPARSE, block_tables, table_base, hkv, kvh, BS, row0, r, key) *
                          uint(NGS * 2) +
                      uint(i % (NGS * 2));
      ksb[i] = key >= 0 ? kv_load(k_scales, at) : 0.0f;
      vsb[i] = key >= 0 ? kv_load(v_scales, at) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = tid; i < TK * RB; i += NT) {
      const int r = i / RB;
      const bool live = c + r >= k_begin && c + r < k_end;
      const int key = entry_key(SPARSE, selected, list_base, c + r, live, row_pos, window);
      const uint at =
          chunk_row(SPARSE, block_tables, table_base, hkv, kvh, BS, row0, r, key) * uint(RB) +
          uint(i % RB);
      const uint kbyte = key >= 0 ? uint(kv_load(k_pages, at)) : 0u;
      const uint vbyte = key >= 0 ? uint(kv_load(v_pages, at)) : 0u;
      for (int e = 0; e < EPB; ++e) {
        const int d = (i % RB) * EPB + e;
        const int sb = (r * NGS + d / GS) * 2;
        const float kc = float((kbyte >> uint(BITS * e)) & uint((1 << BITS) - 1));
        const float vc = float((vbyte >> uint(BITS * e)) & uint((1 << BITS) - 1));
        ks[r * D + d] = kc * ksb[sb] + ksb[sb + 1];
        vs[r * D + d] = vc * vsb[sb] + vsb[sb + 1];
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
    const bool live = lane < TK && c + lane >= k_begin && c + lane < k_end;
    const int key = entry_key(SPARSE, selected, list_base, c + lane, live, pos, window);
    const bool visible = key >= 0 && key <= pos && (window <= 0 || key > pos - window);
    float s = -INFINITY;
    if (visible) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) {
        dot += qs[v * D + d] * ks[lane * D + d];
      }
      s = SOFTCAP ? soft_cap(dot, params_f[1]) * M_LOG2E_F : dot;
    }
    const float m_new = max(m[j], simd_max(s));
    const float alpha = rescale_factor(m[j], m_new);
    const float p = visible ? metal::exp2(s - m_new) : 0.0f;
    l[j] = l[j] * alpha + simd_sum(p);
    m[j] = m_new;
    ps[v * 32 + lane] = p;
    simdgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = 0; e < DE; ++e) {
      const int d = e * 32 + lane;
      float a = acc[j][e] * alpha;
      if (d < D) {
        for (int t = 0; t < TK; ++t) {
          a += ps[v * 32 + t] * vs[t * D + d];
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
    for (int e = 0; e < DE; ++e) {
      const int d = e * 32 + lane;
      if (d < D) {
        part_acc[slot * D + d] = acc[j][e];
      }
    }
  } else {
    float total = l[j];
    float keep = 1.0f;
    if (SINKS) {
      // The sink joins the denominator only.
      const float sink = sinks[head] * M_LOG2E_F;
      const float m_all = max(m[j], sink);
      keep = metal::exp2(m[j] - m_all);
      total = total * keep + metal::exp2(sink - m_all);
    }
    const float norm = keep / total;
    const int row = q_begin + flat / group;
    for (int e = 0; e < DE; ++e) {
      const int d = e * 32 + lane;
      if (d < D) {
        out[(row * hq + head) * D + d] = T(acc[j][e] * norm);
      }
    }
  }
}
