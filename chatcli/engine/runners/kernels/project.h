// The decode step's projections (see decode.cpp), AVX-512 with VNNI: y [S, n] = x [S, k] W^T
// for each weight kind (project_avx2.h: the same on AVX2), split over an OpenMP team by steps.h.
//
//   int8: W packed as [ceil(n/16)][kp/4][16][4] int8 (16 outputs a block, 4 consecutive k
//     per 32-bit lane, as VPDPBUSD wants), symmetric per output row, scale [n], row sums
//     [n] (for the activations' zero point): y = xs * ws * (sum xq * wq - xz * wsum).
//   q4 / q8 (GGUF's Q4_0, Q4_1, Q8_0 blocks as they are): groups of 32 inputs, per output and group
//     a scale d and, for Q4_1, a min m (fp16), unsigned codes c: w = d c + m, or d (c - 8) (Q4_0,
//     no mins) or d (c - 128) (Q8_0). Packed [ceil(n/16)][kp/32][quads][64] bytes, 16 outputs a block: q8
//     8 quads of 16 outputs x 4 inputs; q4 4 such quads of bytes, each byte holding quad 2j in its low
//     nibble and 2j + 1 in its high one; d, m [ceil(n/16)][kp/32][16]. The activations get an int8
//     scale per row and group (GGUF's Q8_1): y = sum_g d sx_g (sum c xq) + m sx_g (sum xq).
//     The RMSNorm weight before such a projection is applied to the activations (`norm`), not folded.
//   K-quants (GGUF's Q4_K, Q5_K, Q6_K, each value as the file holds it): super-blocks of 256 inputs. The
//     codes' low 4 bits are packed as q4's [ceil(n/16)][kp/32][4][64]; their high bits (Q5_K: one, Q6_K: two)
//     in `hi`, [..][kp/32][64] (Q5_K: byte lane L's bit q is the 5th bit of quad q's lane L) or
//     [..][kp/32][2][64] (Q6_K: vector q/4, bits 2(q%4) and 2(q%4)+1 of lane L: quad q's 5th and 6th).
//     Q4_K / Q5_K: w = d sc c - dmin m, fp16 d and dmin [ceil(n/16)][kp/256][16], 6-bit sc and m per group
//     of 32 [..][kp/32][16] (bytes); Q6_K: w = d sc (c - 32), int8 sc per 16 inputs [..][kp/16][16].
//     Activations as for q4 / q8 (a scale per group of 32), with their sums per 16 (`hsum`) for Q6_K.
//   fp32: W in panels of 64 outputs, [ceil(n/64)][k][64], zero past n: each thread streams whole
//     panels, contiguous (a transposed [k, n] layout put the rows of a wide matrix in the same cache sets).
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.h"

namespace {

constexpr int kRowsPerPass = 8;  // int8, q4, q8, K-quants: rows that share one read of a weight block (at most)
constexpr int kUnpackRows = 16;  // rows from which a K-quant projection unpacks each block's codes once (steps.h)
constexpr int kF32Rows = 6;      // fp32: rows a pass over a panel computes (6 x 4 accumulators)

// y[s, n0..n0+16) for rows s0..s0+R, int8 block b; accumulate: y += instead of y =
template <int R>
void int8_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t quads = m.kp / 4;
  const int8_t* w = static_cast<const int8_t*>(m.w) + b * quads * 64;
  __m512i acc[R][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  int64_t q = 0;
  for (; q + 2 <= quads; q += 2) {
    const __m512i w0 = _mm512_loadu_si512(w + q * 64), w1 = _mm512_loadu_si512(w + q * 64 + 64);
    for (int r = 0; r < R; r++) {
      const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(xr[q]), w0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], _mm512_set1_epi32(xr[q + 1]), w1);
    }
  }
  if (q < quads) {
    const __m512i w0 = _mm512_loadu_si512(w + q * 64);
    for (int r = 0; r < R; r++) {
      const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(xr[q]), w0);
    }
  }
  const int64_t n0 = b * 16;
  const int64_t width = std::min<int64_t>(16, m.n - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1u);
  const __m512 ws = _mm512_maskz_loadu_ps(mask, m.scale + n0);
  const __m512i wsum = _mm512_maskz_loadu_epi32(mask, m.wsum + n0);
  for (int r = 0; r < R; r++) {
    const int64_t s = s0 + r;
    const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(acc[r][0], acc[r][1]),
                                         _mm512_mullo_epi32(_mm512_set1_epi32(in.xz[s]), wsum));
    __m512 val = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(in.xs[s]), ws), _mm512_cvtepi32_ps(dot));
    float* out = y + s * ldy + n0;
    if (accumulate) val = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), val);
    _mm512_mask_storeu_ps(out, mask, val);
  }
}

