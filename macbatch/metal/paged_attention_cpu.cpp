// Varlen paged attention as an MLX primitive for the CPU backend (Linux, CI, a Mac's CPU stream).
//
// The contract is `reference.py`'s: packed query rows, each attending to its own sequence's keys
// read in place from the paged pool through the block table. Where the pure-MLX reference has to
// gather every sequence's pages into a contiguous copy and runs MLX's scalar `exp` (about 50M/s
// on x86), this reads each page once per (sequence, KV head, query tile), keeps an online softmax
// in registers and uses a vectorisable exp. It is built on first use by `cpu_build.py` with the
// machine's own compiler flags (-march=native) and checked against the reference before use.
//
// Pages are float (the model's dtype) or quantized to 8 or 4 bits (format in `quant.py`: uint8
// codes, one float16 scale and bias per token row and head-dim group). Either way a page is
// turned into float only in the per-thread scratch of the page being scored, never in the pool.
//
// Latent pages (MLA: `value_dim` > 0): one KV head whose rows are `head_dim` wide and whose
// leading `value_dim` columns are the values. A page's key rows are turned into float once and
// the values are read from those same floats (in place for float32 pages), so a token's row is
// read once; all query heads form one group, split across work items by heads when it is large.
//
// Sparse attention (`selected`, [N, K] int32: the positions in its own sequence each query row
// attends to, -1 unused): a work item holds one query row (rows select differently, so they share
// no page), and its key loop walks the row's list instead of the pages. The listed positions the
// row may see are gathered BS at a time into the same float scratch a page fills, so scoring,
// softmax and values are the dense path's; only the listed rows are ever read.
//
// A second source of rows (`row_selected`, [N, K2]: DeepSeek V4's compressed rows, latent pages of
// one KV head): after its tokens, a query row's item walks its list of rows in the row pages
// (their own block table and block size in rows), gathered BS at a time into the same scratch and
// folded into the same online softmax; no causal check, the caller lists what the row may read.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace nb = nanobind;
namespace mx = mlx::core;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxQueryVectors = 32;  // query vectors (rows x heads of a KV group) per work item
constexpr int64_t kMinWorkPerThread = 1 << 16;  // query vectors x keys, about 0.4 ms on one core

// W floats as one vector (GCC/Clang vector extensions), so the register blocking below needs no
// intrinsics. kLanes is the machine's register width where it is 16 floats (AVX-512), else 8:
// on AVX2 (an EPYC), 16-lane vectors made every shape 2 to 3 times slower than 8-lane ones (the
// compiler keeps arrays of vectors wider than a register in memory); NEON takes 8 as two.
#ifdef __AVX512F__
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
template <int W>
struct Lanes;
template <>
struct Lanes<8> {
  using f = float __attribute__((vector_size(32)));
  using i = int32_t __attribute__((vector_size(32)));
};
template <>
struct Lanes<16> {
  using f = float __attribute__((vector_size(64)));
  using i = int32_t __attribute__((vector_size(64)));
};
template <int W>
using vec = typename Lanes<W>::f;
template <int W>
using ivec = typename Lanes<W>::i;

template <int W>
inline vec<W> load(const float* p) {
  vec<W> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int W>
inline void store(float* p, vec<W> v) {
  std::memcpy(p, &v, sizeof(v));
}

template <int W>
inline float horizontal_max(vec<W> v) {
  float m = v[0];
  for (int l = 1; l < W; ++l) {
    m = std::max(m, v[l]);
  }
  return m;
}

template <int W>
inline float horizontal_sum(vec<W> v) {
  for (int half = W / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) {
      v[l] += v[l + half];
    }
  }
  return v[0];
}

// exp(x) for x <= 0, W lanes at once: Cody-Waite reduction to r in [-ln2/2, ln2/2], the degree-6
// polynomial of Cephes' expf, and 2^n written into the exponent bits. Relative error about
// 2 ulp; anything below -87 (and -inf) gives exactly 0.
template <int W>
inline vec<W> exp_nonpositive(vec<W> x) {
  const vec<W> clamped = x < -87.0f ? vec<W>{} - 87.0f : x;
  const vec<W> shifted = clamped * 1.44269504088896341f + 12582912.0f;  // round by 1.5 * 2^23
  const vec<W> n = shifted - 12582912.0f;
  const vec<W> r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  vec<W> poly = vec<W>{} + 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const auto bits = (__builtin_convertvector(n, ivec<W>) + 127) << 23;
  return x < -87.0f ? vec<W>{} : poly * __builtin_bit_cast(vec<W>, bits);
}

inline float exp_nonpositive(float x) {
  return exp_nonpositive<8>(vec<8>{} + x)[0];
}

// Lanes per vector of a page's scores: kLanes keys, or the whole page when it holds fewer.
template <int BS>
constexpr int kScoreLanes = BS < kLanes ? BS : kLanes;

