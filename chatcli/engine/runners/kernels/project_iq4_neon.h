// The decode step's projections of GGUF's IQ4_NL and IQ4_XS on aarch64 NEON, in project_iq4.h's layout
// (described there), on four quarters of 4 outputs (bytes 16c..16c+15 of a 64-byte vector outputs
// 4c..4c+3). The indices look their signed values up (TBL, the 16-byte table), and SDOT multiplies them
// by a row's int8 activations as they are: per output and group the dot I is project_iq4.h's exactly
// (no offset of 128 to take back), IQ4_XS's times its scale, and the fp32 sums that follow are its too.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "common.h"
#include "project_neon.h"

namespace {

// y[s, n0..n0+16) for rows s0..s0+R, IQ4_NL or IQ4_XS block b (kKind: WEIGHT_IQ4NL or _IQ4XS)
template <int R, int kKind>
void iq4_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool xs = kKind == WEIGHT_IQ4XS;
  const int64_t groups = m.kp / 32, supers = m.kp / 256;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 256;
  const uint16_t* dp = m.d + b * (xs ? supers : groups) * 16;
  const uint8_t* scp = xs ? m.sc + b * groups * 16 : nullptr;
  const int8x16_t table = vld1q_s8(iq4_table<kKind>());
  const uint8x16_t nibble = vdupq_n_u8(0x0F);
  float32x4_t sum[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) sum[r][c] = vdupq_n_f32(0.f);
  float32x4_t d[4];
  for (int c = 0; c < 4; c++) d[c] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < groups; g++) {
    if constexpr (kKind == WEIGHT_MXFP4)  // bf16: the E8M0 scale's exponent, exact
      for (int c = 0; c < 4; c++) d[c] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(dp + g * 16 + 4 * c), 16));
    else if (!xs || g % 8 == 0)
      for (int c = 0; c < 4; c++) d[c] = load_half4(dp + (xs ? g / 8 : g) * 16 + 4 * c);
    const uint8_t* wg = w + g * 256;
    prefetch_lines<256>(wg + kPrefetchGroups * 256);
    for (int c = 0; c < 4; c++) {
      int32x4_t acc[R];
      for (int r = 0; r < R; r++) acc[r] = vdupq_n_s32(0);
      for (int p = 0; p < 4; p++) {
        const uint8x16_t v = vld1q_u8(wg + p * 64 + 16 * c);
        const int8x16_t c0 = vqtbl1q_s8(table, vandq_u8(v, nibble)), c1 = vqtbl1q_s8(table, vshrq_n_u8(v, 4));
        for (int r = 0; r < R; r++) {
          const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8 + 2 * p;
          acc[r] = vdotq_s32(acc[r], c0, broadcast4(xr[0]));
          acc[r] = vdotq_s32(acc[r], c1, broadcast4(xr[1]));
        }
      }
      const int32x4_t scales = xs ? bytes4_s32<true>(scp + g * 16 + 4 * c) : vdupq_n_s32(0);
      for (int r = 0; r < R; r++) {
        const int32x4_t dot = xs ? vmulq_s32(acc[r], scales) : acc[r];
        const float gs = in.gs[(s0 + r) * groups + g];
        sum[r][c] = vfmaq_f32(sum[r][c], vmulq_f32(d[c], vdupq_n_f32(gs)), vcvtq_f32_s32(dot));
      }
    }
  }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) store_first(y + (s0 + r) * ldy + n0 + 4 * c, m.n - n0 - 4 * c, sum[r][c], accumulate);
}

}  // namespace
