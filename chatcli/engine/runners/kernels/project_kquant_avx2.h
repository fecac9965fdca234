// The K-quants' projections (Q4_K, Q5_K, Q6_K) on AVX2 (project_avx2.h's other kinds; project.h's kquant_block
// on AVX-512): the same exact dots and the same fp32 sums in order, so the same bits. A prompt's chunk unpacks
// each block's codes and scale vectors once (unpack_codes), and its passes of rows read them half a block at a
// time (kquant_block_unpacked, through steps.h's project_unpacked); a decode step's rows unpack the codes as they
// go (kquant_block).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project_avx2.h"

namespace {

// a K-quant group's codes of quads 2p (c0) and 2p + 1 (c1) in half h, whole: the low 4 bits from the group's
// codes wg, the high ones (Q5_K: one, Q6_K: two) from its vectors high [vector][half]
template <int kKind>
inline void kquant_codes(const uint8_t* wg, const __m256i (&high)[2][2], int p, int h, __m256i& c0, __m256i& c1) {
  constexpr int kHigh = kHighVectors<kKind>;
  const __m256i nibble = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(kKind == WEIGHT_Q6K ? 0x30 : 0x10);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + p * 64 + 32 * h));
  c0 = _mm256_and_si256(v, nibble);
  c1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  if constexpr (kHigh == 1) {  // quad q's bit q -> bit 4
    c0 = _mm256_or_si256(c0, _mm256_and_si256(shift16(high[0][h], 4 - 2 * p), top));
    c1 = _mm256_or_si256(c1, _mm256_and_si256(shift16(high[0][h], 3 - 2 * p), top));
  } else if constexpr (kHigh == 2) {  // quad q's bits 2(q%4), +1 of vector q/4 -> bits 4, 5
    const __m256i hv = high[p / 2][h];
    c0 = _mm256_or_si256(c0, _mm256_and_si256(shift16(hv, 4 - 2 * (2 * p % 4)), top));
    c1 = _mm256_or_si256(c1, _mm256_and_si256(shift16(hv, 4 - 2 * ((2 * p + 1) % 4)), top));
  }
}

// group g's high bits: [vector][half] (none for Q4_K)
template <int kHigh>
inline void kquant_high(const uint8_t* hip, int64_t g, __m256i (&high)[2][2]) {
  for (int v = 0; v < kHigh; v++)
    for (int h = 0; h < 2; h++) high[v][h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hip + (g * kHigh + v) * 64 + 32 * h));
}

// group g's two scale vectors of half h (8 outputs), from its super-block's d and dmin (halves h): d sc and
// dmin m (Q4_K, Q5_K), or d sc_a and d sc_b (Q6_K: a scale per 16 inputs); scp, smp: the block's scales, mins
template <int kKind>
inline void kquant_group_scales(__m256 d, __m256 dmin, const uint8_t* scp, const uint8_t* smp, int64_t g, int h,
                                __m256& first, __m256& second) {
  if constexpr (kKind == WEIGHT_Q6K) {
    const uint8_t* sg = scp + g * 32 + 8 * h;
    first = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sg)))));
    second = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sg + 16)))));
  } else {
    first = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scp + g * 16 + 8 * h)))));
    second = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(smp + g * 16 + 8 * h)))));
  }
}

// super-block g / 8's d and dmin (none for Q6_K), each as two halves of 8 outputs
template <bool k6>
inline void kquant_super_scales(const uint16_t* dp, const uint16_t* mp, int64_t g, __m256 (&d)[2], __m256 (&dmin)[2]) {
  for (int h = 0; h < 2; h++) {
    d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp + g / 8 * 16 + 8 * h)));
    if constexpr (!k6) dmin[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp + g / 8 * 16 + 8 * h)));
  }
}

#if defined(__AVXVNNI__)
constexpr int kUnpackedPass = 4;  // rows a pass over a block's unpacked codes takes: a row's dots and sum, 3 registers
#else
constexpr int kUnpackedPass = 3;  // the same with a row's int16 partial sums too (5 registers); 4 rows spill
#endif
constexpr int kUnpackRows = 8;  // rows from which a K-quant projection unpacks each block's codes once (unpack_codes)

