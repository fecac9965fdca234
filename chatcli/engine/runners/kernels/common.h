// What every build of the decode step shares (see decode.cpp): the weight and row layouts, the
// bf16 cache's conversions, rope, the split of a projection over an OpenMP team and the cache stores.
// The vector code is per instruction set: simd.h, attention.h, project.h (AVX-512) or their
// _avx2 twins; steps.h builds the stages on either.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

extern "C" {

// WEIGHT_Q4K, _Q5K, _Q6K: GGUF's K-quants (project.h: kquant_block); WEIGHT_Q3K, _Q2K: its low-bit ones
// (project_low.h: low_block); WEIGHT_F16, _BF16, _F32R: a GGUF's float tensors as it holds them, 16 outputs
// a block (project_float.h: float_block); WEIGHT_IQ4NL, _IQ4XS: its 4-bit indices into kIQ4Values
// (project_iq4.h: iq4_block); WEIGHT_RAW_Q4K, _Q6K, _MXFP4: a GGUF's Q4_K / Q6_K / MXFP4 rows as the file holds them
// (project_raw.h);
// WEIGHT_MXFP4: GGUF's MXFP4 (gpt-oss's experts) on the same blocks, its indices into
// kMXFP4Values and its power-of-two scale per group as bf16 (exact: an E8M0 scale is a bf16's exponent); WEIGHT_PARTS: outputs stacked from parts of those or of q4 / q8 (a fused
// projection whose tensors the file holds in several types)
enum { WEIGHT_F32 = 0, WEIGHT_I8 = 1, WEIGHT_Q4 = 2, WEIGHT_Q8 = 3, WEIGHT_Q4K = 4, WEIGHT_Q5K = 5, WEIGHT_Q6K = 6,
       WEIGHT_PARTS = 7, WEIGHT_Q3K = 8, WEIGHT_Q2K = 9, WEIGHT_F16 = 10, WEIGHT_BF16 = 11, WEIGHT_F32R = 12,
       WEIGHT_IQ4NL = 13, WEIGHT_IQ4XS = 14, WEIGHT_MXFP4 = 15, WEIGHT_RAW_Q4K = 16, WEIGHT_RAW_Q6K = 17,
       WEIGHT_RAW_MXFP4 = 18 };

struct Matrix {
  int32_t kind;      // a WEIGHT_ kind
  int64_t n, k, kp;  // outputs, inputs, inputs padded to a multiple of 4 (int8), 32 (q4, q8) or 256 (K-quants)
  const void* w;     // fp32: panels; F16 / BF16 / F32 rows: [ceil(n/16)][k][16]; the rest: codes (project*.h)
  const float* scale;  // int8: [n]
  const int32_t* wsum;  // int8: [n]
  const uint16_t* d;    // q4, q8, IQ4_NL: fp16 scales per group; K-quants, IQ4_XS: per super-block of 256
  const uint16_t* mins;  // q4: fp16 mins, or null (Q4_0: -8 d); Q4_K / Q5_K / Q2_K: fp16 dmin per super-block
  const float* norm;    // grouped kinds: [k] the RMSNorm weight its normalised inputs take, or null
  const uint8_t* sc;    // Q4_K / Q5_K: 6-bit scales per group; Q6_K, Q3_K: int8 scales per 16 inputs; Q2_K:
                        // 4-bit scale and min per 16 inputs in a byte; IQ4_XS: int8 scales per group
  const uint8_t* sm;    // Q4_K / Q5_K: 6-bit mins per group
  const uint8_t* hi;    // Q5_K: the codes' 5th bits; Q6_K: their 5th and 6th; Q3_K: their 3rd
  const struct Matrix* parts;  // WEIGHT_PARTS: the parts, outputs in order (same k, kp, norm)
  int64_t n_parts;
};

}  // extern "C"

