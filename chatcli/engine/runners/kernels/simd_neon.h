// Vector helpers and per-row stages of the decode step (see decode.cpp) on aarch64 NEON: simd_avx2.h's
// stages, the same formulas on 4-lane vectors. Where AVX2 reduces 8 lanes (a norm's sum of squares,
// softmax's sum) two 4-lane vectors stand for its low and high halves and are reduced in its order, and
// a row splits into vector and scalar parts where AVX2's does: each row is computed alone, in a fixed
// order, and gives the AVX2 build's bits (FMLA and FMLS are fused as VFMADD and VFNMADD are; FRINTN and
// FCVTNS round to nearest even as VROUNDPS and VCVTPS2DQ do).
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace {

// ---- small vector helpers ---------------------------------------------------------------

// AVX2's hsum of an 8-lane vector whose lanes 0..3 are lo and 4..7 hi: (lo + hi), then lanes (0 + 2) + (1 + 3)
inline float hsum8(float32x4_t lo, float32x4_t hi) {
  const float32x4_t t = vaddq_f32(lo, hi);
  const float32x2_t u = vadd_f32(vget_low_f32(t), vget_high_f32(t));
  return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}

inline int32_t hsum_s32(int32x4_t v) { return vaddvq_s32(v); }  // exact in any order

// exp for x <= 0 (softmax, silu of negative inputs): 2^n * p(f), simd.h's polynomial. n >= -126
// after the clamp, so 2^n is a normal float built from its exponent bits (FMAXNM: a NaN input gives
// -87, as VMAXPS with the bound second does)
inline float32x4_t exp_ps(float32x4_t x) {
  x = vmaxnmq_f32(x, vdupq_n_f32(-87.f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t f = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));  // x - n c, fused
  f = vfmsq_f32(f, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, f);
  p = vfmaq_f32(vaddq_f32(f, vdupq_n_f32(1.f)), p, vmulq_f32(f, f));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

inline float half_to_float(uint16_t h) {
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
inline uint16_t float_to_half(float f) {  // round to nearest even
  return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(f))), 0);
}

inline float32x4_t load4(const float* p) { return vld1q_f32(p); }
inline float32x4_t load4(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

// 4 fp16 at p as fp32
inline float32x4_t load_half4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline float32x4_t load4(const F16* p) { return load_half4(reinterpret_cast<const uint16_t*>(p)); }

// ---- per-row stages ---------------------------------------------------------------------

// RMSNorm without its weight (folded into the next projection): out = x / rms(x)
void rms_norm(const float* x, int64_t d, float eps, float* out) {
  float32x4_t lo = vdupq_n_f32(0.f), hi = vdupq_n_f32(0.f);  // AVX2's 8 lanes
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    const float32x4_t a = load4(x + i), b = load4(x + i + 4);
    lo = vfmaq_f32(lo, a, a);
    hi = vfmaq_f32(hi, b, b);
  }
  float ss = hsum8(lo, hi);
  for (; i < d; i++) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
  const float32x4_t vinv = vdupq_n_f32(inv);
  for (i = 0; i + 4 <= d; i += 4) vst1q_f32(out + i, vmulq_f32(load4(x + i), vinv));
  for (; i < d; i++) out[i] = x[i] * inv;
}

// x [k] -> xq [kp] uint8 (padding holds the zero point: the padded weights are 0 anyway)
void quantize_row(const float* x, int64_t k, int64_t kp, uint8_t* xq, float* scale, int32_t* zero) {
  float32x4_t vmin = vdupq_n_f32(0.f), vmax = vdupq_n_f32(0.f);  // the range always holds 0, so 0 is exact
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    const float32x4_t v = load4(x + i);
    vmin = vminq_f32(vmin, v);
    vmax = vmaxq_f32(vmax, v);
  }
  float lo = vminvq_f32(vmin), hi = vmaxvq_f32(vmax);
  for (; i < k; i++) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const float step = hi > lo ? (hi - lo) / 255.f : 1.f;
  const int32_t zp = std::clamp(static_cast<int32_t>(std::nearbyint(-lo / step)), 0, 255);
  const float inv = 1.f / step;
  const float32x4_t vinv = vdupq_n_f32(inv);
  const int32x4_t vzp = vdupq_n_s32(zp);
  for (i = 0; i + 8 <= k; i += 8) {
    const int32x4_t a = vaddq_s32(vcvtnq_s32_f32(vmulq_f32(load4(x + i), vinv)), vzp);  // nearest even
    const int32x4_t b = vaddq_s32(vcvtnq_s32_f32(vmulq_f32(load4(x + i + 4), vinv)), vzp);
    vst1_u8(xq + i, vqmovn_u16(vcombine_u16(vqmovun_s32(a), vqmovun_s32(b))));  // clamped to 0..255
  }
  for (; i < k; i++) xq[i] = static_cast<uint8_t>(std::clamp(static_cast<int32_t>(std::nearbyint(x[i] * inv)) + zp, 0, 255));
  for (; i < kp; i++) xq[i] = static_cast<uint8_t>(zp);
  *scale = step;
  *zero = zp;
}