// scores[v][j] = q_v . k_j for NV query vectors and one page, from the page transposed to
// [D][BS]: each key column is loaded once and used by all NV vectors.
template <int BS, int NV>
inline void page_scores(const float* q, const float* keys_t, int D, float (&scores)[NV][BS]) {
  constexpr int W = kScoreLanes<BS>, C = BS / W;
  vec<W> acc[NV][C] = {};
  for (int d = 0; d < D; ++d) {
    vec<W> k[C];
    for (int c = 0; c < C; ++c) {
      k[c] = load<W>(keys_t + d * BS + W * c);
    }
    for (int v = 0; v < NV; ++v) {
      const float qd = q[v * D + d];
      for (int c = 0; c < C; ++c) {
        acc[v][c] += qd * k[c];
      }
    }
  }
  for (int v = 0; v < NV; ++v) {
    for (int c = 0; c < C; ++c) {
      store<W>(&scores[v][W * c], acc[v][c]);
    }
  }
}

// QV x KJ dot products of query vectors and key rows, both D wide and contiguous (D a multiple
// of 8): out[v * out_stride + j] = q_v . k_j. Each column chunk of a key is loaded once for QV
// queries and each of a query once for KJ keys, so 3 x 4 tiles do 12 FMAs per 7 loads.
template <int QV, int KJ>
inline void dot_tile(const float* q, const float* k, int D, float* out, int out_stride) {
  vec<8> acc[QV][KJ] = {};
  for (int d = 0; d < D; d += 8) {
    vec<8> keys[KJ];
    for (int j = 0; j < KJ; ++j) {
      keys[j] = load<8>(k + j * D + d);
    }
    for (int v = 0; v < QV; ++v) {
      const vec<8> query = load<8>(q + v * D + d);
      for (int j = 0; j < KJ; ++j) {
        acc[v][j] += query * keys[j];
      }
    }
  }
  for (int v = 0; v < QV; ++v) {
    for (int j = 0; j < KJ; ++j) {
      out[v * out_stride + j] = horizontal_sum<8>(acc[v][j]);
    }
  }
}

// page_scores from the page's rows as they lie, [BS][D]: for wide rows (latent pages, 576) the
// transposed copy page_scores needs costs about half as much as scoring 20 heads against it,
// while dot products along D need no copy and their horizontal sums are a 72nd of the work.
template <int BS, int NV>
inline void page_scores_rows(const float* q, const float* keys, int D, float (&scores)[NV][BS]) {
  constexpr int QV = NV % 3 == 0 ? 3 : (NV % 2 == 0 ? 2 : 1);
  for (int v = 0; v < NV; v += QV) {
    for (int j = 0; j < BS; j += 4) {
      dot_tile<QV, 4>(q + v * D, keys + j * D, D, &scores[v][j], BS);
    }
  }
}

// acc_v = acc_v * correction_v + sum_j p[v][j] * V_j, WV columns at a time in registers. V_j
// is D wide and starts `stride` floats after V_{j-1} (wider than D: the leading columns of a
// latent row).
template <int BS, int NV, int WV>
inline void page_values(
    float* acc, const float (&correction)[NV], const float (&p)[NV][BS], const float* values,
    int D, int stride) {
  for (int d = 0; d < D; d += WV) {
    vec<WV> lanes[NV];
    for (int v = 0; v < NV; ++v) {
      lanes[v] = load<WV>(acc + v * D + d) * correction[v];
    }
    for (int j = 0; j < BS; ++j) {
      const vec<WV> row = load<WV>(values + j * stride + d);
      for (int v = 0; v < NV; ++v) {
        lanes[v] += p[v][j] * row;
      }
    }
    for (int v = 0; v < NV; ++v) {
      store<WV>(acc + v * D + d, lanes[v]);
    }
  }
}

struct Geometry {
  int num_kv_heads, group, head_dim, block_size, max_blocks, sliding_window;
  float scale, softcap;
  int value_dim;  // output width: head_dim, or the latent's leading columns
  bool latent;    // values are the leading value_dim columns of the key rows
  int top_k;      // entries per row of `selected` (sparse attention); 0: dense
  // The second source: entries per row of `row_selected` (0: none), the row pages' block size
  // in rows and the width of their block table.
  int row_top_k, rows_per_block, row_max_blocks;
  // Columns accumulated: value_dim rounded up to a multiple of 8 (the vector width), which the
  // head_dim-wide rows always hold (head_dim is a multiple of 8); the extra ones are not output.
  int value_cols() const {
    return (value_dim + 7) / 8 * 8;
  }
};

// One work item: query rows [row_begin, row_end) of one sequence and query heads
// [head_begin, head_end) of one KV head's group (the whole group unless it is large).
struct WorkItem {
  int seq, kv_head, row_begin, row_end, head_begin, head_end;
};