// K-quant block b's codes, every group's, one byte a code as kquant_block makes them: out [groups][4 p][2 halves]
// [2: quads 2p, 2p + 1][32], then its groups' scale vectors (kquant_group_scales) [groups][2 halves][2][8 floats]:
// what kquant_block_unpacked reads for each pass of rows instead of unpacking the block again (a prompt's
// chunk: a block unpacked once, not once every two rows). out: kUnpackedBytes a group, 32-byte aligned.
constexpr int64_t kUnpackedBytes = 512 + 128;
template <int kKind>
void unpack_codes(const Matrix& m, int64_t b, uint8_t* out) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kHigh = kHighVectors<kKind>;
  const int64_t groups = m.kp / 32;
  const auto [w, dp, mp, scp, smp, hip] = k_block<kKind>(m, b);
  float* scales = reinterpret_cast<float*>(out + groups * 512);
  __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, dmin[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0) kquant_super_scales<k6>(dp, mp, g, d, dmin);
    for (int h = 0; h < 2; h++) {
      __m256 first, second;
      kquant_group_scales<kKind>(d[h], dmin[h], scp, smp, g, h, first, second);
      _mm256_store_ps(scales + (g * 2 + h) * 16, first);
      _mm256_store_ps(scales + (g * 2 + h) * 16 + 8, second);
    }
    const uint8_t* wg = w + g * 256;
    prefetch_lines<256>(wg + kPrefetchGroups * 256);
    if constexpr (kHigh > 0) prefetch_lines<64 * kHigh>(hip + (g + kPrefetchGroups) * kHigh * 64);
    __m256i high[2][2] = {};
    kquant_high<kHigh>(hip, g, high);
    for (int p = 0; p < 4; p++)
      for (int h = 0; h < 2; h++) {
        __m256i c0, c1;
        kquant_codes<kKind>(wg, high, p, h, c0, c1);
        uint8_t* o = out + ((g * 4 + p) * 2 + h) * 64;
        _mm256_store_si256(reinterpret_cast<__m256i*>(o), c0);
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32), c1);
      }
  }
}

// one row's half of a K-quant group, quad pair p: the codes of quads 2p, 2p + 1 (c0, c1) times the row's bytes
// (x0, x1) into the int16 partial sums `part`, widened into the int32 dots acc[slot] every kSteps quad pairs
// (AVX-VNNI: straight into int32); slot: Q6_K's 16 inputs (p / 2), else 0
template <int kKind>
inline void kquant_dot_step(__m256i (&acc)[2], __m256i& part, __m256i c0, __m256i c1, __m256i x0, __m256i x1, int p,
                            __m256i ones) {
  constexpr int kHigh = kHighVectors<kKind>;
  constexpr int kSteps = 4 >> kHigh;                                          // quad pairs summed in int16
  static_assert(kSteps * 4 * 128 * ((16 << kHigh) - 1) <= 32768, "the int16 sums would saturate");
  const int slot = kKind == WEIGHT_Q6K ? p / 2 : 0;
#if defined(__AVXVNNI__)
  acc[slot] = _mm256_dpbusd_avx_epi32(acc[slot], c0, x0);
  acc[slot] = _mm256_dpbusd_avx_epi32(acc[slot], c1, x1);
  (void)part, (void)ones;
#else
  part = _mm256_add_epi16(part, _mm256_maddubs_epi16(c0, x0));
  part = _mm256_add_epi16(part, _mm256_maddubs_epi16(c1, x1));
  if ((p + 1) % kSteps == 0) {  // widen: int32 lane o holds output o's dot
    acc[slot] = _mm256_add_epi32(acc[slot], _mm256_madd_epi16(part, ones));
    part = _mm256_setzero_si256();
  }
#endif
}

