// The decode step's projections of GGUF's IQ4_NL and IQ4_XS on AVX2, in project_iq4.h's layout (described
// there), on two halves of 8 outputs (bytes 0..31 of a 64-byte vector outputs 0..7, 32..63 outputs
// 8..15). The indices look their signed values up (VPSHUFB, the table in each 128-bit lane); VPMADDUBSW
// multiplies |v| by the activations given v's sign (VPSIGNB: v is never 0), each int16 of its result two
// products of at most 127 * 127, widened to int32 at once (VPMADDWD with ones): the group's dot I is
// project_iq4.h's exactly, and so are the fp32 sums that follow, bit for bit.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project_avx2.h"

namespace {

// y[s, n0..n0+16) for rows s0..s0+R, IQ4_NL or IQ4_XS block b (kKind: WEIGHT_IQ4NL or _IQ4XS)
template <int R, int kKind>
void iq4_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool xs = kKind == WEIGHT_IQ4XS;
  const int64_t groups = m.kp / 32, supers = m.kp / 256;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 256;
  const uint16_t* dp = m.d + b * (xs ? supers : groups) * 16;
  const uint8_t* scp = xs ? m.sc + b * groups * 16 : nullptr;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(iq4_table<kKind>())));
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 sum[R][2];
  for (int r = 0; r < R; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
  __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < groups; g++) {
    if constexpr (kKind == WEIGHT_MXFP4)  // bf16: the E8M0 scale's exponent, exact
      for (int h = 0; h < 2; h++)
        d[h] = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp + g * 16 + 8 * h))), 16));
    else if (!xs || g % 8 == 0)
      for (int h = 0; h < 2; h++)
        d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp + (xs ? g / 8 : g) * 16 + 8 * h)));
    const uint8_t* wg = w + g * 256;
    prefetch_lines<256>(wg + kPrefetchGroups * 256);
    const int32_t* xr[R];
    for (int r = 0; r < R; r++) xr[r] = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8;
    for (int h = 0; h < 2; h++) {
      __m256i acc[R];
      for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_si256();
      for (int p = 0; p < 4; p++) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * 64 + 32 * h));
        const __m256i c0 = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nibble));
        const __m256i c1 = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
        const __m256i a0 = _mm256_abs_epi8(c0), a1 = _mm256_abs_epi8(c1);
        for (int r = 0; r < R; r++) {
          const __m256i x0 = _mm256_sign_epi8(_mm256_set1_epi32(xr[r][2 * p]), c0);
          const __m256i x1 = _mm256_sign_epi8(_mm256_set1_epi32(xr[r][2 * p + 1]), c1);
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, x0), ones));
          acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, x1), ones));
        }
      }
      const __m256i scales =
          xs ? _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scp + g * 16 + 8 * h)))
             : _mm256_setzero_si256();
      for (int r = 0; r < R; r++) {
        const __m256i dot = xs ? _mm256_mullo_epi32(acc[r], scales) : acc[r];
        const float gs = in.gs[(s0 + r) * groups + g];
        sum[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(d[h], _mm256_set1_ps(gs)), _mm256_cvtepi32_ps(dot), sum[r][h]);
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) store_first(y + (s0 + r) * ldy + n0 + 8 * h, m.n - n0 - 8 * h, sum[r][h], accumulate);
}

}  // namespace