// Float pages of the model's dtype: a token row of one KV head is D elements.
template <typename T>
struct FloatPages {
  const T* data;
  void load_row(int64_t row, int D, float* dst) const {
    const T* src = data + row * D;
    for (int d = 0; d < D; ++d) {
      dst[d] = static_cast<float>(src[d]);
    }
  }
  // The page's rows in place, when they are float32 already (no conversion needed).
  const float* direct(int64_t row, int D) const {
    if constexpr (std::is_same_v<T, float>) {
      return data + row * D;
    }
    return nullptr;
  }
};

// Quantized pages: a token row is D * BITS / 8 bytes of codes (4-bit: element 2i in the low
// nibble) and D / group_size (scale, bias) float16 pairs, dequantized as code * scale + bias.
template <int BITS>
struct QuantPages {
  const uint8_t* codes;
  const mx::float16_t* scales;
  int group_size;
  void load_row(int64_t row, int D, float* dst) const {
    const uint8_t* c = codes + row * (D * BITS / 8);
    const mx::float16_t* sb = scales + row * (D / group_size) * 2;
    for (int g = 0; g < D / group_size; ++g) {
      const float scale = static_cast<float>(sb[2 * g]), bias = static_cast<float>(sb[2 * g + 1]);
      const int begin = g * group_size * BITS / 8, end = (g + 1) * group_size * BITS / 8;
      for (int b = begin; b < end; ++b) {  // byte by byte: straight-line, vectorisable
        if constexpr (BITS == 8) {
          dst[b] = static_cast<float>(c[b]) * scale + bias;
        } else {
          dst[2 * b] = static_cast<float>(c[b] & 0xF) * scale + bias;
          dst[2 * b + 1] = static_cast<float>(c[b] >> 4) * scale + bias;
        }
      }
    }
  }
  const float* direct(int64_t, int) const {
    return nullptr;
  }
};

template <typename T, typename Pages>
struct Inputs {
  const T* q;
  int64_t q_strides[3];
  Pages k_pages;
  Pages v_pages;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* cu_seqlens;
  const int32_t* selected;  // [N, top_k] (sparse attention), nullptr when dense
  Pages row_pages;              // the second source (unused when row_top_k is 0)
  const int32_t* row_tables;    // [S, row_max_blocks]
  const int32_t* row_selected;  // [N, row_top_k]
  const float* sinks;           // nullptr when the model has none
  T* out;              // [N, Hq, value_dim], row contiguous
};

// Per-thread scratch: scaled queries, their positions, running max and sum, accumulators, and
// the current page as float (keys transposed).
struct Scratch {
  std::vector<float> queries, acc, row_max, row_sum, keys_t, values;
  std::vector<int> position;
  void resize(int vectors, int head_dim, int value_cols, int block_size) {
    keys_t.resize(head_dim * block_size);
    values.resize(head_dim * block_size);  // a latent page's key rows, values in their lead
    queries.resize(vectors * head_dim);
    acc.resize(vectors * value_cols);
    row_max.resize(vectors);
    row_sum.resize(vectors);
    position.resize(vectors);
  }
};

// One chunk's contribution to query vectors [first, first + NV): scores, mask, online softmax.
// A chunk is page `block` of the sequence (keys masked by position), or (block < 0) BS gathered
// rows of which the first `count` are visible (sparse attention).
template <int BS, int NV, int WV>
void page_update(
    const Geometry& g, Scratch& s, int first, int block, int count, const float* values,
    int stride) {
  constexpr int W = kScoreLanes<BS>;
  const int D = g.head_dim;
  float p[NV][BS];
  if (g.latent) {  // the values are the key rows themselves: score them as they lie
    page_scores_rows<BS, NV>(&s.queries[first * D], values, D, p);
  } else {
    page_scores<BS, NV>(&s.queries[first * D], s.keys_t.data(), D, p);
  }
  float correction[NV];
  for (int v = 0; v < NV; ++v) {
    float* score = p[v];
    if (g.softcap > 0) {
      for (int j = 0; j < BS; ++j) {
        score[j] = std::tanh(score[j] / g.softcap) * g.softcap;
      }
    }
    const int pos = s.position[first + v], first_key = block * BS;
    const bool all_visible =
        block < 0 ? count == BS
                  : first_key + BS - 1 <= pos &&
                        (g.sliding_window <= 0 || first_key > pos - g.sliding_window);
    if (!all_visible) {
      for (int j = 0; j < BS; ++j) {
        const int key = first_key + j;
        const bool visible =
            block < 0 ? j < count
                      : key <= pos && (g.sliding_window <= 0 || key > pos - g.sliding_window);
        score[j] = visible ? score[j] : kNegInf;
      }
    }
    vec<W> lane_max = load<W>(score);
    for (int c = 1; c < BS / W; ++c) {
      const vec<W> next = load<W>(score + W * c);
      lane_max = next > lane_max ? next : lane_max;
    }
    const float block_max = horizontal_max<W>(lane_max);
    float& row_max = s.row_max[first + v];
    if (block_max == kNegInf) {  // nothing visible here: leave this vector's state unchanged
      std::fill(score, score + BS, 0.0f);
      correction[v] = 1.0f;
      continue;
    }
    const float new_max = std::max(row_max, block_max);
    correction[v] = exp_nonpositive(row_max - new_max);
    vec<W> lane_sum = {};
    for (int c = 0; c < BS / W; ++c) {
      const vec<W> e = exp_nonpositive<W>(load<W>(score + W * c) - new_max);
      store<W>(score + W * c, e);
      lane_sum += e;
    }
    row_max = new_max;
    s.row_sum[first + v] = s.row_sum[first + v] * correction[v] + horizontal_sum<W>(lane_sum);
  }
  const int cols = g.value_cols();
  page_values<BS, NV, WV>(&s.acc[first * cols], correction, p, values, cols, stride);
}

