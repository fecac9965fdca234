// The decode step's projections of GGUF's IQ4_NL and IQ4_XS (each value as the file holds it), AVX-512
// with VNNI; project_iq4_avx2.h does the same on AVX2. A weight is a 4-bit index into kIQ4Values (16
// int8, common.h) times a scale: IQ4_NL's fp16 d per group of 32; IQ4_XS's fp16 d per super-block of 256
// times a 6-bit scale less 32 per group. 16 outputs a block, the indices packed as q4's codes (project.h):
//   w  [ceil(n/16)][kp/32][4][64]: quad 2j of a group in the low nibbles of vector j, 2j + 1 in the high
//   d  IQ4_NL: fp16 [..][kp/32][16]; IQ4_XS: fp16 [..][kp/256][16]
//   sc IQ4_XS: int8 [..][kp/32][16], the group's scale less 32 (-32..31)
// The indices look their values up 64 at a time (VPSHUFB, the table in each 128-bit lane) as v + 128,
// unsigned (1..241) for VPDPBUSD: per output and group the dot with a row's int8 activations is exact in
// int32, and less 128 times the activations' sum (hsum) it is the signed dot I of the values themselves.
// IQ4_XS's I is then times its scale (at most 32 * 32 * 127 * 127 in magnitude: exact in int32 and in
// fp32). The row's fp32 sum adds, groups in order, (d gs) I.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project.h"

namespace {

// y[s, n0..n0+16) for rows s0..s0+R, IQ4_NL, IQ4_XS or MXFP4 block b (kKind: WEIGHT_IQ4NL, _IQ4XS or _MXFP4;
// MXFP4 as IQ4_NL with its own table and its d in bf16)
template <int R, int kKind>
void iq4_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool xs = kKind == WEIGHT_IQ4XS;
  const int64_t groups = m.kp / 32, supers = m.kp / 256, halves = m.kp / 16;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 256;
  const uint16_t* dp = m.d + b * (xs ? supers : groups) * 16;
  const uint8_t* scp = xs ? m.sc + b * groups * 16 : nullptr;
  alignas(16) uint8_t shifted[16];
  for (int i = 0; i < 16; i++) shifted[i] = static_cast<uint8_t>(iq4_table<kKind>()[i] + 128);
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 sum[R];
  for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_ps();
  __m512 d = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    if constexpr (kKind == WEIGHT_MXFP4)  // bf16: the E8M0 scale's exponent, exact
      d = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + g * 16))), 16));
    else if (!xs || g % 8 == 0)
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + (xs ? g / 8 : g) * 16)));
    const uint8_t* wg = w + g * 256;
    prefetch_lines<256>(wg + kPrefetchGroups * 256);
    __m512i acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
      const __m512i v = _mm512_loadu_si512(wg + p * 64);
      const __m512i c0 = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nibble));
      const __m512i c1 = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
      for (int r = 0; r < R; r++) {
        const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
        acc[r] = _mm512_dpbusd_epi32(acc[r], c0, _mm512_set1_epi32(xr[0]));
        acc[r] = _mm512_dpbusd_epi32(acc[r], c1, _mm512_set1_epi32(xr[1]));
      }
    }
    const __m512i scales =
        xs ? _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + g * 16))) : _mm512_setzero_si512();
    for (int r = 0; r < R; r++) {
      const int64_t s = s0 + r;
      const int32_t* hs = in.hsum + s * halves + 2 * g;
      __m512i dot = _mm512_sub_epi32(acc[r], _mm512_set1_epi32(128 * (hs[0] + hs[1])));
      if constexpr (xs) dot = _mm512_mullo_epi32(dot, scales);
      sum[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(in.gs[s * groups + g])), _mm512_cvtepi32_ps(dot), sum[r]);
    }
  }
  store_block<R>(sum, m, b, s0, y, ldy, accumulate);
}

}  // namespace
