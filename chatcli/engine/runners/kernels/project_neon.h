// The decode step's projections (see decode.cpp) on aarch64 NEON with the dot-product extension, in
// project.h's weight layouts (described there), on four quarters of 4 outputs: a 64-byte quad of 16
// outputs x 4 inputs is four 16-byte vectors, vector c outputs 4c..4c+3, and SDOT (vdotq_s32) sums each
// output's 4 byte products into its int32 lane, as VPDPBUSD does. SDOT multiplies signed bytes by signed
// bytes: the uint8 activations of int8 and q8's codes 0..255 go in less 128 (their top bit flipped), and
// 128 times the other side's sum is added back, so every dot is the exact integer of project.h's, and
// the fp32 sums that follow are project_avx2.h's, operation for operation: the outputs are its bits.
#pragma once

#include <arm_neon.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.h"
#include "simd_neon.h"

namespace {

constexpr int kRowsPerPass = 4;  // int8, q4, q8, K-quants: activation rows that share one read of a weight block (at most)
constexpr int kF32Rows = 4;      // fp32: rows a pass over a quarter panel computes (4 x 4 accumulators)

// a row's 4 activation bytes (at xr, as one int32) in every lane
inline int8x16_t broadcast4(int32_t x4) { return vreinterpretq_s8_s32(vdupq_n_s32(x4)); }

// out[0..width) = (accumulate ? out + val : val), width 0..4 or more (then 4)
inline void store_first(float* out, int64_t width, float32x4_t val, bool accumulate) {
  if (width <= 0) return;
  if (width >= 4) {
    if (accumulate) val = vaddq_f32(vld1q_f32(out), val);
    vst1q_f32(out, val);
    return;
  }
  float lanes[4];
  vst1q_f32(lanes, val);
  for (int64_t i = 0; i < width; i++) out[i] = accumulate ? out[i] + lanes[i] : lanes[i];
}

// the first `width` (0..4) of 4 values at p, the rest 0
template <typename T>
inline void load_first(const T* p, int64_t width, T (&out)[4]) {
  for (int64_t i = 0; i < 4; i++) out[i] = i < width ? p[i] : T(0);
}

// y[s, n0..n0+16) for rows s0..s0+R, int8 block b; accumulate: y += instead of y =
template <int R>
void int8_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t quads = m.kp / 4;
  const int8_t* w = static_cast<const int8_t*>(m.w) + b * quads * 64;
  int32x4_t acc[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) acc[r][c] = vdupq_n_s32(0);
  for (int64_t q = 0; q < quads; q++) {
    int8x16_t wq[4];
    for (int c = 0; c < 4; c++) wq[c] = vld1q_s8(w + q * 64 + 16 * c);
    for (int r = 0; r < R; r++) {  // the activations less 128: xq ^ 0x80 as int8
      const uint32_t x4 = reinterpret_cast<const uint32_t*>(in.xq + (s0 + r) * m.kp)[q] ^ 0x80808080u;
      const int8x16_t x = broadcast4(static_cast<int32_t>(x4));
      for (int c = 0; c < 4; c++) acc[r][c] = vdotq_s32(acc[r][c], wq[c], x);
    }
  }
  const int64_t n0 = b * 16;
  for (int c = 0; c < 4; c++) {
    const int64_t width = std::min<int64_t>(4, m.n - n0 - 4 * c);
    if (width <= 0) break;
    float ws4[4];
    int32_t wsum4[4];
    load_first(m.scale + n0 + 4 * c, width, ws4);
    load_first(m.wsum + n0 + 4 * c, width, wsum4);
    const float32x4_t ws = vld1q_f32(ws4);
    const int32x4_t wsum = vld1q_s32(wsum4);
    for (int r = 0; r < R; r++) {
      const int64_t s = s0 + r;
      // sum (xq - 128) w + 128 wsum - xz wsum: the exact dot of project.h's (int32 wraps alike)
      const int32x4_t dot = vmlaq_s32(acc[r][c], wsum, vdupq_n_s32(128 - in.xz[s]));
      const float32x4_t val = vmulq_f32(vmulq_f32(vdupq_n_f32(in.xs[s]), ws), vcvtq_f32_s32(dot));
      store_first(y + s * ldy + n0 + 4 * c, width, val, accumulate);
    }
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
  const uint8x16_t nibble = vdupq_n_u8(0x0F), flip = vdupq_n_u8(0x80);
  float32x4_t sum[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) sum[r][c] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* wg = w + g * kQuads * 64;
    prefetch_lines<kQuads * 64>(wg + kPrefetchGroups * kQuads * 64);
    int32x4_t acc[R][4];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < 4; c++) acc[r][c] = vdupq_n_s32(0);
    for (int p = 0; p < 4; p++)
      for (int c = 0; c < 4; c++) {
        int8x16_t c0, c1;
        if constexpr (kQuads == 4) {  // codes 0..15, as they are
          const uint8x16_t v = vld1q_u8(wg + p * 64 + 16 * c);
          c0 = vreinterpretq_s8_u8(vandq_u8(v, nibble));
          c1 = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        } else {  // codes 0..255 less 128
          c0 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wg + 2 * p * 64 + 16 * c), flip));
          c1 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wg + 2 * p * 64 + 64 + 16 * c), flip));
        }
        for (int r = 0; r < R; r++) {
          const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
          acc[r][c] = vdotq_s32(acc[r][c], c0, broadcast4(xr[0]));
          acc[r][c] = vdotq_s32(acc[r][c], c1, broadcast4(xr[1]));
        }
      }
    for (int c = 0; c < 4; c++) {
      const float32x4_t d = load_half4(dp + g * 16 + 4 * c);
      const float32x4_t mn = mp ? load_half4(mp + g * 16 + 4 * c) : vmulq_f32(d, vdupq_n_f32(offset));
      for (int r = 0; r < R; r++) {
        const int64_t at = (s0 + r) * groups + g;
        int32x4_t dot = acc[r][c];
        if constexpr (kQuads == 8) {  // + 128 times the group's activations' sum
          const int8_t* xg = reinterpret_cast<const int8_t*>(in.xq + (s0 + r) * m.kp) + g * 32;
          const int32_t total = vaddlvq_s8(vld1q_s8(xg)) + vaddlvq_s8(vld1q_s8(xg + 16));
          dot = vaddq_s32(dot, vdupq_n_s32(128 * total));
        }
        sum[r][c] = vfmaq_f32(sum[r][c], vmulq_f32(d, vdupq_n_f32(in.gs[at])), vcvtq_f32_s32(dot));
        sum[r][c] = vfmaq_f32(sum[r][c], mn, vdupq_n_f32(in.gsum[at]));
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) store_first(y + (s0 + r) * ldy + n0 + 4 * c, m.n - n0 - 4 * c, sum[r][c], accumulate);
}