// The token rows a chunk reads: BS consecutive rows of a page (`rows` null), or `count` rows
// gathered from anywhere in the pool (sparse attention).
struct ChunkRows {
  int64_t page;
  const int64_t* rows;
  int count;
  int64_t at(int j) const {
    return rows != nullptr ? rows[j] : page + j;
  }
};

// A chunk's rows as float, [BS][D]: in place when they are a page of float32 already, else
// converted into `scratch` (rows past `count` zeroed: they are masked, and 0 * garbage may be NaN).
template <typename Pages, int BS>
const float* load_rows(const Pages& pages, const ChunkRows& chunk, int D, float* scratch) {
  if (chunk.rows == nullptr) {
    if (const float* rows = pages.direct(chunk.page, D)) {
      return rows;
    }
  }
  for (int j = 0; j < BS; ++j) {
    if (j < chunk.count) {
      pages.load_row(chunk.at(j), D, scratch + j * D);
    } else {
      std::fill(scratch + j * D, scratch + (j + 1) * D, 0.0f);
    }
  }
  return scratch;
}

// One chunk of keys (and values) for every query vector of the item. Latent pages' values are
// the leading columns of the key rows; grouped layers' keys are transposed for page_scores.
template <typename Pages, int BS, int WV>
void attend_chunk(
    const Pages& k_pages, const Pages& v_pages, const Geometry& g, Scratch& s, int vectors,
    int block, const ChunkRows& chunk) {
  const int D = g.head_dim;
  const float* keys = load_rows<Pages, BS>(k_pages, chunk, D, s.values.data());
  const float* values = keys;
  if (!g.latent) {  // latent rows are scored as they lie (page_scores_rows)
    for (int j = 0; j < BS; ++j) {
      for (int d = 0; d < D; ++d) {
        s.keys_t[d * BS + j] = keys[j * D + d];
      }
    }
    values = load_rows<Pages, BS>(v_pages, chunk, D, s.values.data());
  }
  int v = 0;
  for (; v + 6 <= vectors; v += 6) {
    page_update<BS, 6, WV>(g, s, v, block, chunk.count, values, D);
  }
  if (vectors - v >= 4) {
    page_update<BS, 4, WV>(g, s, v, block, chunk.count, values, D);
    v += 4;
  }
  switch (vectors - v) {
    case 3:
      page_update<BS, 3, WV>(g, s, v, block, chunk.count, values, D);
      break;
    case 2:
      page_update<BS, 2, WV>(g, s, v, block, chunk.count, values, D);
      break;
    case 1:
      page_update<BS, 1, WV>(g, s, v, block, chunk.count, values, D);
      break;
  }
}

// The rows one query row reads from a list of `entries` (sparse attention's positions, the second
// source's rows), gathered BS at a time: `row_of(e)` is entry e's pool row, or -1 when the query
// row does not read it.
template <typename Pages, int BS, int WV, typename RowOf>
void attend_listed(
    const Pages& k_pages, const Pages& v_pages, const Geometry& g, Scratch& s, int vectors,
    int entries, RowOf row_of) {
  int64_t rows[BS];
  int count = 0;
  for (int e = 0; e < entries; ++e) {
    const int64_t row = row_of(e);
    if (row < 0) {
      continue;
    }
    rows[count++] = row;
    if (count == BS) {
      attend_chunk<Pages, BS, WV>(k_pages, v_pages, g, s, vectors, -1, ChunkRows{0, rows, BS});
      count = 0;
    }
  }
  if (count > 0) {
    attend_chunk<Pages, BS, WV>(k_pages, v_pages, g, s, vectors, -1, ChunkRows{0, rows, count});
  }
}