// x [k] -> xq [kp] int8 in groups of 32 (GGUF's Q8_1): per group a scale amax / 127 and the sum
// scale * sum xq; the padding past k is 0
void quantize_groups(const float* x, int64_t k, int64_t kp, int8_t* xq, float* scale, float* sum) {
  for (int64_t g = 0; g * 32 < kp; g++) {
    float v[32];
    const int64_t from = g * 32, n = std::clamp<int64_t>(k - from, 0, 32);
    std::memcpy(v, x + from, n * sizeof(float));
    std::fill(v + n, v + 32, 0.f);
    float32x4_t amax = vdupq_n_f32(0.f);
    for (int j = 0; j < 8; j++) amax = vmaxq_f32(amax, vabsq_f32(vld1q_f32(v + 4 * j)));
    const float top = vmaxvq_f32(amax);
    const float step = top > 0.f ? top / 127.f : 1.f;
    const float32x4_t inv = vdupq_n_f32(1.f / step);
    int32x4_t total = vdupq_n_s32(0);
    for (int j = 0; j < 8; j += 2) {
      const int32x4_t a = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(v + 4 * j), inv));  // nearest even
      const int32x4_t b = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(v + 4 * j + 4), inv));
      vst1_s8(xq + from + 4 * j, vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))));
      total = vaddq_s32(total, vaddq_s32(a, b));
    }
    scale[g] = step;
    sum[g] = step * static_cast<float>(hsum_s32(total));
  }
}

// tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) (exp where it is accurate), with x's sign
inline float32x4_t tanh_ps(float32x4_t x) {
  const float32x4_t one = vdupq_n_f32(1.f), zero = vdupq_n_f32(0.f), ax = vabsq_f32(x);
  const float32x4_t e = exp_ps(vsubq_f32(zero, vaddq_f32(ax, ax)));
  const float32x4_t t = vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e));
  return vbslq_f32(vcltq_f32(x, zero), vsubq_f32(zero, t), t);
}

// g [F] <- gelu_tanh(g) * u, where u = g + F (GeGLU: Gemma's MLP); vectors over AVX2's 8s, its scalar tail
void gelu_tanh_mul_row(float* g, int64_t F) {
  const float* u = g + F;
  constexpr float kC = 0.7978845608028654f, kA = 0.044715f;  // sqrt(2 / pi)
  int64_t i = 0;
  const float32x4_t c = vdupq_n_f32(kC), a = vdupq_n_f32(kA), half = vdupq_n_f32(0.5f), one = vdupq_n_f32(1.f);
  for (; i + 8 <= F; i += 8)
    for (int j = 0; j < 8; j += 4) {
      const float32x4_t x = vld1q_f32(g + i + j);
      const float32x4_t inner = vmulq_f32(c, vfmaq_f32(x, vmulq_f32(a, x), vmulq_f32(x, x)));
      const float32x4_t gelu = vmulq_f32(vmulq_f32(half, x), vaddq_f32(one, tanh_ps(inner)));
      vst1q_f32(g + i + j, vmulq_f32(gelu, vld1q_f32(u + i + j)));
    }
  for (; i < F; i++) {
    const float x = g[i];
    g[i] = 0.5f * x * (1.f + std::tanh(kC * (x + kA * x * x * x))) * u[i];
  }
}

// g [F] <- silu(g) * u, where u = g + F (the gate_up projection's two halves)
void silu_mul_row(float* g, int64_t F) {
  const float* u = g + F;
  const float32x4_t one = vdupq_n_f32(1.f), zero = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + 8 <= F; i += 8)
    for (int j = 0; j < 8; j += 4) {
      const float32x4_t gv = vld1q_f32(g + i + j);
      const float32x4_t e = exp_ps(vsubq_f32(zero, vabsq_f32(gv)));  // exp(-|g|)
      const float32x4_t sig =
          vbslq_f32(vcgeq_f32(gv, zero), vdivq_f32(one, vaddq_f32(e, one)), vdivq_f32(e, vaddq_f32(e, one)));
      vst1q_f32(g + i + j, vmulq_f32(vmulq_f32(gv, sig), vld1q_f32(u + i + j)));
    }
  for (; i < F; i++) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

}  // namespace