// bytes v shifted right by `bits` (left where negative)
inline uint8x16_t shift_right(uint8x16_t v, int bits) { return vshlq_u8(v, vdupq_n_s8(static_cast<int8_t>(-bits))); }

// 4 bytes at p (int8 or uint8) as int32, or as fp32
template <bool kSigned>
inline int32x4_t bytes4_s32(const uint8_t* p) {
  uint32_t word;
  std::memcpy(&word, p, 4);
  const uint8x8_t bytes = vreinterpret_u8_u32(vdup_n_u32(word));
  if constexpr (kSigned) return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(bytes))));
  return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(bytes))));
}

template <bool kSigned>
inline float32x4_t bytes4(const uint8_t* p) { return vcvtq_f32_s32(bytes4_s32<kSigned>(p)); }

// y[s, n0..n0+16) for rows s0..s0+R, K-quant block b (kKind: WEIGHT_Q4K, _Q5K or _Q6K): project_avx2.h's
// kquant_block, the same exact dots (SDOT of codes 0..63 and int8 activations: no int16 sums to widen)
// and the same fp32 sums in order
template <int R, int kKind>
void kquant_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kScales = k6 ? 2 : 1;                                         // scales a group: per 16 or 32 inputs
  constexpr int kHigh = kHighVectors<kKind>;
  const int64_t groups = m.kp / 32, halves = m.kp / 16;
  const auto [w, dp, mp, scp, smp, hip] = k_block<kKind>(m, b);
  const uint8x16_t nibble = vdupq_n_u8(0x0F), low = vdupq_n_u8(k6 ? 3 : 1);
  float32x4_t sum[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) sum[r][c] = vdupq_n_f32(0.f);
  float32x4_t d[4], dmin[4];
  for (int c = 0; c < 4; c++) d[c] = dmin[c] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0)
      for (int c = 0; c < 4; c++) {
        d[c] = load_half4(dp + g / 8 * 16 + 4 * c);
        if constexpr (!k6) dmin[c] = load_half4(mp + g / 8 * 16 + 4 * c);
      }
    const uint8_t* wg = w + g * 256;
    prefetch_lines<256>(wg + kPrefetchGroups * 256);
    if constexpr (kHigh > 0) prefetch_lines<64 * kHigh>(hip + (g + kPrefetchGroups) * kHigh * 64);
    int32x4_t acc[R][4][kScales];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < 4; c++)
        for (int j = 0; j < kScales; j++) acc[r][c][j] = vdupq_n_s32(0);
    for (int c = 0; c < 4; c++) {
      uint8x16_t high[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
      for (int v = 0; v < kHigh; v++) high[v] = vld1q_u8(hip + (g * kHigh + v) * 64 + 16 * c);
      for (int p = 0; p < 4; p++) {
        const uint8x16_t v = vld1q_u8(wg + p * 64 + 16 * c);
        uint8x16_t c0 = vandq_u8(v, nibble), c1 = vshrq_n_u8(v, 4);
        if constexpr (kHigh == 1) {  // quad q's bit q -> bit 4
          c0 = vorrq_u8(c0, vshlq_n_u8(vandq_u8(shift_right(high[0], 2 * p), low), 4));
          c1 = vorrq_u8(c1, vshlq_n_u8(vandq_u8(shift_right(high[0], 2 * p + 1), low), 4));
        } else if constexpr (kHigh == 2) {  // quad q's bits 2(q%4), +1 of vector q/4 -> bits 4, 5
          const uint8x16_t hv = high[p / 2];
          c0 = vorrq_u8(c0, vshlq_n_u8(vandq_u8(shift_right(hv, 2 * (2 * p % 4)), low), 4));
          c1 = vorrq_u8(c1, vshlq_n_u8(vandq_u8(shift_right(hv, 2 * ((2 * p + 1) % 4)), low), 4));
        }
        const int slot = k6 ? p / 2 : 0;
        for (int r = 0; r < R; r++) {
          const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
          acc[r][c][slot] = vdotq_s32(acc[r][c][slot], vreinterpretq_s8_u8(c0), broadcast4(xr[0]));
          acc[r][c][slot] = vdotq_s32(acc[r][c][slot], vreinterpretq_s8_u8(c1), broadcast4(xr[1]));
        }
      }
    }
    for (int c = 0; c < 4; c++) {
      if constexpr (k6) {
        const float32x4_t da = vmulq_f32(d[c], bytes4<true>(scp + g * 32 + 4 * c));
        const float32x4_t db = vmulq_f32(d[c], bytes4<true>(scp + g * 32 + 16 + 4 * c));
        for (int r = 0; r < R; r++) {
          const int64_t s = s0 + r;
          const int32_t* hs = in.hsum + s * halves + 2 * g;
          const float32x4_t a = vcvtq_f32_s32(vsubq_s32(acc[r][c][0], vdupq_n_s32(32 * hs[0])));
          const float32x4_t bb = vcvtq_f32_s32(vsubq_s32(acc[r][c][kScales - 1], vdupq_n_s32(32 * hs[1])));
          const float32x4_t t = vfmaq_f32(vmulq_f32(db, bb), da, a);
          sum[r][c] = vfmaq_f32(sum[r][c], vdupq_n_f32(in.gs[s * groups + g]), t);
        }
      } else {
        const float32x4_t dg = vmulq_f32(d[c], bytes4<false>(scp + g * 16 + 4 * c));
        const float32x4_t mg = vmulq_f32(dmin[c], bytes4<false>(smp + g * 16 + 4 * c));
        for (int r = 0; r < R; r++) {
          const int64_t at = (s0 + r) * groups + g;
          sum[r][c] = vfmaq_f32(sum[r][c], vmulq_f32(dg, vdupq_n_f32(in.gs[at])), vcvtq_f32_s32(acc[r][c][0]));
          sum[r][c] = vfmsq_f32(sum[r][c], mg, vdupq_n_f32(in.gsum[at]));
        }
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) store_first(y + (s0 + r) * ldy + n0 + 4 * c, m.n - n0 - 4 * c, sum[r][c], accumulate);
}

// y[s, p*64 + 4 v0..) for rows s0..s0+R from fp32 panel p ([k][64], zero past n), NV vectors of 4 outputs
// from vector v0: a decode row takes the whole panel in one pass, more rows a quarter panel a pass
template <int R, int NV>
void f32_pass(const Matrix& m, int64_t p, int v0, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const float* w = static_cast<const float*>(m.w) + p * m.k * kPanel + 4 * v0;
  float32x4_t acc[R][NV];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = vdupq_n_f32(0.f);
  const float* x = in.x + s0 * in.ldx;
  for (int64_t k = 0; k < m.k; k++) {
    const float* wk = w + k * kPanel;
    __builtin_prefetch(wk + 8 * kPanel);
    for (int r = 0; r < R; r++) {
      const float32x4_t xb = vdupq_n_f32(x[r * in.ldx + k]);
      for (int v = 0; v < NV; v++) acc[r][v] = vfmaq_f32(acc[r][v], xb, vld1q_f32(wk + 4 * v));
    }
  }
  const int64_t n0 = p * kPanel + 4 * v0;
  for (int v = 0; v < NV; v++)
    for (int r = 0; r < R; r++) store_first(y + (s0 + r) * ldy + n0 + 4 * v, m.n - n0 - 4 * v, acc[r][v], accumulate);
}

template <int R>
void f32_panel(const Matrix& m, int64_t p, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  if constexpr (R == 1) {
    f32_pass<1, 16>(m, p, 0, in, s0, y, ldy, accumulate);
  } else {
    for (int v0 = 0; v0 < 16; v0 += 4) f32_pass<R, 4>(m, p, v0, in, s0, y, ldy, accumulate);
  }
}

}  // namespace
