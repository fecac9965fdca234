// The decode step's projections of a GGUF's float tensors (F16, BF16, F32) as the file holds them,
// AVX-512; project_float_avx2.h does the same on AVX2. No int8 activations: the fp32 rows themselves
// (in.x) times the weights, each converted to fp32 in registers (F16C's VCVTPH2PS; a bf16 is the high
// half of its fp32, a 16-bit shift), so no fp32 copy of a tensor is ever made. 16 outputs a block:
//   w [ceil(n/16)][k][16]: input i of the block's 16 outputs side by side (zero past n)
// Each output sums in fp32 in one fixed order, whatever the rows beside it or the thread count: the
// products of even inputs in one FMA chain and of odd inputs in another, over the inputs in order,
// then the two added. Both builds do exactly that per output, so they give the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "common.h"
#include "project.h"

namespace {

constexpr int kFloatRows = 4;  // rows a pass over a block computes (4 x 2 accumulators)

// 16 weights of kind kKind at p, as fp32
template <int kKind>
inline __m512 float16_at(const void* p, int64_t at) {
  if constexpr (kKind == WEIGHT_F32R) {
    return _mm512_loadu_ps(static_cast<const float*>(p) + at);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + at));
    if constexpr (kKind == WEIGHT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// y[s, n0..n0+16) for rows s0..s0+R, F16 / BF16 / F32 block b (kKind: WEIGHT_F16, _BF16 or _F32R)
template <int R, int kKind>
void float_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t k = m.k, base = b * k * 16;
  __m512 even[R], odd[R];
  for (int r = 0; r < R; r++) even[r] = odd[r] = _mm512_setzero_ps();
  const float* x = in.x + s0 * in.ldx;
  int64_t i = 0;
  for (; i + 2 <= k; i += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(static_cast<const uint8_t*>(m.w)) + (base + (i + 16) * 16) *
                     (kKind == WEIGHT_F32R ? 4 : 2), _MM_HINT_T0);
    const __m512 w0 = float16_at<kKind>(m.w, base + i * 16), w1 = float16_at<kKind>(m.w, base + i * 16 + 16);
    for (int r = 0; r < R; r++) {
      even[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in.ldx + i]), w0, even[r]);
      odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in.ldx + i + 1]), w1, odd[r]);
    }
  }
  if (i < k) {
    const __m512 w0 = float16_at<kKind>(m.w, base + i * 16);
    for (int r = 0; r < R; r++) even[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * in.ldx + i]), w0, even[r]);
  }
  for (int r = 0; r < R; r++) even[r] = _mm512_add_ps(even[r], odd[r]);
  store_block<R>(even, m, b, s0, y, ldy, accumulate);
}

}  // namespace
