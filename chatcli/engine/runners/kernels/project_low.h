// The decode step's projections of GGUF's low-bit K-quants, Q3_K and Q2_K (each value as the file holds
// it), AVX-512 with VNNI; project_low_avx2.h does the same on AVX2. Super-blocks of 256 inputs, a scale
// per 16; 16 outputs a block, groups of 32 inputs, quad q of a group its inputs 4q..4q+3:
//   w  [ceil(n/16)][kp/32][2][64]: vector v, byte lane L (output L/4, input L%4 of a quad): bits 2j, 2j+1
//      the low 2 bits of the code of quad 4v + j (the group's first 16 inputs in vector 0, the next in 1)
//   hi [..][kp/32][64] (Q3_K): bit q of lane L, the third bit of quad q's code (as Q5_K's fifth)
//   d  fp16 [..][kp/256][16]; Q2_K's dmin (`mins`) likewise
//   sc [..][kp/32][16][2]: per output, the group's two 16s side by side: Q3_K's 6-bit scale less 32 as
//      int8; Q2_K's byte as the file holds it, the scale in its low nibble, the min in its high one
// Q3_K: w = d sc (c - 4), c 0..7; Q2_K: w = d sc c - dmin m, c 0..3.
// Per output, each 16's dot of codes and a row's int8 activations is exact in int32 (VPDPBUSD), at most
// 16 * 7 * 128 in magnitude: the two of a group fit a pair of int16 lanes, and one VPMADDWD with the
// scales' pairs gives the group's integer sum I = sc_a dot_a + sc_b dot_b (Q3_K: of dot - 4 hsum; Q2_K's
// mins I_m = m_a hsum_a + m_b hsum_b likewise). The row's fp32 sum then adds, groups in order,
// (d gs) I, less (dmin gs) I_m.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project.h"

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
  const __m512i crumb = _mm512_set1_epi8(3), third = _mm512_set1_epi8(4);
  __m512 sum[R];
  for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_ps();
  __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0) {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + g / 8 * 16)));
      if constexpr (!k3) dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + g / 8 * 16)));
    }
    const uint8_t* wg = w + g * 128;
    prefetch_lines<128>(wg + kPrefetchGroups * 128);
    if constexpr (k3) prefetch_lines<64>(hip + (g + kPrefetchGroups) * 64);
    const __m512i high = k3 ? _mm512_loadu_si512(hip + g * 64) : _mm512_setzero_si512();
    __m512i acc[R][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int v = 0; v < 2; v++) {
      const __m512i crumbs = _mm512_loadu_si512(wg + v * 64);
      for (int j = 0; j < 4; j += 2) {  // quads q, q + 1
        const int q = 4 * v + j;
        __m512i c0 = _mm512_and_si512(shift16(crumbs, -2 * j), crumb);
        __m512i c1 = _mm512_and_si512(shift16(crumbs, -2 * j - 2), crumb);
        if constexpr (k3) {  // quad q's bit q -> bit 2
          c0 = _mm512_or_si512(c0, _mm512_and_si512(shift16(high, 2 - q), third));
          c1 = _mm512_or_si512(c1, _mm512_and_si512(shift16(high, 1 - q), third));
        }
        for (int r = 0; r < R; r++) {
          const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + q;
          acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], c0, _mm512_set1_epi32(xr[0]));
          acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], c1, _mm512_set1_epi32(xr[1]));
        }
      }
    }
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scp + g * 32));
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m512i scales = k3 ? _mm512_cvtepi8_epi16(bytes) : _mm512_cvtepu8_epi16(_mm256_and_si256(bytes, nibble));
    const __m512i mins = k3 ? _mm512_setzero_si512() : _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
    for (int r = 0; r < R; r++) {
      const int64_t s = s0 + r;
      const int32_t* hs = in.hsum + s * halves + 2 * g;
      const float gs = in.gs[s * groups + g];
      __m512i dots = _mm512_mask_blend_epi16(0xAAAAAAAAu, acc[r][0], _mm512_slli_epi32(acc[r][1], 16));
      if constexpr (k3) dots = _mm512_sub_epi16(dots, _mm512_set1_epi32(int16_pair(4 * hs[0], 4 * hs[1])));
      const __m512i total = _mm512_madd_epi16(dots, scales);
      sum[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(gs)), _mm512_cvtepi32_ps(total), sum[r]);
      if constexpr (!k3) {
        const __m512i least = _mm512_madd_epi16(_mm512_set1_epi32(int16_pair(hs[0], hs[1])), mins);
        sum[r] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, _mm512_set1_ps(gs)), _mm512_cvtepi32_ps(least), sum[r]);
      }
    }
  }
  store_block<R>(sum, m, b, s0, y, ldy, accumulate);
}

}  // namespace
