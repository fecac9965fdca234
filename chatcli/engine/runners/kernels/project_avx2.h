// The decode step's projections (see decode.cpp) on AVX2, in project.h's weight layouts (described
// there). AVX2 has no VPDPBUSD: the int8 and q8 dots widen bytes to int16 and sum pairs (VPMADDWD),
// q4's 4-bit codes and the K-quants' 4- to 6-bit ones multiply bytes (VPMADDUBSW), their int16 sums
// widened before they could saturate (project_kquant_avx2.h's kquant_block). The `avxvnni` build (Alder Lake and later, Zen 5:
// __AVXVNNI__) sums q4's, q8's and the K-quants' bytes straight into int32 with AVX-VNNI's 256-bit
// VPDPBUSD. Every dot is still exact in integers, so each output is what project.h's gives.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.h"
#include "simd_avx2.h"

namespace {

constexpr int kRowsPerPass = 2;  // int8, q4, q8: activation rows that share one read of a weight block (at most)
constexpr int kF32Rows = 3;      // fp32: rows a pass over half a panel computes (3 x 4 accumulators)

// Pair sums of 16 outputs x 4 inputs: quad w64 (16 outputs x 4 bytes) times the row's 4 bytes x4,
// each widened to int16; acc[c] holds outputs 4c..4c+3 as 2 pair sums each
template <bool kSignedWeights>
inline void widened_quad(__m256i (&acc)[4], const __m256i (&w)[4], int32_t x4) {
  const __m128i xb = _mm_set1_epi32(x4);
  const __m256i x = kSignedWeights ? _mm256_cvtepu8_epi16(xb) : _mm256_cvtepi8_epi16(xb);
  for (int c = 0; c < 4; c++) acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(x, w[c]));
}

template <bool kSignedWeights>
inline void widen_quad(const void* w64, __m256i (&w)[4]) {
  const __m128i* p = static_cast<const __m128i*>(w64);
  for (int c = 0; c < 4; c++) {
    const __m128i b = _mm_loadu_si128(p + c);
    w[c] = kSignedWeights ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
  }
}

// the pair sums of widened_quad -> the 16 outputs' dots, in order: lo 0..7, hi 8..15
inline void pair_sums_to_dots(const __m256i (&acc)[4], __m256i& lo, __m256i& hi) {
  lo = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[0], acc[1]), _MM_SHUFFLE(3, 1, 2, 0));
  hi = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[2], acc[3]), _MM_SHUFFLE(3, 1, 2, 0));
}

// out[0..width) = (accumulate ? out + val : val), width 0..8
inline void store_first(float* out, int64_t width, __m256 val, bool accumulate) {
  if (width <= 0) return;
  const __m256i mask = first_lanes(std::min<int64_t>(width, 8));
  if (accumulate) val = _mm256_add_ps(_mm256_maskload_ps(out, mask), val);
  _mm256_maskstore_ps(out, mask, val);
}

// y[s, n0..n0+16) for rows s0..s0+R, int8 block b; accumulate: y += instead of y =
template <int R>
void int8_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t quads = m.kp / 4;
  const int8_t* w = static_cast<const int8_t*>(m.w) + b * quads * 64;
  __m256i acc[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_si256();
  for (int64_t q = 0; q < quads; q++) {
    __m256i wq[4];
    widen_quad<true>(w + q * 64, wq);
    for (int r = 0; r < R; r++)
      widened_quad<true>(acc[r], wq, reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp)[q]);
  }
  const int64_t n0 = b * 16;
  for (int half = 0; half < 2; half++) {
    const int64_t width = std::min<int64_t>(8, m.n - n0 - 8 * half);
    if (width <= 0) break;
    const __m256i mask = first_lanes(width);
    const __m256 ws = _mm256_maskload_ps(m.scale + n0 + 8 * half, mask);
    const __m256i wsum = _mm256_maskload_epi32(m.wsum + n0 + 8 * half, mask);
    for (int r = 0; r < R; r++) {
      const int64_t s = s0 + r;
      __m256i lo, hi;
      pair_sums_to_dots(acc[r], lo, hi);
      const __m256i dot = _mm256_sub_epi32(half ? hi : lo, _mm256_mullo_epi32(_mm256_set1_epi32(in.xz[s]), wsum));
      const __m256 val = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(in.xs[s]), ws), _mm256_cvtepi32_ps(dot));
      store_first(y + s * ldy + n0 + 8 * half, width, val, accumulate);
    }
  }
}

// the exact dots of one group of 32 inputs, 16 outputs: lo 0..7, hi 8..15 (kQuads 4: q4, 8: q8)
template <int kQuads>
inline void group_dots(const uint8_t* wg, const int32_t* xr, __m256i& lo, __m256i& hi) {
#if defined(__AVXVNNI__)
  lo = hi = _mm256_setzero_si256();
  if constexpr (kQuads == 4) {  // quad 2p in the low nibbles, 2p + 1 in the high ones
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int p = 0; p < 4; p++) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * 64));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * 64 + 32));
      const __m256i x0 = _mm256_set1_epi32(xr[2 * p]), x1 = _mm256_set1_epi32(xr[2 * p + 1]);
      lo = _mm256_dpbusd_avx_epi32(lo, _mm256_and_si256(v0, nibble), x0);
      hi = _mm256_dpbusd_avx_epi32(hi, _mm256_and_si256(v1, nibble), x0);
      lo = _mm256_dpbusd_avx_epi32(lo, _mm256_and_si256(_mm256_srli_epi16(v0, 4), nibble), x1);
      hi = _mm256_dpbusd_avx_epi32(hi, _mm256_and_si256(_mm256_srli_epi16(v1, 4), nibble), x1);
    }
  } else {
    for (int j = 0; j < 8; j++) {
      const __m256i x = _mm256_set1_epi32(xr[j]);
      lo = _mm256_dpbusd_avx_epi32(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + j * 64)), x);
      hi = _mm256_dpbusd_avx_epi32(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + j * 64 + 32)), x);
    }
  }
  return;