template <typename T, typename Pages, int BS, int WV>
void attend(const Inputs<T, Pages>& in, const Geometry& g, const WorkItem& item, Scratch& s) {
  const int D = g.head_dim, DV = g.value_dim, cols = g.value_cols();
  const int hq = g.num_kv_heads * g.group;
  const int heads = item.head_end - item.head_begin, first_head = item.kv_head * g.group;
  const int rows = item.row_end - item.row_begin, vectors = rows * heads;
  const int q_start = in.cu_seqlens[item.seq];
  const int q_len = in.cu_seqlens[item.seq + 1] - q_start;
  const int ctx = in.seq_lens[item.seq];
  const int first_pos = ctx - q_len + (item.row_begin - q_start);
  const int last_pos = first_pos + rows - 1;

  // Query vector v = row * heads + head-in-item, scaled once.
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < heads; ++j) {
      const int v = r * heads + j, head = first_head + item.head_begin + j;
      const T* src = in.q + (item.row_begin + r) * in.q_strides[0] + head * in.q_strides[1];
      for (int d = 0; d < D; ++d) {
        s.queries[v * D + d] = static_cast<float>(src[d * in.q_strides[2]]) * g.scale;
      }
      s.position[v] = first_pos + r;
      s.row_max[v] = in.sinks ? in.sinks[head] : kNegInf;
      s.row_sum[v] = in.sinks ? 1.0f : 0.0f;
    }
  }
  std::fill(s.acc.begin(), s.acc.begin() + vectors * cols, 0.0f);

  const int32_t* table = in.block_tables + static_cast<int64_t>(item.seq) * g.max_blocks;
  if (g.top_k > 0) {  // sparse: the item's one query row (at first_pos) reads the rows it lists
    const int32_t* listed = in.selected + static_cast<int64_t>(item.row_begin) * g.top_k;
    attend_listed<Pages, BS, WV>(in.k_pages, in.v_pages, g, s, vectors, g.top_k, [&](int e) {
      const int key = listed[e];
      if (key < 0 || key > first_pos ||
          (g.sliding_window > 0 && key <= first_pos - g.sliding_window)) {
        return int64_t{-1};
      }
      return (static_cast<int64_t>(table[key / BS]) * g.num_kv_heads + item.kv_head) * BS +
             key % BS;
    });
  } else {
    const int key_begin =
        g.sliding_window > 0 ? std::max(0, first_pos - g.sliding_window + 1) : 0;
    for (int block = key_begin / BS; block * BS <= last_pos; ++block) {
      const int64_t page =
          (static_cast<int64_t>(table[block]) * g.num_kv_heads + item.kv_head) * BS;
      attend_chunk<Pages, BS, WV>(
          in.k_pages, in.v_pages, g, s, vectors, block, ChunkRows{page, nullptr, BS});
    }
  }
  if (g.row_top_k > 0) {  // the second source: the rows the item's one query row lists
    const int32_t* rtable = in.row_tables + static_cast<int64_t>(item.seq) * g.row_max_blocks;
    const int32_t* listed = in.row_selected + static_cast<int64_t>(item.row_begin) * g.row_top_k;
    const int per_block = g.rows_per_block;
    attend_listed<Pages, BS, WV>(in.row_pages, in.row_pages, g, s, vectors, g.row_top_k,
                                 [&](int e) {
                                   const int r = listed[e];
                                   return r < 0 ? int64_t{-1}
                                                : static_cast<int64_t>(rtable[r / per_block]) *
                                                          per_block +
                                                      r % per_block;
                                 });
  }

  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < heads; ++j) {
      const int v = r * heads + j, head = first_head + item.head_begin + j;
      const float inv = 1.0f / s.row_sum[v];
      T* dst = in.out + (static_cast<int64_t>(item.row_begin + r) * hq + head) * DV;
      for (int d = 0; d < DV; ++d) {
        dst[d] = static_cast<T>(s.acc[v * cols + d] * inv);
      }
    }
  }
}

// CPUs this process may run on (its affinity mask on Linux, not the machine's core count).
size_t usable_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

struct Plan {
  std::vector<WorkItem> items;
  int64_t work = 0;     // query vectors x keys visited: what the threads share
  int max_vectors = 1;  // query vectors of the largest item (the scratch's size)
};

// Rows of one sequence per item when an item holds `heads` query heads of a group: one under
// sparse attention or with a second source, whose rows share no keys (or rows).
inline int rows_per_item(int heads, const Geometry& g) {
  return g.top_k > 0 || g.row_top_k > 0 ? 1 : std::max(1, kMaxQueryVectors / heads);
}

// Query heads per work item: the whole group when it fits in one item, else slices of it. While
// there are fewer items than CPUs the slices get thinner (down to 4 heads),
// so one long decode of a wide group (MLA: every query head shares one latent KV head) still
// uses every core; each slice reads the pages again, a small cost beside scoring them.
int heads_per_item(const int32_t* cu, int num_seqs, const Geometry& g) {
  const size_t cpus = usable_cpus();
  int heads = std::min(g.group, kMaxQueryVectors);
  auto items = [&](int h) {
    size_t n = 0;
    for (int seq = 0; seq < num_seqs; ++seq) {
      const int q_len = cu[seq + 1] - cu[seq];
      n += static_cast<size_t>((q_len + rows_per_item(h, g) - 1) / rows_per_item(h, g));
    }
    return n * g.num_kv_heads * ((g.group + h - 1) / h);
  };
  while (heads > 4 && items(heads) < cpus) {
    heads = (heads + 1) / 2;
  }
  return heads;
}