// y[s0 + r, 16 b..16 b + 16) for R rows = sum[r] (+= with accumulate), outputs past n left alone
template <int R>
void store_block(const __m512* sum, const Matrix& m, int64_t b, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t n0 = b * 16;
  const int64_t width = std::min<int64_t>(16, m.n - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1u);
  for (int r = 0; r < R; r++) {
    float* out = y + (s0 + r) * ldy + n0;
    const __m512 val = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), sum[r]) : sum[r];
    _mm512_mask_storeu_ps(out, mask, val);
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, q4 or q8 block b (kQuads: 4 nibble pairs or 8 byte quads a
// group). Each group's dot is exact in int32; the row's fp32 sum adds d sx dot + m sum, groups in order.
template <int R, int kQuads>
void group_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t groups = m.kp / 32;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * kQuads * 64;
  const uint16_t* dp = m.d + b * groups * 16;
  const uint16_t* mp = m.mins ? m.mins + b * groups * 16 : nullptr;
  const float offset = kQuads == 8 ? -128.f : -8.f;  // the codes' zero where there are no mins
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 sum[R];
  for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* wg = w + g * kQuads * 64;
    prefetch_lines<kQuads * 64>(wg + kPrefetchGroups * kQuads * 64);
    __m512i acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
      __m512i c0, c1;
      if constexpr (kQuads == 4) {
        const __m512i v = _mm512_loadu_si512(wg + p * 64);
        c0 = _mm512_and_si512(v, nibble);
        c1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      } else {
        c0 = _mm512_loadu_si512(wg + 2 * p * 64);
        c1 = _mm512_loadu_si512(wg + 2 * p * 64 + 64);
      }
      for (int r = 0; r < R; r++) {
        const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
        acc[r] = _mm512_dpbusd_epi32(acc[r], c0, _mm512_set1_epi32(xr[0]));
        acc[r] = _mm512_dpbusd_epi32(acc[r], c1, _mm512_set1_epi32(xr[1]));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + g * 16)));
    const __m512 mn = mp ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + g * 16)))
                         : _mm512_mul_ps(d, _mm512_set1_ps(offset));
    for (int r = 0; r < R; r++) {
      const int64_t at = (s0 + r) * groups + g;
      sum[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(in.gs[at])), _mm512_cvtepi32_ps(acc[r]), sum[r]);
      sum[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(in.gsum[at]), sum[r]);
    }
  }
  store_block<R>(sum, m, b, s0, y, ldy, accumulate);
}

// v shifted left by `bits` (right where negative), in 16-bit lanes: the bits moved stay in their byte
// where the caller masks the result to bits that came from the same byte
inline __m512i shift16(__m512i v, int bits) {
  return bits >= 0 ? _mm512_sll_epi16(v, _mm_cvtsi32_si128(bits)) : _mm512_srl_epi16(v, _mm_cvtsi32_si128(-bits));
}

