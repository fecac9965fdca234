// The decode step's projections of a GGUF's F16, BF16 and F32 tensors on aarch64 NEON, in
// project_float.h's layout and with its sums (described there), on four quarters of 4 outputs: each
// output's even and odd FMA chains and their sum are project_float.h's, so the outputs are too, bit for bit.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "common.h"
#include "project_neon.h"

namespace {

constexpr int kFloatRows = 2;  // rows a pass over a block computes (2 x 4 quarters x 2 accumulators)

// 4 weights of kind kKind at p, as fp32
template <int kKind>
inline float32x4_t float4_at(const void* p, int64_t at) {
  if constexpr (kKind == WEIGHT_F32R) {
    return vld1q_f32(static_cast<const float*>(p) + at);
  } else if constexpr (kKind == WEIGHT_F16) {
    return load_half4(static_cast<const uint16_t*>(p) + at);
  } else {
    return load4(static_cast<const uint16_t*>(p) + at);  // bf16: the high half of its fp32
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, F16 / BF16 / F32 block b (kKind: WEIGHT_F16, _BF16 or _F32R)
template <int R, int kKind>
void float_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t k = m.k, base = b * k * 16;
  float32x4_t even[R][4], odd[R][4];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++) even[r][c] = odd[r][c] = vdupq_n_f32(0.f);
  const float* x = in.x + s0 * in.ldx;
  int64_t i = 0;
  for (; i + 2 <= k; i += 2) {
    __builtin_prefetch(static_cast<const uint8_t*>(m.w) + (base + (i + 16) * 16) * (kKind == WEIGHT_F32R ? 4 : 2));
    float32x4_t w0[4], w1[4];
    for (int c = 0; c < 4; c++) {
      w0[c] = float4_at<kKind>(m.w, base + i * 16 + 4 * c);
      w1[c] = float4_at<kKind>(m.w, base + i * 16 + 16 + 4 * c);
    }
    for (int r = 0; r < R; r++) {
      const float32x4_t x0 = vdupq_n_f32(x[r * in.ldx + i]), x1 = vdupq_n_f32(x[r * in.ldx + i + 1]);
      for (int c = 0; c < 4; c++) {
        even[r][c] = vfmaq_f32(even[r][c], x0, w0[c]);
        odd[r][c] = vfmaq_f32(odd[r][c], x1, w1[c]);
      }
    }
  }
  if (i < k)
    for (int c = 0; c < 4; c++) {
      const float32x4_t w0 = float4_at<kKind>(m.w, base + i * 16 + 4 * c);
      for (int r = 0; r < R; r++) even[r][c] = vfmaq_f32(even[r][c], vdupq_n_f32(x[r * in.ldx + i]), w0);
    }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 4; c++)
      store_first(y + (s0 + r) * ldy + n0 + 4 * c, m.n - n0 - 4 * c, vaddq_f32(even[r][c], odd[r][c]), accumulate);
}

}  // namespace