// row s's sum of a half after group g: its dots acc by the group's scale vectors (kquant_group_scales: d sc, dmin
// m; Q6_K: d sc_a, d sc_b), project.h's kquant_sums on 8 outputs
template <bool k6>
inline __m256 kquant_group_sum(__m256 sum, const __m256i (&acc)[2], __m256 first, __m256 second, const Rows& in,
                               int64_t s, int64_t g, int64_t groups) {
  if constexpr (k6) {
    const int32_t* hs = in.hsum + s * 2 * groups + 2 * g;
    const __m256 a = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[0], _mm256_set1_epi32(32 * hs[0])));
    const __m256 bb = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[1], _mm256_set1_epi32(32 * hs[1])));
    const __m256 t = _mm256_fmadd_ps(first, a, _mm256_mul_ps(second, bb));
    return _mm256_fmadd_ps(_mm256_set1_ps(in.gs[s * groups + g]), t, sum);
  } else {
    const int64_t at = s * groups + g;
    sum = _mm256_fmadd_ps(_mm256_mul_ps(first, _mm256_set1_ps(in.gs[at])), _mm256_cvtepi32_ps(acc[0]), sum);
    return _mm256_fnmadd_ps(second, _mm256_set1_ps(in.gsum[at]), sum);
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, K-quant block b (kKind: WEIGHT_Q4K, _Q5K or _Q6K): project.h's
// kquant_block, the same exact dots and the same fp32 sums in order, on two halves of 8 outputs (a
// 64-byte vector of codes or high bits: bytes 0..31 outputs 0..7, 32..63 outputs 8..15, 4 bytes each).
// The codes (unsigned, below 2^kBits) times a row's int8 activations go through VPMADDUBSW: each int16
// of its result is 2 products, and an int16 sum of n products is at most n * 128 * (2^kBits - 1) in
// magnitude, so it is widened to int32 (VPMADDWD with ones) every kSteps quad pairs (4 products each):
// Q4_K 4 (16 products, at most 30720), Q5_K 2 (8, 31744), Q6_K 1 (4, 32256), all below 32768.
template <int R, int kKind>
void kquant_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kHigh = kHighVectors<kKind>;
  const int64_t groups = m.kp / 32;
  const auto [w, dp, mp, scp, smp, hip] = k_block<kKind>(m, b);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 sum[R][2];
  for (int r = 0; r < R; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
  __m256 d[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, dmin[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0) kquant_super_scales<k6>(dp, mp, g, d, dmin);
    const uint8_t* wg = w + g * 256;
    prefetch_lines<256>(wg + kPrefetchGroups * 256);
    if constexpr (kHigh > 0) prefetch_lines<64 * kHigh>(hip + (g + kPrefetchGroups) * kHigh * 64);
    __m256i high[2][2] = {};  // [vector][half]
    kquant_high<kHigh>(hip, g, high);
    __m256i acc[R][2][2] = {}, part[R][2] = {};  // per row and half: the int32 dots (Q6_K: two), the int16 sums
    for (int p = 0; p < 4; p++) {
      __m256i c[2][2];  // [half][quad 2p, 2p + 1]: the codes, whole
      for (int h = 0; h < 2; h++) kquant_codes<kKind>(wg, high, p, h, c[h][0], c[h][1]);
      for (int r = 0; r < R; r++) {
        const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
        const __m256i x0 = _mm256_set1_epi32(xr[0]), x1 = _mm256_set1_epi32(xr[1]);
        for (int h = 0; h < 2; h++) kquant_dot_step<kKind>(acc[r][h], part[r][h], c[h][0], c[h][1], x0, x1, p, ones);
      }
    }
    for (int h = 0; h < 2; h++) {
      __m256 first, second;
      kquant_group_scales<kKind>(d[h], dmin[h], scp, smp, g, h, first, second);
      for (int r = 0; r < R; r++) sum[r][h] = kquant_group_sum<k6>(sum[r][h], acc[r][h], first, second, in, s0 + r, g, groups);
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) store_first(y + (s0 + r) * ldy + n0 + 8 * h, m.n - n0 - 8 * h, sum[r][h], accumulate);
}

// kquant_block<R, kKind> from the codes and scale vectors unpack_codes left (a prompt's chunk), half by half: a
// half's dots, partial sums and sums for R rows then stay in AVX2's 16 registers. Each output's sums are the same
// operations in the same order, so the same bits.
template <int R, int kKind>
void kquant_block_unpacked(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy,
                           bool accumulate, const uint8_t* codes) {
  const int64_t groups = m.kp / 32, n0 = b * 16;
  const float* scales = reinterpret_cast<const float*>(codes + groups * 512);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; h++) {
    __m256 sum[R];
    for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
      __m256i acc[R][2] = {}, part[R] = {};
      for (int p = 0; p < 4; p++) {
        const uint8_t* o = codes + ((g * 4 + p) * 2 + h) * 64;
        const __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(o));
        const __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(o + 32));
        for (int r = 0; r < R; r++) {
          const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
          kquant_dot_step<kKind>(acc[r], part[r], c0, c1, _mm256_set1_epi32(xr[0]), _mm256_set1_epi32(xr[1]), p, ones);
        }
      }
      const __m256 first = _mm256_load_ps(scales + (g * 2 + h) * 16), second = _mm256_load_ps(scales + (g * 2 + h) * 16 + 8);
      for (int r = 0; r < R; r++)
        sum[r] = kquant_group_sum<kKind == WEIGHT_Q6K>(sum[r], acc[r], first, second, in, s0 + r, g, groups);
    }
    for (int r = 0; r < R; r++) store_first(y + (s0 + r) * ldy + n0 + 8 * h, m.n - n0 - 8 * h, sum[r], accumulate);
  }
}

}  // namespace