namespace {

constexpr int64_t kPanel = 64;   // fp32 weights: panels of 64 outputs, [ceil(n/64)][k][64]
constexpr int kMaxGroup = 8;      // query heads attended together over one read of their K and V
constexpr int kMaxHeadDim = 256;  // the largest head the kernel takes
constexpr int kTileRows = 12;     // query rows (positions x heads) scored together against each key block
constexpr int64_t kChunk = 1024;  // key positions a row's softmax folds at a time (steps.h: attend_chunks)

// IQ4_NL's and IQ4_XS's table (llama.cpp's kvalues_iq4nl): a 4-bit index's weight, times d (and IQ4_XS's scale)
constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// MXFP4's (llama.cpp's kvalues_mxfp4): E2M1's values doubled, times d = 2^(e - 128) (half the E8M0 scale)
constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// an IQ4-shaped kind's table: IQ4_NL's and IQ4_XS's, or MXFP4's
template <int kKind>
constexpr const int8_t* iq4_table() {
  return kKind == WEIGHT_MXFP4 ? kMXFP4Values : kIQ4Values;
}

// ---- projections, run inside an OpenMP team (each splits its output blocks) ---------------

struct Rows {  // the activation rows a projection reads
  int64_t count;
  const float* x;     // fp32: [count, ldx]
  int64_t ldx;
  const uint8_t* xq;  // int8: [count, kp]
  const float* xs;
  const int32_t* xz;
  const float* gs;    // q4, q8: [count, kp/32] each group's scale (xq then holds int8)
  const float* gsum;  // q4, q8: [count, kp/32] each group's sum, gs * sum xq
  const int32_t* hsum;  // [count, kp/16] the sum of xq over each 16 inputs (see reads_hsum)
};

// the kinds that multiply the fp32 activations themselves (F16, BF16, F32 rows): no int8 rows to make
inline bool floating(const Matrix& m) { return m.kind >= WEIGHT_F16 && m.kind <= WEIGHT_F32R; }

// the kinds whose activations are int8 per group of 32 (gs, gsum); parts: where any part's are
inline bool grouped(const Matrix& m) {
  if (m.kind == WEIGHT_PARTS) return std::any_of(m.parts, m.parts + m.n_parts, grouped);
  return m.kind >= WEIGHT_Q4 && m.kind != WEIGHT_I8 && !floating(m);
}

// whether a projection (or one of its parts) reads the sums per 16 inputs (hsum): Q6_K (its offset of
// 32), Q3_K (4), Q2_K (its mins), IQ4_NL / IQ4_XS / MXFP4 (the AVX-512 build's table offset of 128)
inline bool reads_hsum(const Matrix& m) {
  if (m.kind == WEIGHT_PARTS) return std::any_of(m.parts, m.parts + m.n_parts, reads_hsum);
  return m.kind == WEIGHT_Q6K || m.kind == WEIGHT_RAW_Q6K || m.kind == WEIGHT_RAW_MXFP4 || m.kind == WEIGHT_Q3K || m.kind == WEIGHT_Q2K || m.kind == WEIGHT_IQ4NL ||
         m.kind == WEIGHT_IQ4XS || m.kind == WEIGHT_MXFP4;
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// A q8_0 KV cache's bytes (GGUF's Q8_0: int8 codes and an fp16 scale per 32 dimensions of a position; a
// value is code * scale). A key block of 16 positions is [hd, 16] codes, then [hd/32, 16] scales (17 hd
// bytes); a value row is [hd] codes, then [hd/32] scales (17 hd / 16 bytes). hd is a multiple of 32.
struct Q8 {
  int8_t code;
};

template <typename T>
constexpr bool kQ8 = std::is_same_v<T, Q8>;

// An fp16 KV cache's element (IEEE half, llama.cpp's default cache): the layout of bf16's, converted to fp32
// as it is read (simd*.h: load16 / load8 / load4) and rounded to nearest even as it is written (step.h)
struct F16 {
  uint16_t bits;
};

// what `positions` positions of one KV head take in a cache of T, in T (keys: whole blocks of 16)
template <typename T>
constexpr int64_t span(int64_t positions, int64_t hd) {
  if constexpr (kQ8<T>)
    return positions * hd / 16 * 17;
  else
    return positions * hd;
}

// rope on `heads` heads of a row in adjacent pairs (2i, 2i + 1): rope [hd/2, 2] holds cos, sin
void rope_row(float* row, const float* rope, int64_t heads, int64_t half) {
  for (int64_t head = 0; head < heads; head++)
    for (int64_t i = 0; i < half; i++) {
      float* p = row + head * 2 * half + 2 * i;
      const float a = p[0], b = p[1], cs = rope[2 * i], sn = rope[2 * i + 1];
      p[0] = a * cs - b * sn;
      p[1] = a * sn + b * cs;
    }
}

// vectors of high bits (64 bytes each) a K-quant group has: none (Q4_K), the codes' 5th bits (Q5_K), their 5th
// and 6th (Q6_K)
template <int kKind>
constexpr int kHighVectors = kKind == WEIGHT_Q4K ? 0 : kKind == WEIGHT_Q5K ? 1 : 2;

// K-quant block b's parts (kKind: WEIGHT_Q4K, _Q5K or _Q6K; project.h gives the layouts): the codes' low 4 bits,
// d and dmin (fp16) per super-block, the 6-bit scales and mins per group (Q6_K: int8 scales per 16 inputs, no
// mins), the codes' high bits (none for Q4_K)
struct KBlock {
  const uint8_t* w;
  const uint16_t* d;
  const uint16_t* dmin;
  const uint8_t* sc;
  const uint8_t* sm;
  const uint8_t* hi;
};

template <int kKind>
inline KBlock k_block(const Matrix& m, int64_t b) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kHigh = kHighVectors<kKind>;
  const int64_t groups = m.kp / 32, supers = m.kp / 256;
  return {static_cast<const uint8_t*>(m.w) + b * groups * 256, m.d + b * supers * 16,
          k6 ? nullptr : m.mins + b * supers * 16,       m.sc + b * groups * 16 * (k6 ? 2 : 1),
          k6 ? nullptr : m.sm + b * groups * 16,         kHigh ? m.hi + b * groups * 64 * kHigh : nullptr};
}

// kBytes from p on into L1, every cache line of them: a block's group of weights some groups ahead (the hardware's
// own prefetcher, a line at a time, left a decode step's row waiting on memory). Never faults: p may be past the end.
template <int kBytes>
inline void prefetch_lines(const void* p) {
  for (int at = 0; at < kBytes; at += 64) __builtin_prefetch(static_cast<const char*>(p) + at, 0, 3);
}

constexpr int kPrefetchGroups = 16;  // how many groups ahead of the one being read the weights are fetched

// the last pass: `left` (< R) rows from s
template <int R, typename Block>
void tail_pass(int64_t left, int64_t s, Block& block) {
  if constexpr (R > 0) {
    if (left == R)
      block(std::integral_constant<int, R>{}, s);
    else
      tail_pass<R - 1>(left, s, block);
  }
}

// block(integral_constant<int, R>, s0) over the rows, in passes of kRows and one shorter last pass
template <int kRows, typename Block>
void each_row_pass(const Rows& in, Block block) {
  int64_t s = 0;
  for (; s + kRows <= in.count; s += kRows) block(std::integral_constant<int, kRows>{}, s);
  tail_pass<kRows - 1>(in.count - s, s, block);
}

// Row blocks to split a projection's rows into, beside its `units` output blocks, so that the team's
// threads get equal shares: a few wide rows of units (9 fp32 panels for 2 threads) would leave one idle.
int64_t row_blocks(int64_t units, int64_t rows, int64_t pass) {
  const int64_t threads = omp_get_num_threads();
  int64_t best = 1;
  double best_cost = 2.0;
  for (int64_t rb = 1; rb <= 8 && (rb == 1 || rb * pass <= rows); rb++) {
    const int64_t items = units * rb;
    const double cost = static_cast<double>((items + threads - 1) / threads) * threads / items;  // 1: even
    if (cost < best_cost - 1e-9) best = rb, best_cost = cost;
  }
  return best;
}

// every (unit, row block) pair once over the team: block(unit, first, count) for rows first..first+count,
// row blocks of whole passes of kPass rows (split's, project_amx.h's split_tiles')
template <int kPass, typename Block>
void split_blocks(const Rows& in, int64_t units, Block block) {
  const int64_t rb = row_blocks(units, in.count, kPass);
  const int64_t per = ((in.count + rb - 1) / rb + kPass - 1) / kPass * kPass;  // rows a block, whole passes
#pragma omp for schedule(static)
  for (int64_t item = 0; item < units * rb; item++) {
    const int64_t first = (item % rb) * per;
    if (first < in.count) block(item / rb, first, std::min(per, in.count - first));
  }
}

// every (unit, row block) pair once over the team: work(unit, rows) with a view of the rows
template <int kRows, typename Work>
void split(const Rows& in, int64_t units, Work work) {
  split_blocks<kRows>(in, units, [&](int64_t unit, int64_t first, int64_t count) {
    Rows part = in;
    part.count = count;
    each_row_pass<kRows>(part, [&](auto r, int64_t s) { work(unit, r, first + s); });
  });
}

// a key row into its transposed block (kt: one KV head's [capacity/16, hd, 16]); a value row as it is
template <typename T>
void store_value(T* dst, const float* src, int64_t n) {
  if constexpr (sizeof(T) == 4) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
  }
}

template <typename T>
void store_key(T* kt, int64_t position, const float* src, int64_t hd) {
  T* dst = kt + (position / 16) * hd * 16 + position % 16;
  for (int64_t i = 0; i < hd; i++) {
    if constexpr (sizeof(T) == 4)
      dst[i * 16] = src[i];
    else
      dst[i * 16] = float_to_bf16(src[i]);
  }
}

}  // namespace