Plan plan(const int32_t* cu, const int32_t* seq_lens, int num_seqs, const Geometry& g) {
  const int heads = heads_per_item(cu, num_seqs, g), rows = rows_per_item(heads, g);
  Plan p;
  p.max_vectors = rows * heads;
  for (int seq = 0; seq < num_seqs; ++seq) {
    int span = g.sliding_window > 0 ? std::min(seq_lens[seq], g.sliding_window) : seq_lens[seq];
    span = (g.top_k > 0 ? std::min(span, g.top_k) : span) + g.row_top_k;
    p.work += static_cast<int64_t>(cu[seq + 1] - cu[seq]) * g.num_kv_heads * g.group * span;
    for (int row = cu[seq]; row < cu[seq + 1]; row += rows) {
      for (int h = 0; h < g.num_kv_heads; ++h) {
        for (int first = 0; first < g.group; first += heads) {
          p.items.push_back({seq, h, row, std::min(row + rows, cu[seq + 1]), first,
                             std::min(first + heads, g.group)});
        }
      }
    }
  }
  return p;
}

template <typename T, typename Pages, int BS, int WV>
void run_items(const Inputs<T, Pages>& in, const Geometry& g, const Plan& plan) {
  const auto& items = plan.items;
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    Scratch scratch;
    scratch.resize(plan.max_vectors, g.head_dim, g.value_cols(), BS);
    for (size_t i = next++; i < items.size(); i = next++) {
      attend<T, Pages, BS, WV>(in, g, items[i], scratch);
    }
  };
  // A thread costs tens of microseconds to start: only steps with enough work get more.
  const size_t threads = std::min(
      {usable_cpus(), items.size(), static_cast<size_t>(plan.work / kMinWorkPerThread + 1)});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) {
    pool.emplace_back(worker);
  }
  worker();
  for (auto& th : pool) {
    th.join();
  }
}

