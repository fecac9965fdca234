// The decode step's projections of GGUF's Q3_K and Q2_K on AVX2, in project_low.h's layout and with
// its sums (described there), on two halves of 8 outputs (bytes 0..31 of a 64-byte vector outputs 0..7,
// 32..63 outputs 8..15). The codes (0..7) times a row's int8 activations go through VPMADDUBSW: over a
// 16 of inputs each int16 of its sums holds 8 products, at most 8 * 7 * 128 = 7168 in magnitude, widened
// to the 16's int32 dot (VPMADDWD with ones); the group's integer sums are then project_low.h's, and
// so are the outputs, bit for bit.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project_avx2.h"

namespace {

// two int16 from the low halves of a and b, b's in the high half: a 32-bit lane
inline int32_t int16_pair(int32_t a, int32_t b) {
  return static_cast<int32_t>((static_cast<uint32_t>(b) << 16) | (static_cast<uint32_t>(a) & 0xFFFFu));
}

// y[s, n0..n0+16) for rows s0..s0+R, Q3_K or Q2_K block b (kKind: WEIGHT_Q3K or _Q2K)
template <int R, int kKind>
void low_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool k3 = kKind == WEIGHT_Q3K;
  const int64_t groups = m.kp / 32, supers = m.kp / 256, halves = m.kp / 16;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 128;
  const uint16_t* dp = m.d + b * supers * 16;
  const uint16_t* mp = k3 ? nullptr : m.mins + b * supers * 16;
  const uint8_t* scp = m.sc + b * groups * 32;
  const uint8_t* hip = k3 ? m.hi + b * groups * 64 : nullptr;
  const __m256i crumb = _mm256_set1_epi8(3), third = _mm256_set1_epi8(4), ones = _mm256_set1_epi16(1);
  const __m128i nibble = _mm_set1_epi8(0x0F);
  __m256 sum[R][2];
  for (int r = 0; r < R; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
  __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, dmin[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0)
      for (int h = 0; h < 2; h++) {
        d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp + g / 8 * 16 + 8 * h)));
        if constexpr (!k3) dmin[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp + g / 8 * 16 + 8 * h)));
      }
    const uint8_t* wg = w + g * 128;
    prefetch_lines<128>(wg + kPrefetchGroups * 128);
    if constexpr (k3) prefetch_lines<64>(hip + (g + kPrefetchGroups) * 64);
    for (int h = 0; h < 2; h++) {
      const __m256i high = k3 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hip + g * 64 + 32 * h)) : _mm256_setzero_si256();
      __m256i dot[R][2];  // per row and 16: the int32 dots
      for (int v = 0; v < 2; v++) {
        const __m256i crumbs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + v * 64 + 32 * h));
        __m256i part[R];
        for (int r = 0; r < R; r++) part[r] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j += 2) {  // quads q, q + 1
          const int q = 4 * v + j;
          __m256i c0 = _mm256_and_si256(shift16(crumbs, -2 * j), crumb);
          __m256i c1 = _mm256_and_si256(shift16(crumbs, -2 * j - 2), crumb);
          if constexpr (k3) {  // quad q's bit q -> bit 2
            c0 = _mm256_or_si256(c0, _mm256_and_si256(shift16(high, 2 - q), third));
            c1 = _mm256_or_si256(c1, _mm256_and_si256(shift16(high, 1 - q), third));
          }
          for (int r = 0; r < R; r++) {
            const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + q;
            part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(c0, _mm256_set1_epi32(xr[0])));
            part[r] = _mm256_add_epi16(part[r], _mm256_maddubs_epi16(c1, _mm256_set1_epi32(xr[1])));
          }
        }
        for (int r = 0; r < R; r++) dot[r][v] = _mm256_madd_epi16(part[r], ones);
      }
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + g * 32 + 16 * h));
      const __m256i scales = k3 ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(_mm_and_si128(bytes, nibble));
      const __m256i mins = k3 ? _mm256_setzero_si256() : _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));
      for (int r = 0; r < R; r++) {
        const int64_t s = s0 + r;
        const int32_t* hs = in.hsum + s * halves + 2 * g;
        const float gs = in.gs[s * groups + g];
        __m256i dots = _mm256_blend_epi16(dot[r][0], _mm256_slli_epi32(dot[r][1], 16), 0xAA);
        if constexpr (k3) dots = _mm256_sub_epi16(dots, _mm256_set1_epi32(int16_pair(4 * hs[0], 4 * hs[1])));
        const __m256i total = _mm256_madd_epi16(dots, scales);
        sum[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d[h], _mm256_set1_ps(gs)), _mm256_cvtepi32_ps(total), sum[r][h]);
        if constexpr (!k3) {
          const __m256i least = _mm256_madd_epi16(_mm256_set1_epi32(int16_pair(hs[0], hs[1])), mins);
          sum[r][h] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin[h], _mm256_set1_ps(gs)), _mm256_cvtepi32_ps(least), sum[r][h]);
        }
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) store_first(y + (s0 + r) * ldy + n0 + 8 * h, m.n - n0 - 8 * h, sum[r][h], accumulate);
}

}  // namespace