// a K-quant group's codes of quads 2p (c0) and 2p + 1 (c1), whole: the low 4 bits from the group's codes wg,
// the high ones (Q5_K: one, Q6_K: two) from its vectors `high` (kquant_block's and project_amx.h's)
template <int kKind>
inline void kquant_codes(const uint8_t* wg, const __m512i (&high)[2], int p, __m512i& c0, __m512i& c1) {
  constexpr int kHigh = kHighVectors<kKind>;
  const __m512i nibble = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(kKind == WEIGHT_Q6K ? 0x30 : 0x10);
  const __m512i v = _mm512_loadu_si512(wg + p * 64);
  c0 = _mm512_and_si512(v, nibble);
  c1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
  if constexpr (kHigh == 1) {  // quad q's bit q -> bit 4
    c0 = _mm512_or_si512(c0, _mm512_and_si512(shift16(high[0], 4 - 2 * p), top));
    c1 = _mm512_or_si512(c1, _mm512_and_si512(shift16(high[0], 3 - 2 * p), top));
  } else if constexpr (kHigh == 2) {  // quad q's bits 2(q%4), +1 of vector q/4 -> bits 4, 5
    const __m512i hv = high[p / 2];
    c0 = _mm512_or_si512(c0, _mm512_and_si512(shift16(hv, 4 - 2 * (2 * p % 4)), top));
    c1 = _mm512_or_si512(c1, _mm512_and_si512(shift16(hv, 4 - 2 * ((2 * p + 1) % 4)), top));
  }
}

// group g's codes of K-quant block b as kquant_block makes them, one byte a code: out [8][64], quad 2p then 2p + 1
// (the layout of AMX's B tile: 16 outputs x 4 inputs a row), for the passes over many rows that read them unpacked
// (kquant_block<R, kKind, true>, kquant_amx)
template <int kKind>
inline void unpack_group(const Matrix& m, int64_t b, int64_t g, uint8_t* out) {
  constexpr int kHigh = kHighVectors<kKind>;
  const KBlock block = k_block<kKind>(m, b);
  const uint8_t* wg = block.w + g * 256;
  prefetch_lines<256>(wg + kPrefetchGroups * 256);
  if constexpr (kHigh > 0) prefetch_lines<64 * kHigh>(block.hi + (g + kPrefetchGroups) * kHigh * 64);
  __m512i high[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int v = 0; v < kHigh; v++) high[v] = _mm512_loadu_si512(block.hi + (g * kHigh + v) * 64);
  for (int p = 0; p < 4; p++) {
    __m512i c0, c1;
    kquant_codes<kKind>(wg, high, p, c0, c1);
    _mm512_store_si512(out + 2 * p * 64, c0);
    _mm512_store_si512(out + (2 * p + 1) * 64, c1);
  }
}

