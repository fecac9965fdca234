// The decode step's projections of a GGUF's F16, BF16 and F32 tensors on AVX2, in project_float.h's
// layout and with its sums (described there), on two halves of 8 outputs: each output's even and odd
// FMA chains and their sum are project_float.h's, so the outputs are too, bit for bit.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project_avx2.h"

namespace {

constexpr int kFloatRows = 2;  // rows a pass over a block computes (2 x 2 halves x 2 accumulators)

// 8 weights of kind kKind at p, as fp32
template <int kKind>
inline __m256 float8_at(const void* p, int64_t at) {
  if constexpr (kKind == WEIGHT_F32R) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + at);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + at));
    if constexpr (kKind == WEIGHT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, F16 / BF16 / F32 block b (kKind: WEIGHT_F16, _BF16 or _F32R)
template <int R, int kKind>
void float_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t k = m.k, base = b * k * 16;
  __m256 even[R][2], odd[R][2];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++) even[r][h] = odd[r][h] = _mm256_setzero_ps();
  const float* x = in.x + s0 * in.ldx;
  int64_t i = 0;
  for (; i + 2 <= k; i += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(static_cast<const uint8_t*>(m.w)) + (base + (i + 16) * 16) *
                     (kKind == WEIGHT_F32R ? 4 : 2), _MM_HINT_T0);
    __m256 w0[2], w1[2];
    for (int h = 0; h < 2; h++) {
      w0[h] = float8_at<kKind>(m.w, base + i * 16 + 8 * h);
      w1[h] = float8_at<kKind>(m.w, base + i * 16 + 16 + 8 * h);
    }
    for (int r = 0; r < R; r++) {
      const __m256 x0 = _mm256_set1_ps(x[r * in.ldx + i]), x1 = _mm256_set1_ps(x[r * in.ldx + i + 1]);
      for (int h = 0; h < 2; h++) {
        even[r][h] = _mm256_fmadd_ps(x0, w0[h], even[r][h]);
        odd[r][h] = _mm256_fmadd_ps(x1, w1[h], odd[r][h]);
      }
    }
  }
  if (i < k)
    for (int h = 0; h < 2; h++) {
      const __m256 w0 = float8_at<kKind>(m.w, base + i * 16 + 8 * h);
      for (int r = 0; r < R; r++) even[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * in.ldx + i]), w0, even[r][h]);
    }
  const int64_t n0 = b * 16;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < 2; h++)
      store_first(y + (s0 + r) * ldy + n0 + 8 * h, m.n - n0 - 8 * h, _mm256_add_ps(even[r][h], odd[r][h]), accumulate);
}

}  // namespace