#endif
  if constexpr (kQuads == 4) {  // codes 0..15: a group's 16 products a pair slot sum to at most 30480 in int16
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * 64));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * 64 + 32));
      const __m256i x0 = _mm256_set1_epi32(xr[2 * p]), x1 = _mm256_set1_epi32(xr[2 * p + 1]);
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(v0, nibble), x0));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(v1, nibble), x0));
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v0, 4), nibble), x1));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v1, 4), nibble), x1));
    }
    const __m256i ones = _mm256_set1_epi16(1);
    lo = _mm256_madd_epi16(s0, ones);
    hi = _mm256_madd_epi16(s1, ones);
  } else {  // codes 0..255 would saturate VPMADDUBSW's pairs: widened
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 8; j++) {
      __m256i wq[4];
      widen_quad<false>(wg + j * 64, wq);
      widened_quad<false>(acc, wq, xr[j]);
    }
    pair_sums_to_dots(acc, lo, hi);
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, q4 or q8 block b: project.h's group_block, the same sums in order
template <int R, int kQuads>
void group_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t groups = m.kp / 32;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * kQuads * 64;
  const uint16_t* dp = m.d + b * groups * 16;
  const uint16_t* mp = m.mins ? m.mins + b * groups * 16 : nullptr;
  const float offset = kQuads == 8 ? -128.f : -8.f;  // the codes' zero where there are no mins
  __m256 sum[R][2];
  for (int r = 0; r < R; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* wg = w + g * kQuads * 64;
    prefetch_lines<kQuads * 64>(wg + kPrefetchGroups * kQuads * 64);
    __m256 d[2], mn[2];
    for (int h = 0; h < 2; h++) {
      d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp + g * 16 + 8 * h)));
      mn[h] = mp ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp + g * 16 + 8 * h)))
                 : _mm256_mul_ps(d[h], _mm256_set1_ps(offset));
    }
    for (int r = 0; r < R; r++) {
      __m256i dot[2];
      group_dots<kQuads>(wg, reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8, dot[0], dot[1]);
      const int64_t at = (s0 + r) * groups + g;
      for (int h = 0; h < 2; h++) {
        sum[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d[h], _mm256_set1_ps(in.gs[at])), _mm256_cvtepi32_ps(dot[h]), sum[r][h]);
        sum[r][h] = _mm256_fmadd_ps(mn[h], _mm256_set1_ps(in.gsum[at]), sum[r][h]);
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) store_first(y + (s0 + r) * ldy + n0 + 8 * h, m.n - n0 - 8 * h, sum[r][h], accumulate);
}

// v shifted left by `bits` (right where negative), in 16-bit lanes: project.h's shift16 on 32 bytes
inline __m256i shift16(__m256i v, int bits) {
  return bits >= 0 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(bits)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(-bits));
}

// y[s, p*64 + 32 j..) for rows s0..s0+R from fp32 panel p ([k][64], zero past n), NV vectors of
// 8 outputs from vector v0: a decode row takes the whole panel in one pass, more rows half a panel
template <int R, int NV>
void f32_pass(const Matrix& m, int64_t p, int v0, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const float* w = static_cast<const float*>(m.w) + p * m.k * kPanel + 8 * v0;
  __m256 acc[R][NV];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
  const float* x = in.x + s0 * in.ldx;
  for (int64_t k = 0; k < m.k; k++) {
    const float* wk = w + k * kPanel;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 8 * kPanel), _MM_HINT_T0);
    if constexpr (NV > 4) _mm_prefetch(reinterpret_cast<const char*>(wk + 8 * kPanel + 32), _MM_HINT_T0);
    for (int r = 0; r < R; r++) {
      const __m256 xb = _mm256_set1_ps(x[r * in.ldx + k]);
      for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(wk + 8 * v), acc[r][v]);
    }
  }
  const int64_t n0 = p * kPanel + 8 * v0;
  for (int v = 0; v < NV; v++)
    for (int r = 0; r < R; r++) store_first(y + (s0 + r) * ldy + n0 + 8 * v, m.n - n0 - 8 * v, acc[r][v], accumulate);
}

template <int R>
void f32_panel(const Matrix& m, int64_t p, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  if constexpr (R == 1) {
    f32_pass<1, 8>(m, p, 0, in, s0, y, ldy, accumulate);
  } else {
    f32_pass<R, 4>(m, p, 0, in, s0, y, ldy, accumulate);
    f32_pass<R, 4>(m, p, 4, in, s0, y, ldy, accumulate);
  }
}

}  // namespace