// The fp32 sums that follow a group's exact int32 dots (dot(r, h): row r's, of the group's scale h), for rows
// s0..s0+R of a K-quant block: d sc gs dot - dmin m gsum (Q4_K, Q5_K) or gs (d sc_a dot_a + d sc_b dot_b) (Q6_K,
// its dots less 32 times their activations' sums). kquant_block and kquant_amx (project_amx.h) both sum so,
// so a row gives the same bits from either.
template <int R, bool k6, typename Dot>
inline void kquant_sums(__m512 (&sum)[R], const Rows& in, int64_t s0, int64_t g, int64_t groups, __m512 d, __m512 dmin,
                        const uint8_t* scp, const uint8_t* smp, Dot dot) {
  if constexpr (k6) {
    const int64_t halves = 2 * groups;
    const __m512 da = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + g * 32)))));
    const __m512 db = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + g * 32 + 16)))));
    for (int r = 0; r < R; r++) {
      const int64_t s = s0 + r;
      const int32_t* hs = in.hsum + s * halves + 2 * g;
      const __m512 a = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot(r, 0), _mm512_set1_epi32(32 * hs[0])));
      const __m512 bb = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot(r, 1), _mm512_set1_epi32(32 * hs[1])));
      const __m512 t = _mm512_fmadd_ps(da, a, _mm512_mul_ps(db, bb));
      sum[r] = _mm512_fmadd_ps(_mm512_set1_ps(in.gs[s * groups + g]), t, sum[r]);
    }
  } else {
    const __m512 dg = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scp + g * 16)))));
    const __m512 mg = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(smp + g * 16)))));
    for (int r = 0; r < R; r++) {
      const int64_t at = (s0 + r) * groups + g;
      sum[r] = _mm512_fmadd_ps(_mm512_mul_ps(dg, _mm512_set1_ps(in.gs[at])), _mm512_cvtepi32_ps(dot(r, 0)), sum[r]);
      sum[r] = _mm512_fnmadd_ps(mg, _mm512_set1_ps(in.gsum[at]), sum[r]);
    }
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, K-quant block b (kKind: WEIGHT_Q4K, _Q5K or _Q6K). Per group of 32 inputs
// the codes' dot with a row's int8 activations is exact in int32 (Q6_K: one dot per 16 inputs, less 32 times
// their sum); the row's fp32 sum then adds, groups in order, d sc gs dot - dmin m gsum (Q4_K, Q5_K) or
// gs (d sc_a dot_a + d sc_b dot_b) (Q6_K).
// kUnpacked: the codes from `codes`, the block's every group's as unpack_group left them, not from the weights.
template <int R, int kKind, bool kUnpacked = false>
void kquant_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate,
                  const uint8_t* codes = nullptr) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kScales = k6 ? 2 : 1;                                         // scales a group: per 16 or 32 inputs
  constexpr int kHigh = kHighVectors<kKind>;
  const int64_t groups = m.kp / 32;
  const auto [w, dp, mp, scp, smp, hip] = k_block<kKind>(m, b);
  __m512 sum[R];
  for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_ps();
  __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0) {
      d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + g / 8 * 16)));
      if constexpr (!k6) dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + g / 8 * 16)));
    }
    const uint8_t* wg = w + g * 256;
    __m512i high[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    if constexpr (!kUnpacked) {
      prefetch_lines<256>(wg + kPrefetchGroups * 256);
      if constexpr (kHigh > 0) prefetch_lines<64 * kHigh>(hip + (g + kPrefetchGroups) * kHigh * 64);
      for (int v = 0; v < kHigh; v++) high[v] = _mm512_loadu_si512(hip + (g * kHigh + v) * 64);
    }
    __m512i acc[R][kScales];
    for (int r = 0; r < R; r++)
      for (int h = 0; h < kScales; h++) acc[r][h] = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
      __m512i c0, c1;
      if constexpr (kUnpacked) {
        c0 = _mm512_load_si512(codes + g * 512 + 2 * p * 64);
        c1 = _mm512_load_si512(codes + g * 512 + (2 * p + 1) * 64);
      } else {
        kquant_codes<kKind>(wg, high, p, c0, c1);
      }
      const int slot = k6 ? p / 2 : 0;
      for (int r = 0; r < R; r++) {
        const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
        acc[r][slot] = _mm512_dpbusd_epi32(acc[r][slot], c0, _mm512_set1_epi32(xr[0]));
        acc[r][slot] = _mm512_dpbusd_epi32(acc[r][slot], c1, _mm512_set1_epi32(xr[1]));
      }
    }
    kquant_sums<R, k6>(sum, in, s0, g, groups, d, dmin, scp, smp, [&](int r, int h) { return acc[r][h]; });
  }
  store_block<R>(sum, m, b, s0, y, ldy, accumulate);
}

// y[s, p*64..p*64+64) for rows s0..s0+R from fp32 panel p ([k][64], zero past n)
template <int R>
void f32_panel(const Matrix& m, int64_t p, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const float* w = static_cast<const float*>(m.w) + p * m.k * kPanel;
  __m512 acc[R][4];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
  const float* x = in.x + s0 * in.ldx;
  for (int64_t k = 0; k < m.k; k++) {
    const float* wk = w + k * kPanel;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 8 * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 8 * kPanel + 32), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16), w2 = _mm512_loadu_ps(wk + 32),
                 w3 = _mm512_loadu_ps(wk + 48);
    for (int r = 0; r < R; r++) {
      const __m512 xb = _mm512_set1_ps(x[r * in.ldx + k]);
      acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(xb, w3, acc[r][3]);
    }
  }
  const int64_t n0 = p * kPanel;
  for (int v = 0; v < 4; v++) {
    const int64_t width = std::clamp<int64_t>(m.n - n0 - 16 * v, 0, 16);
    if (width == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1u);
    for (int r = 0; r < R; r++) {
      float* out = y + (s0 + r) * ldy + n0 + 16 * v;
      const __m512 val = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), acc[r][v]) : acc[r][v];
      _mm512_mask_storeu_ps(out, mask, val);
    }
  }
}

}  // namespace
