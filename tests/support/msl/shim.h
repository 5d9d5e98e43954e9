// A freestanding stand-in for <metal_stdlib> and MLX's utils.h, enough to compile plain MSL kernel
// bodies as C++ for the emulator. Numerics follow Metal: half rounds to nearest-even after every
// operation (_Float16), bfloat likewise, float math maps to the C library.
#pragma once
#include "abi.h"

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef unsigned long size_t;

// Address spaces: no checking here (a real Mac is the judge of those).
#define device
#define constant
#define thread
#define threadgroup

#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define FLT_MAX (3.402823466e+38F)
#define M_LOG2E_F (1.442695040888963F)

#define MSLEMU_SITE const char *mslemu_file = __builtin_FILE(), int mslemu_line = __builtin_LINE()

typedef _Float16 half;

template <typename To, typename From>
inline To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  return __builtin_bit_cast(To, x);
}

// bfloat: 8-bit exponent, 7-bit mantissa; every operation rounds to nearest-even.
struct bfloat {
  ushort bits;
  static ushort round(float f) {
    uint u = __builtin_bit_cast(uint, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
  }
  bfloat() = default;
  bfloat(float f) : bits(round(f)) {}
  bfloat(int i) : bits(round((float)i)) {}
  bfloat(half h) : bits(round((float)h)) {}
  operator float() const { return __builtin_bit_cast(float, (uint)bits << 16); }
  bfloat& operator+=(float o) { return *this = bfloat(float(*this) + o); }
  bfloat& operator*=(float o) { return *this = bfloat(float(*this) * o); }
};
inline bfloat operator+(bfloat a, bfloat b) { return bfloat(float(a) + float(b)); }
inline bfloat operator-(bfloat a, bfloat b) { return bfloat(float(a) - float(b)); }
inline bfloat operator*(bfloat a, bfloat b) { return bfloat(float(a) * float(b)); }
inline bfloat operator/(bfloat a, bfloat b) { return bfloat(float(a) / float(b)); }

typedef half float16_t;
typedef bfloat bfloat16_t;

// vec<T, N>: element access, MSL size and alignment (a 3-vector takes the room of 4).
template <typename T, int N>
struct alignas(sizeof(T) * (N == 3 ? 4 : N)) vec {
  T v[N == 3 ? 4 : N];
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
};
template <typename T>
struct alignas(sizeof(T) * 2) vec<T, 2> {
  T x, y;
  T& operator[](int i) { return i == 0 ? x : y; }
};
template <typename T>
struct alignas(sizeof(T) * 4) vec<T, 3> {
  T x, y, z, pad_;
  T& operator[](int i) { return i == 0 ? x : (i == 1 ? y : z); }
};
template <typename T>
struct alignas(sizeof(T) * 4) vec<T, 4> {
  T x, y, z, w;
  T& operator[](int i) { return i == 0 ? x : (i == 1 ? y : (i == 2 ? z : w)); }
};
#define MSLEMU_VEC(T)      \
  typedef vec<T, 2> T##2;  \
  typedef vec<T, 3> T##3;  \
  typedef vec<T, 4> T##4;
MSLEMU_VEC(float)
MSLEMU_VEC(half)
MSLEMU_VEC(uint)
MSLEMU_VEC(int)
MSLEMU_VEC(ushort)
MSLEMU_VEC(short)
#undef MSLEMU_VEC

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

inline void threadgroup_barrier(mem_flags, MSLEMU_SITE) {
  mslemu_barrier(0, mslemu_file, mslemu_line);
}
inline void simdgroup_barrier(mem_flags, MSLEMU_SITE) {
  mslemu_barrier(1, mslemu_file, mslemu_line);
}

namespace metal {
#define MSLEMU_MATH1(name, fn)                             \
  inline float name(float x) { return __builtin_##fn(x); } \
  inline half name(half x) { return (half)__builtin_##fn((float)x); }
#define MSLEMU_MATH_ALL                \
  MSLEMU_MATH1(exp, expf)              \
  MSLEMU_MATH1(exp2, exp2f)            \
  MSLEMU_MATH1(log, logf)              \
  MSLEMU_MATH1(log2, log2f)            \
  MSLEMU_MATH1(tanh, tanhf)            \
  MSLEMU_MATH1(sqrt, sqrtf)            \
  MSLEMU_MATH1(fabs, fabsf)            \
  MSLEMU_MATH1(abs, fabsf)             \
  MSLEMU_MATH1(floor, floorf)          \
  MSLEMU_MATH1(ceil, ceilf)            \
  inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
MSLEMU_MATH_ALL
namespace precise {
MSLEMU_MATH_ALL
}
namespace fast {
MSLEMU_MATH_ALL
}
#undef MSLEMU_MATH_ALL
#undef MSLEMU_MATH1

template <typename T>
inline T max(T a, T b) { return a > b ? a : b; }
template <typename T>
inline T min(T a, T b) { return a < b ? a : b; }
inline float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
inline float fmin(float a, float b) { return __builtin_fminf(a, b); }
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
template <typename T>
inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
template <typename T>
inline T select(T a, T b, bool c) { return c ? b : a; }
}  // namespace metal
using namespace metal;

// SIMD-group functions: one exchange through the runtime, then each lane computes its answer.
template <typename T>
struct mslemu_lanes {
  T value[32];
  uint mask;
  mslemu_lanes(T x, const char* op, const char* file, int line) {
    mslemu_simd_gather(&x, sizeof(T), value, &mask, op, file, line);
  }
  bool active(uint i) const { return (mask >> i) & 1u; }
};
template <typename T>
inline T simd_sum(T x, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_sum", mslemu_file, mslemu_line);
  T acc = T(0);
  for (uint i = 0; i < 32; ++i)
    if (l.active(i)) acc = acc + l.value[i];
  return acc;
}
template <typename T>
inline T simd_max(T x, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_max", mslemu_file, mslemu_line);
  T acc = x;
  for (uint i = 0; i < 32; ++i)
    if (l.active(i) && l.value[i] > acc) acc = l.value[i];
  return acc;
}
template <typename T>
inline T simd_min(T x, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_min", mslemu_file, mslemu_line);
  T acc = x;
  for (uint i = 0; i < 32; ++i)
    if (l.active(i) && l.value[i] < acc) acc = l.value[i];
  return acc;
}
template <typename T>
inline T simd_prefix_exclusive_sum(T x, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_prefix_exclusive_sum", mslemu_file, mslemu_line);
  T acc = T(0);
  for (uint i = 0; i < mslemu_lane_id(); ++i)
    if (l.active(i)) acc = acc + l.value[i];
  return acc;
}
template <typename T>
inline T simd_prefix_inclusive_sum(T x, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_prefix_inclusive_sum", mslemu_file, mslemu_line);
  T acc = T(0);
  for (uint i = 0; i <= mslemu_lane_id(); ++i)
    if (l.active(i)) acc = acc + l.value[i];
  return acc;
}
template <typename T>
inline T simd_shuffle(T x, ushort lane, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_shuffle", mslemu_file, mslemu_line);
  return l.value[lane & 31u];
}
template <typename T>
inline T simd_broadcast(T x, ushort lane, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_broadcast", mslemu_file, mslemu_line);
  return l.value[lane & 31u];
}
template <typename T>
inline T simd_shuffle_xor(T x, ushort m, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_shuffle_xor", mslemu_file, mslemu_line);
  return l.value[(mslemu_lane_id() ^ m) & 31u];
}
template <typename T>
inline T simd_shuffle_down(T x, ushort d, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_shuffle_down", mslemu_file, mslemu_line);
  uint src = mslemu_lane_id() + d;
  return src < 32u ? l.value[src] : x;
}
template <typename T>
inline T simd_shuffle_up(T x, ushort d, MSLEMU_SITE) {
  mslemu_lanes<T> l(x, "simd_shuffle_up", mslemu_file, mslemu_line);
  uint lane = mslemu_lane_id();
  return lane >= d ? l.value[lane - d] : x;
}
inline bool simd_any(bool x, MSLEMU_SITE) {
  mslemu_lanes<bool> l(x, "simd_any", mslemu_file, mslemu_line);
  for (uint i = 0; i < 32; ++i)
    if (l.active(i) && l.value[i]) return true;
  return false;
}
inline bool simd_all(bool x, MSLEMU_SITE) {
  mslemu_lanes<bool> l(x, "simd_all", mslemu_file, mslemu_line);
  for (uint i = 0; i < 32; ++i)
    if (l.active(i) && !l.value[i]) return false;
  return true;
}

// Atomics: emulated threads never run at the same time, so plain memory suffices.
enum memory_order { memory_order_relaxed };
template <typename T>
struct atomic {
  T value;
};
template <typename T>
inline T atomic_load_explicit(device atomic<T>* a, memory_order) { return a->value; }
template <typename T>
inline void atomic_store_explicit(device atomic<T>* a, T v, memory_order) { a->value = v; }
template <typename T>
inline T atomic_fetch_add_explicit(device atomic<T>* a, T v, memory_order) {
  T old = a->value;
  a->value = old + v;
  return old;
}
template <typename T>
inline T atomic_fetch_max_explicit(device atomic<T>* a, T v, memory_order) {
  T old = a->value;
  if (v > old) a->value = v;
  return old;
}

// The subset of MLX's utils.h that kernels may use.
template <typename U>
struct Limits;
template <>
struct Limits<float> {
  static constexpr float max = FLT_MAX;
  static constexpr float min = -__builtin_inff();
  static constexpr float finite_min = -FLT_MAX;
};
