// The decode step's projections of GGUF's Q3_K and Q2_K on aarch64 NEON, in project_low.h's layout and
// with its sums (described there), on four quarters of 4 outputs (bytes 16c..16c+15 of a 64-byte vector
// outputs 4c..4c+3). The codes (0..7) times a row's int8 activations go through SDOT, each 16's dot exact
// in int32; the group's integer sums I (and Q2_K's I_m) are then project_low.h's, in int32 rather than
// int16 pairs (no sum comes near either bound), and so are the fp32 sums that follow, bit for bit.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "common.h"
#include "project_neon.h"

namespace {

// bytes 4c..4c+3 of v, widened to int32
inline int32x4_t quarter_s32(int8x16_t v, int c) {
  const int16x8_t half = c < 2 ? vmovl_s8(vget_low_s8(v)) : vmovl_high_s8(v);
  return c % 2 ? vmovl_high_s16(half) : vmovl_s16(vget_low_s16(half));
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
  const uint8x16_t crumb = vdupq_n_u8(3), one = vdupq_n_u8(1);
  float32x4_t sum[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) sum[r][c] = vdupq_n_f32(0.f);
  float32x4_t d[4], dmin[4];
  for (int c = 0; c < 4; c++) d[c] = dmin[c] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; g++) {
    if (g % 8 == 0)
      for (int c = 0; c < 4; c++) {
        d[c] = load_half4(dp + g / 8 * 16 + 4 * c);
        if constexpr (!k3) dmin[c] = load_half4(mp + g / 8 * 16 + 4 * c);
      }
    const uint8_t* wg = w + g * 128;
    prefetch_lines<128>(wg + kPrefetchGroups * 128);
    if constexpr (k3) prefetch_lines<64>(hip + (g + kPrefetchGroups) * 64);
    // per output: the scales' bytes of the group's two 16s (sc [16][2]), split
    const int8x16x2_t pairs = vld2q_s8(reinterpret_cast<const int8_t*>(scp + g * 32));
    for (int c = 0; c < 4; c++) {
      const uint8x16_t high = k3 ? vld1q_u8(hip + g * 64 + 16 * c) : vdupq_n_u8(0);
      int32x4_t dot[R][2];  // per row and 16: the int32 dots
      for (int r = 0; r < R; r++) dot[r][0] = dot[r][1] = vdupq_n_s32(0);
      for (int v = 0; v < 2; v++) {
        const uint8x16_t crumbs = vld1q_u8(wg + v * 64 + 16 * c);
        for (int j = 0; j < 4; j++) {  // quad q = 4v + j: bits 2j, 2j + 1
          const int q = 4 * v + j;
          uint8x16_t code = vandq_u8(shift_right(crumbs, 2 * j), crumb);
          if constexpr (k3) code = vorrq_u8(code, vshlq_n_u8(vandq_u8(shift_right(high, q), one), 2));  // bit q -> bit 2
          for (int r = 0; r < R; r++) {
            const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + q;
            dot[r][v] = vdotq_s32(dot[r][v], vreinterpretq_s8_u8(code), broadcast4(xr[0]));
          }
        }
      }
      int32x4_t sa = quarter_s32(pairs.val[0], c), sb = quarter_s32(pairs.val[1], c), ma = vdupq_n_s32(0), mb = vdupq_n_s32(0);
      if constexpr (!k3) {  // the byte as the file holds it: scale in the low nibble, min in the high one
        const int32x4_t mask = vdupq_n_s32(15);
        ma = vandq_s32(vshrq_n_s32(sa, 4), mask);
        mb = vandq_s32(vshrq_n_s32(sb, 4), mask);
        sa = vandq_s32(sa, mask);
        sb = vandq_s32(sb, mask);
      }
      for (int r = 0; r < R; r++) {
        const int64_t s = s0 + r;
        const int32_t* hs = in.hsum + s * halves + 2 * g;
        const float gs = in.gs[s * groups + g];
        int32x4_t da = dot[r][0], db = dot[r][1];
        if constexpr (k3) {
          da = vsubq_s32(da, vdupq_n_s32(4 * hs[0]));
          db = vsubq_s32(db, vdupq_n_s32(4 * hs[1]));
        }
        const int32x4_t total = vmlaq_s32(vmulq_s32(da, sa), db, sb);
        sum[r][c] = vfmaq_f32(sum[r][c], vmulq_f32(d[c], vdupq_n_f32(gs)), vcvtq_f32_s32(total));
        if constexpr (!k3) {
          const int32x4_t least = vmlaq_s32(vmulq_s32(vdupq_n_s32(hs[0]), ma), vdupq_n_s32(hs[1]), mb);
          sum[r][c] = vfmsq_f32(sum[r][c], vmulq_f32(dmin[c], vdupq_n_f32(gs)), vcvtq_f32_s32(least));
        }
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) store_first(y + (s0 + r) * ldy + n0 + 4 * c, m.n - n0 - 4 * c, sum[r][c], accumulate);
}

}  // namespace
