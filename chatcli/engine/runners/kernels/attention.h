// Attention of the decode step (see decode.cpp) over the blocked key cache, AVX-512.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "simd.h"

namespace {

// ---- attention ------------------------------------------------------------------------------
//
// Keys are cached in blocks of 16 positions, transposed ([capacity/16, hd, 16] per KV head), so
// that one vector holds one dimension of 16 keys: a score is then one chain of FMAs over the
// dimensions in order, for any number of query rows, with no horizontal sum. Values stay
// [capacity, hd] (a softmax weight broadcast against a value row). A q8_0 cache (common.h: Q8) is
// dequantized as it is read, in the same loops: a key or value is its code times its fp16 scale.

// 16 int8 codes at p as fp32
inline __m512 load_codes16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// a q8 cache's key block (common.h: Q8): the scales of its 16 keys' dimensions 32 g..32 g + 31
inline __m512 q8_key_scales16(const int8_t* block, int64_t hd, int64_t group) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 * hd + group * 32)));
}

// a q8 cache's value row (codes, then the row's scales): the scale of dimension d, 16 times
inline __m512 q8_value_scale16(const int8_t* row, int64_t hd, int64_t d) {
  const uint16_t s = reinterpret_cast<const uint16_t*>(row + hd)[d / 32];
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(s)));
}

// scores [R, lds] of R query rows q [R, hd] against key blocks b0..b0+KB of the transposed keys kt:
// each score one chain over i, so the same bits whatever R, KB and the blocks around it. A q8 cache's
// score: per 32 dimensions a chain of q * code, then times the keys' scales, one chain over the groups.
template <int R, int KB, typename T>
void score_blocks(const float* q, const T* kt, int64_t b0, int64_t hd, float* scores, int64_t lds, float scale_) {
  __m512 acc[R][KB];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < KB; b++) acc[r][b] = _mm512_setzero_ps();
  if constexpr (kQ8<T>) {  // per 32 dimensions: sums of q * code, then times the keys' scales
    const int8_t* first = reinterpret_cast<const int8_t*>(kt) + b0 * 17 * hd;
    for (int64_t g = 0; g < hd / 32; g++) {
      __m512 part[R][KB];
      for (int r = 0; r < R; r++)
        for (int b = 0; b < KB; b++) part[r][b] = _mm512_setzero_ps();
      for (int64_t i = g * 32; i < g * 32 + 32; i++) {
        __m512 codes[KB];
        for (int b = 0; b < KB; b++) codes[b] = load_codes16(first + b * 17 * hd + i * 16);
        for (int r = 0; r < R; r++) {
          const __m512 qi = _mm512_set1_ps(q[r * hd + i]);
          for (int b = 0; b < KB; b++) part[r][b] = _mm512_fmadd_ps(qi, codes[b], part[r][b]);
        }
      }
      for (int b = 0; b < KB; b++) {
        const __m512 scales = q8_key_scales16(first + b * 17 * hd, hd, g);
        for (int r = 0; r < R; r++) acc[r][b] = _mm512_fmadd_ps(part[r][b], scales, acc[r][b]);
      }
    }
  } else {
    for (int64_t i = 0; i < hd; i++) {
      __m512 keys[KB];
      for (int b = 0; b < KB; b++) keys[b] = load16(kt + ((b0 + b) * hd + i) * 16);
      for (int r = 0; r < R; r++) {
        const __m512 qi = _mm512_set1_ps(q[r * hd + i]);
        for (int b = 0; b < KB; b++) acc[r][b] = _mm512_fmadd_ps(qi, keys[b], acc[r][b]);
      }
    }
  }
  const __m512 scale = _mm512_set1_ps(scale_);
  for (int r = 0; r < R; r++)
    for (int b = 0; b < KB; b++) _mm512_storeu_ps(scores + r * lds + (b0 + b) * 16, _mm512_mul_ps(acc[r][b], scale));
}

// all `blocks` key blocks for R rows, KB blocks at a time (R * KB accumulators in registers)
template <int R, typename T>
void score_rows(const float* q, const T* kt, int64_t blocks, int64_t hd, float* scores, int64_t lds, float scale) {
  constexpr int KB = std::max(1, std::min(8, (kQ8<T> ? 12 : 24) / R));  // q8: sums per group too
  int64_t b = 0;
  for (; b + KB <= blocks; b += KB) score_blocks<R, KB>(q, kt, b, hd, scores, lds, scale);
  for (; b < blocks; b++) score_blocks<R, 1>(q, kt, b, hd, scores, lds, scale);
}

