// Vector helpers and per-row stages of the decode step (see decode.cpp), AVX-512.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace {

// ---- small vector helpers ---------------------------------------------------------------

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// exp for x <= 0 (softmax, silu of negative inputs): 2^n * p(f), |rel. error| < 2e-7
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

inline float half_to_float(uint16_t h) { return _mm512_cvtss_f32(_mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h)))); }
inline uint16_t float_to_half(float f) {  // round to nearest even
  return static_cast<uint16_t>(_mm256_extract_epi16(_mm512_cvtps_ph(_mm512_set1_ps(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const F16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// ---- per-row stages ---------------------------------------------------------------------

// RMSNorm without its weight (folded into the next projection): out = x / rms(x)
void rms_norm(const float* x, int64_t d, float eps, float* out) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) acc = _mm512_fmadd_ps(load16(x + i), load16(x + i), acc);
  float ss = hsum(acc);
  for (; i < d; i++) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
  const __m512 vinv = _mm512_set1_ps(inv);
  for (i = 0; i + 16 <= d; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(load16(x + i), vinv));
  for (; i < d; i++) out[i] = x[i] * inv;
}

// x [k] -> xq [kp] uint8 (padding holds the zero point: the padded weights are 0 anyway)
void quantize_row(const float* x, int64_t k, int64_t kp, uint8_t* xq, float* scale, int32_t* zero) {
  __m512 vmin = _mm512_setzero_ps(), vmax = _mm512_setzero_ps();  // the range always holds 0, so 0 is exact
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 v = load16(x + i);
    vmin = _mm512_min_ps(vmin, v);
    vmax = _mm512_max_ps(vmax, v);
  }
  float lo = _mm512_reduce_min_ps(vmin), hi = _mm512_reduce_max_ps(vmax);
  for (; i < k; i++) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const float step = hi > lo ? (hi - lo) / 255.f : 1.f;
  const int32_t zp = std::clamp(static_cast<int32_t>(std::nearbyint(-lo / step)), 0, 255);
  const float inv = 1.f / step;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i vzp = _mm512_set1_epi32(zp), vlo = _mm512_setzero_si512(), vhi = _mm512_set1_epi32(255);
  for (i = 0; i + 16 <= k; i += 16) {
    __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(load16(x + i), vinv)), vzp);  // nearest even
    q = _mm512_min_epi32(_mm512_max_epi32(q, vlo), vhi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + i), _mm512_cvtepi32_epi8(q));
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
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float step = amax > 0.f ? amax / 127.f : 1.f;
    const __m512 inv = _mm512_set1_ps(1.f / step);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));  // nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + from), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + from + 16), _mm512_cvtsepi32_epi8(qb));
    scale[g] = step;
    sum[g] = step * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb)));
  }
}

// tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) (exp where it is accurate), with x's sign
inline __m512 tanh_ps(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f), ax = _mm512_abs_ps(x);
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_add_ps(ax, ax)));
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  return _mm512_mask_sub_ps(t, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), t);
}

// g [F] <- gelu_tanh(g) * u, where u = g + F (GeGLU: Gemma's MLP)
void gelu_tanh_mul_row(float* g, int64_t F) {
  const float* u = g + F;
  constexpr float kC = 0.7978845608028654f, kA = 0.044715f;  // sqrt(2 / pi)
  int64_t i = 0;
  const __m512 c = _mm512_set1_ps(kC), a = _mm512_set1_ps(kA), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f);
  for (; i + 16 <= F; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 inner = _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(a, x), _mm512_mul_ps(x, x), x));
    const __m512 gelu = _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(one, tanh_ps(inner)));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(gelu, _mm512_loadu_ps(u + i)));
  }
  for (; i < F; i++) {
    const float x = g[i];
    g[i] = 0.5f * x * (1.f + std::tanh(kC * (x + kA * x * x * x))) * u[i];
  }
}

// g [F] <- silu(g) * u, where u = g + F (the gate_up projection's two halves)
void silu_mul_row(float* g, int64_t F) {
  const float* u = g + F;
  int64_t i = 0;
  for (; i + 16 <= F; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));  // exp(-|g|)
    const __m512 sig = _mm512_mask_div_ps(_mm512_div_ps(e, _mm512_add_ps(e, _mm512_set1_ps(1.f))),
                                          _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ),
                                          _mm512_set1_ps(1.f), _mm512_add_ps(e, _mm512_set1_ps(1.f)));
    _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
  }
  for (; i < F; i++) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

}  // namespace