class PagedAttentionCPU : public mx::Primitive {
 public:
  PagedAttentionCPU(mx::Stream stream, Geometry geometry, bool has_sinks, int bits, int group_size)
      : mx::Primitive(stream),
        g_(geometry),
        has_sinks_(has_sinks),
        bits_(bits),
        group_size_(group_size) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) {
      encoder.set_input_array(a);
    }
    encoder.set_output_array(out);
    encoder.dispatch([inputs, out, g = g_, has_sinks = has_sinks_, bits = bits_,
                      group = group_size_]() mutable {
      switch (out.dtype()) {
        case mx::float32:
          return run<float>(inputs, out, g, has_sinks, bits, group);
        case mx::float16:
          return run<mx::float16_t>(inputs, out, g, has_sinks, bits, group);
        case mx::bfloat16:
          return run<mx::bfloat16_t>(inputs, out, g, has_sinks, bits, group);
        default:
          throw std::invalid_argument("paged_attention_cpu: float32, float16 or bfloat16 only");
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("paged_attention_cpu runs on the CPU stream only");
  }

  const char* name() const override {
    return "PagedAttentionCPU";
  }

 private:
  // Inputs: q, k, v, block_tables, seq_lens, cu_seqlens_q, then k_scales and v_scales when the
  // pages are quantized (bits 8 or 4), then selected (sparse attention), then the second source
  // (row pages, their scales when quantized, row_tables, row_selected), then sinks when the
  // model has them.
  template <typename Pages>
  struct PageSet {
    Pages k, v, rows;
  };

  template <typename T>
  static void run(
      const std::vector<mx::array>& in, mx::array& out, Geometry g, bool has_sinks, int bits,
      int group_size) {
    const float* sinks = has_sinks ? in.back().data<float>() : nullptr;
    const size_t rows_at = 6 + (bits != 0 ? 2 : 0) + (g.top_k > 0 ? 1 : 0);
    switch (bits) {
      case 8:
        return run_pages<T>(in, out, g, sinks, rows_at, quant_pages<8>(in, group_size, rows_at, g));
      case 4:
        return run_pages<T>(in, out, g, sinks, rows_at, quant_pages<4>(in, group_size, rows_at, g));
      default: {
        const T* rows = g.row_top_k > 0 ? in[rows_at].data<T>() : nullptr;
        return run_pages<T>(
            in, out, g, sinks, rows_at,
            PageSet<FloatPages<T>>{{in[1].data<T>()}, {in[2].data<T>()}, {rows}});
      }
    }
  }

  template <int BITS>
  static PageSet<QuantPages<BITS>> quant_pages(
      const std::vector<mx::array>& in, int group_size, size_t rows_at, const Geometry& g) {
    QuantPages<BITS> rows{nullptr, nullptr, group_size};
    if (g.row_top_k > 0) {
      rows = {in[rows_at].data<uint8_t>(), in[rows_at + 1].data<mx::float16_t>(), group_size};
    }
    return {
        QuantPages<BITS>{in[1].data<uint8_t>(), in[6].data<mx::float16_t>(), group_size},
        QuantPages<BITS>{in[2].data<uint8_t>(), in[7].data<mx::float16_t>(), group_size}, rows};
  }

  template <typename T, typename Pages>
  static void run_pages(
      const std::vector<mx::array>& in, mx::array& out, const Geometry& g, const float* sinks,
      size_t rows_at, PageSet<Pages> pages) {
    const auto& q = in[0];
    // The row source's block table and lists follow its pages (and their scales).
    const size_t tables_at = rows_at + (std::is_same_v<Pages, FloatPages<T>> ? 1 : 2);
    const bool rows = g.row_top_k > 0;
    Inputs<T, Pages> args{
        q.data<T>(),
        {q.strides()[0], q.strides()[1], q.strides()[2]},
        pages.k,
        pages.v,
        in[3].data<int32_t>(),
        in[4].data<int32_t>(),
        in[5].data<int32_t>(),
        g.top_k > 0 ? in[rows_at - 1].data<int32_t>() : nullptr,
        pages.rows,
        rows ? in[tables_at].data<int32_t>() : nullptr,
        rows ? in[tables_at + 1].data<int32_t>() : nullptr,
        sinks,
        out.data<T>(),
    };
    const auto work = plan(args.cu_seqlens, args.seq_lens, static_cast<int>(in[4].size()), g);
    if (kLanes == 16 && g.value_cols() % 16 == 0) {
      return run_for_block_size<T, Pages, 16>(args, g, work);
    }
    return run_for_block_size<T, Pages, 8>(args, g, work);
  }

  template <typename T, typename Pages, int WV>
  static void run_for_block_size(
      const Inputs<T, Pages>& args, const Geometry& g, const Plan& work) {
    switch (g.block_size) {
      case 8:
        return run_items<T, Pages, 8, WV>(args, g, work);
      case 16:
        return run_items<T, Pages, 16, WV>(args, g, work);
      case 32:
        return run_items<T, Pages, 32, WV>(args, g, work);
      default:
        throw std::invalid_argument("paged_attention_cpu: block_size must be 8, 16 or 32");
    }
  }

  Geometry g_;
  bool has_sinks_;
  int bits_, group_size_;
};

// An input as the kernel reads it: ``dtype``, row contiguous. One the host built already so
// (the packer's metadata) goes in as it is: every op a step adds costs host dispatch time.
mx::array kernel_input(const mx::array& a, mx::Dtype dtype, mx::StreamOrDevice stream) {
  if (a.dtype() == dtype && a.is_available() && a.flags().row_contiguous) {
    return a;
  }
  return mx::contiguous(mx::astype(a, dtype, stream), false, stream);
}

mx::array paged_attention_cpu(
    const mx::array& q,
    const mx::array& k_pages,
    const mx::array& v_pages,
    const mx::array& block_tables,
    const mx::array& seq_lens,
    const mx::array& cu_seqlens_q,
    float scale,
    int sliding_window,
    float softcap,
    const std::optional<mx::array>& sinks,
    const std::optional<mx::array>& k_scales,
    const std::optional<mx::array>& v_scales,
    int bits,
    int group_size,
    int value_dim,
    const std::optional<mx::array>& selected,
    const std::optional<mx::array>& row_pages,
    const std::optional<mx::array>& row_scales,
    const std::optional<mx::array>& row_tables,
    const std::optional<mx::array>& row_selected) {
  const bool quantized = bits != 0;
  const bool latent = value_dim > 0;
  const auto page_dtype = quantized ? mx::uint8 : q.dtype();
  const int row_width = quantized ? q.shape(2) * bits / 8 : q.shape(2);
  if (q.ndim() != 3 || k_pages.ndim() != 4 || !k_pages.flags().row_contiguous ||
      !v_pages.flags().row_contiguous || k_pages.dtype() != page_dtype ||
      v_pages.dtype() != page_dtype) {
    throw std::invalid_argument(
        "paged_attention_cpu: q [N, Hq, D] and row-contiguous pages [blocks, Hkv, block, D] of "
        "q's dtype (uint8 codes when quantized) expected");
  }
  if (quantized &&
      ((bits != 8 && bits != 4) || !k_scales || !v_scales || group_size <= 0 ||
       q.shape(2) % group_size != 0 || k_scales->dtype() != mx::float16 ||
       v_scales->dtype() != mx::float16 || !k_scales->flags().row_contiguous ||
       !v_scales->flags().row_contiguous ||
       k_scales->size() != k_pages.size() / row_width * (q.shape(2) / group_size) * 2 ||
       v_scales->size() != k_scales->size())) {
    throw std::invalid_argument(
        "paged_attention_cpu: quantized pages need bits 8 or 4, a group size dividing the head "
        "dim and row-contiguous float16 scales [blocks, Hkv, block, D / group, 2]");
  }
  const int block_size = k_pages.shape(2);
  if (q.shape(2) % 8 != 0 || k_pages.shape(3) != row_width ||
      (block_size != 8 && block_size != 16 && block_size != 32)) {
    throw std::invalid_argument(
        "paged_attention_cpu: head_dim must be a multiple of 8 and block_size 8, 16 or 32");
  }
  if (latent && value_dim > q.shape(2)) {
    throw std::invalid_argument("paged_attention_cpu: latent value_dim exceeds the head dim");
  }
  if (selected && (selected->ndim() != 2 || selected->shape(0) != q.shape(0) ||
                   selected->shape(1) == 0)) {
    throw std::invalid_argument("paged_attention_cpu: selected must be [N, K], K > 0");
  }
  const bool rows = row_selected.has_value();
  if (rows &&
      (!latent || k_pages.shape(1) != 1 || !row_pages || !row_tables ||
       row_pages->ndim() != 4 || row_pages->shape(1) != 1 || row_pages->shape(3) != row_width ||
       row_pages->dtype() != page_dtype || !row_pages->flags().row_contiguous ||
       row_tables->ndim() != 2 || row_tables->shape(0) != seq_lens.size() ||
       row_tables->shape(1) == 0 || row_selected->ndim() != 2 ||
       row_selected->shape(0) != q.shape(0) || row_selected->shape(1) == 0 ||
       quantized != row_scales.has_value() ||
       (quantized &&
        (row_scales->dtype() != mx::float16 || !row_scales->flags().row_contiguous ||
         row_scales->size() != row_pages->size() / row_width * (q.shape(2) / group_size) * 2)))) {
    throw std::invalid_argument(
        "paged_attention_cpu: a second source of rows needs latent pages of one KV head, row "
        "pages [row_blocks, 1, rows_per_block, D] in the token pages' format (with their "
        "scales when quantized), row_tables [S, max_row_blocks] and row_selected [N, K2], K2 > 0");
  }
  const int hq = q.shape(1), hkv = k_pages.shape(1);
  Geometry g{hkv,     hq / hkv, q.shape(2), block_size,
             block_tables.shape(1), sliding_window, scale, softcap,
             latent ? value_dim : q.shape(2), latent,
             selected ? selected->shape(1) : 0,
             rows ? row_selected->shape(1) : 0,
             rows ? row_pages->shape(2) : 0,
             rows ? row_tables->shape(1) : 0};
  auto stream = mx::default_stream(mx::Device::cpu);
  std::vector<mx::array> inputs{
      q,
      k_pages,
      v_pages,
      kernel_input(block_tables, mx::int32, stream),
      kernel_input(seq_lens, mx::int32, stream),
      kernel_input(cu_seqlens_q, mx::int32, stream),
  };
  if (quantized) {
    inputs.push_back(*k_scales);
    inputs.push_back(*v_scales);
  }
  if (selected) {
    inputs.push_back(kernel_input(*selected, mx::int32, stream));
  }
  if (rows) {
    inputs.push_back(*row_pages);
    if (quantized) {
      inputs.push_back(*row_scales);
    }
    inputs.push_back(kernel_input(*row_tables, mx::int32, stream));
    inputs.push_back(kernel_input(*row_selected, mx::int32, stream));
  }
  if (sinks) {
    inputs.push_back(kernel_input(*sinks, mx::float32, stream));
  }
  return mx::array(
      {q.shape(0), q.shape(1), g.value_dim},
      q.dtype(),
      std::make_shared<PagedAttentionCPU>(stream, g, sinks.has_value(), bits, group_size),
      std::move(inputs));
}

}  // namespace

NB_MODULE(_paged_attention_cpu, m) {
  nb::module_::import_("mlx.core");
  m.def(
      "paged_attention",
      &paged_attention_cpu,
      nb::arg("q"),
      nb::arg("k_pages"),
      nb::arg("v_pages"),
      nb::arg("block_tables"),
      nb::arg("seq_lens"),
      nb::arg("cu_seqlens_q"),
      nb::arg("scale"),
      nb::arg("sliding_window"),
      nb::arg("softcap"),
      nb::arg("sinks").none(),
      nb::arg("k_scales").none() = nb::none(),
      nb::arg("v_scales").none() = nb::none(),
      nb::arg("bits") = 0,
      nb::arg("group_size") = 0,
      nb::arg("value_dim") = 0,
      nb::arg("selected").none() = nb::none(),
      nb::arg("row_pages").none() = nb::none(),
      nb::arg("row_scales").none() = nb::none(),
      nb::arg("row_tables").none() = nb::none(),
      nb::arg("row_selected").none() = nb::none());
}