template <typename T, int R = kTileRows>
void score_any(int64_t rows, const float* q, const T* kt, int64_t blocks, int64_t hd, float* scores, int64_t lds,
               float scale) {
  if constexpr (R > 0) {
    if (rows == R)
      score_rows<R>(q, kt, blocks, hd, scores, lds, scale);
    else
      score_any<T, R - 1>(rows, q, kt, blocks, hd, scores, lds, scale);
  }
}

// scores -> cap * tanh(scores / cap), in place (Gemma 2's soft-capping)
inline void softcap_row(float* sh, int64_t length, float cap) {
  const __m512 vcap = _mm512_set1_ps(cap), vinv = _mm512_set1_ps(1.f / cap);
  int64_t u = 0;
  for (; u + 16 <= length; u += 16)
    _mm512_storeu_ps(sh + u, _mm512_mul_ps(vcap, tanh_ps(_mm512_mul_ps(_mm512_loadu_ps(sh + u), vinv))));
  for (; u < length; u++) sh[u] = cap * std::tanh(sh[u] / cap);
}

// a row of scores [length] -> softmax weights, unnormalised; returns their sum, its max at *top
inline float softmax_row(float* sh, int64_t length, float* top) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  int64_t u = 0;
  for (; u + 16 <= length; u += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(sh + u));
  const __mmask16 mask = static_cast<__mmask16>((1u << (length - u)) - 1u);
  if (u < length) vmax = _mm512_mask_max_ps(vmax, mask, vmax, _mm512_maskz_loadu_ps(mask, sh + u));
  *top = _mm512_reduce_max_ps(vmax);
  const __m512 vtop = _mm512_set1_ps(*top);
  __m512 vsum = _mm512_setzero_ps();
  for (u = 0; u + 16 <= length; u += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sh + u), vtop));
    _mm512_storeu_ps(sh + u, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (u < length) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sh + u), vtop));
    _mm512_mask_storeu_ps(sh + u, mask, e);
    vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(mask, e));
  }
  return hsum(vsum);
}

// out [R, hd] = weights [R, lds] · V [length, hd] for R rows, DV vectors of outputs a pass: each V row
// is read (and converted) once a pass for every row, R * DV accumulators stay in registers; per
// output one chain over u in order, whatever R and DV.
template <int R, int DV, typename T>
void weigh_pass(const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, int64_t d0, const float* inv,
                float* out) {
  __m512 acc[R][DV];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < DV; j++) acc[r][j] = _mm512_setzero_ps();
  for (int64_t u = 0; u < length; u++) {
    __m512 vu[DV];
    if constexpr (kQ8<T>) {
      const int8_t* row = reinterpret_cast<const int8_t*>(v + span<T>(u, hd));
      __m512 scale = _mm512_setzero_ps();
      for (int j = 0; j < DV; j++) {  // DV even: d0 is a multiple of 32, each pair of vectors one group
        if (DV % 2 || j % 2 == 0) scale = q8_value_scale16(row, hd, d0 + 16 * j);
        vu[j] = _mm512_mul_ps(load_codes16(row + d0 + 16 * j), scale);
      }
    } else {
      for (int j = 0; j < DV; j++) vu[j] = load16(v + u * hd + d0 + 16 * j);
    }
    for (int r = 0; r < R; r++) {
      const __m512 wu = _mm512_set1_ps(w[r * lds + u]);
      for (int j = 0; j < DV; j++) acc[r][j] = _mm512_fmadd_ps(wu, vu[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int j = 0; j < DV; j++)
      _mm512_storeu_ps(out + r * hd + d0 + 16 * j, _mm512_mul_ps(acc[r][j], _mm512_set1_ps(inv[r])));
}

template <int R, typename T>
void weigh_rows(const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, const float* inv, float* out) {
  constexpr int DV = R <= 6 ? 4 : 2;
  int64_t d0 = 0;
  for (; d0 + 16 * DV <= hd; d0 += 16 * DV) weigh_pass<R, DV>(w, lds, v, length, hd, d0, inv, out);
  for (; d0 < hd; d0 += 16) weigh_pass<R, 1>(w, lds, v, length, hd, d0, inv, out);
}

template <typename T, int R = kTileRows>
void weigh_any(int64_t rows, const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, const float* inv,
               float* out) {
  if constexpr (R > 0) {
    if (rows == R)
      weigh_rows<R>(w, lds, v, length, hd, inv, out);
    else
      weigh_any<T, R - 1>(rows, w, lds, v, length, hd, inv, out);
  }
}

}  // namespace
