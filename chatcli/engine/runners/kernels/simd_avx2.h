// Vector helpers and per-row stages of the decode step (see decode.cpp) on AVX2 with FMA and F16C:
// simd.h's stages, the same formulas on 8-lane vectors. As there, each row is computed alone, in
// a fixed order, so a row's numbers do not depend on the rows beside it.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace {

// ---- small vector helpers ---------------------------------------------------------------

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline float hmin(__m256 v) {
  __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_min_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_min_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }

// lanes 0..width-1 set (width 0..8): the mask of AVX2's masked loads and stores
inline __m256i first_lanes(int64_t width) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(width)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp for x <= 0 (softmax, silu of negative inputs): 2^n * p(f), simd.h's polynomial. n >= -126
// after the clamp, so 2^n is a normal float built from its exponent bits and p * 2^n rounds as scalef.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(f, f), _mm256_add_ps(f, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t float_to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }  // nearest even

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const F16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// 8 int32 in 0..255 (or saturated to int8 with `signed_`) -> 8 bytes at out
inline void store8_bytes(__m256i q, bool signed_, void* out) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i bytes = signed_ ? _mm_packs_epi16(_mm_packs_epi32(lo, hi), _mm_setzero_si128())
                                : _mm_packus_epi16(_mm_packus_epi32(lo, hi), _mm_setzero_si128());
  _mm_storel_epi64(static_cast<__m128i*>(out), bytes);
}

// ---- per-row stages ---------------------------------------------------------------------

// RMSNorm without its weight (folded into the next projection): out = x / rms(x)
void rms_norm(const float* x, int64_t d, float eps, float* out) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(load8(x + i), load8(x + i), acc);
  float ss = hsum(acc);
  for (; i < d; i++) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= d; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(load8(x + i), vinv));
  for (; i < d; i++) out[i] = x[i] * inv;
}

// x [k] -> xq [kp] uint8 (padding holds the zero point: the padded weights are 0 anyway)
void quantize_row(const float* x, int64_t k, int64_t kp, uint8_t* xq, float* scale, int32_t* zero) {
  __m256 vmin = _mm256_setzero_ps(), vmax = _mm256_setzero_ps();  // the range always holds 0, so 0 is exact
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = load8(x + i);
    vmin = _mm256_min_ps(vmin, v);
    vmax = _mm256_max_ps(vmax, v);
  }
  float lo = hmin(vmin), hi = hmax(vmax);
  for (; i < k; i++) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const float step = hi > lo ? (hi - lo) / 255.f : 1.f;
  const int32_t zp = std::clamp(static_cast<int32_t>(std::nearbyint(-lo / step)), 0, 255);
  const float inv = 1.f / step;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i vzp = _mm256_set1_epi32(zp), vlo = _mm256_setzero_si256(), vhi = _mm256_set1_epi32(255);
  for (i = 0; i + 8 <= k; i += 8) {
    __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(load8(x + i), vinv)), vzp);  // nearest even
    q = _mm256_min_epi32(_mm256_max_epi32(q, vlo), vhi);
    store8_bytes(q, false, xq + i);
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
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) amax = _mm256_max_ps(amax, abs_ps(_mm256_loadu_ps(v + 8 * j)));
    const float top = hmax(amax);
    const float step = top > 0.f ? top / 127.f : 1.f;
    const __m256 inv = _mm256_set1_ps(1.f / step);
    __m256i total = _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
      const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * j), inv));  // nearest even
      store8_bytes(q, true, xq + from + 8 * j);
      total = _mm256_add_epi32(total, q);
    }
    scale[g] = step;
    sum[g] = step * static_cast<float>(hsum_epi32(total));
  }
}

// tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) (exp where it is accurate), with x's sign
inline __m256 tanh_ps(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f), ax = abs_ps(x);
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_add_ps(ax, ax)));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  return _mm256_blendv_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), t), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

// g [F] <- gelu_tanh(g) * u, where u = g + F (GeGLU: Gemma's MLP)
void gelu_tanh_mul_row(float* g, int64_t F) {
  const float* u = g + F;
  constexpr float kC = 0.7978845608028654f, kA = 0.044715f;  // sqrt(2 / pi)
  int64_t i = 0;
  const __m256 c = _mm256_set1_ps(kC), a = _mm256_set1_ps(kA), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f);
  for (; i + 8 <= F; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 inner = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(a, x), _mm256_mul_ps(x, x), x));
    const __m256 gelu = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, tanh_ps(inner)));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + i)));
  }
  for (; i < F; i++) {
    const float x = g[i];
    g[i] = 0.5f * x * (1.f + std::tanh(kC * (x + kA * x * x * x))) * u[i];
  }
}

// g [F] <- silu(g) * u, where u = g + F (the gate_up projection's two halves)
void silu_mul_row(float* g, int64_t F) {
  const float* u = g + F;
  const __m256 one = _mm256_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 8 <= F; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), abs_ps(gv)));  // exp(-|g|)
    const __m256 sig = _mm256_blendv_ps(_mm256_div_ps(e, _mm256_add_ps(e, one)), _mm256_div_ps(one, _mm256_add_ps(e, one)),
                                        _mm256_cmp_ps(gv, _mm256_setzero_ps(), _CMP_GE_OQ));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
  }
  for (; i < F; i++) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

}  // namespace
