// Attention of the decode step (see decode.cpp) over the blocked key cache, AVX2: attention.h's
// scores, soft-capping, softmax and weighing on 8-lane vectors (half a key block a vector).
// As there, a score is one chain of FMAs over the dimensions in order and an output one chain over
// the keys in order, whatever the rows and blocks computed beside it.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "simd_avx2.h"

namespace {

constexpr int kAccumulators = 12;  // of AVX2's 16 vector registers, those a pass keeps sums in
constexpr int kPassRows = 4;       // query rows a pass scores or weighs (a tile's rows in such passes)

// 8 int8 codes at p as fp32
inline __m256 load_codes8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// a q8 cache's key half (8 keys from lane `lane` of a block): the scales of dimensions 32 g..32 g + 31
inline __m256 q8_key_scales8(const int8_t* block, int64_t hd, int64_t lane, int64_t g) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * hd + g * 32 + lane * 2)));
}

// a q8 cache's value row (codes, then the row's scales): the scale of dimension d, 8 times
inline __m256 q8_value_scale8(const int8_t* row, int64_t hd, int64_t d) {
  return _mm256_set1_ps(half_to_float(reinterpret_cast<const uint16_t*>(row + hd)[d / 32]));
}

// scores [R, lds] of R query rows q [R, hd] against key halves h0..h0+KH (8 keys each: half h is
// block h/2's lanes 8 (h%2)..) of the transposed keys kt
template <int R, int KH, typename T>
void score_halves(const float* q, const T* kt, int64_t h0, int64_t hd, float* scores, int64_t lds, float scale_) {
  __m256 acc[R][KH];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < KH; h++) acc[r][h] = _mm256_setzero_ps();
  if constexpr (kQ8<T>) {  // per 32 dimensions: sums of q * code, then times the keys' scales
    const int8_t* base = reinterpret_cast<const int8_t*>(kt);
    for (int64_t g = 0; g < hd / 32; g++) {
      __m256 part[R][KH];
      for (int r = 0; r < R; r++)
        for (int h = 0; h < KH; h++) part[r][h] = _mm256_setzero_ps();
      for (int64_t i = g * 32; i < g * 32 + 32; i++) {
        __m256 codes[KH];
        for (int h = 0; h < KH; h++) codes[h] = load_codes8(base + (h0 + h) / 2 * 17 * hd + i * 16 + (h0 + h) % 2 * 8);
        for (int r = 0; r < R; r++) {
          const __m256 qi = _mm256_set1_ps(q[r * hd + i]);
          for (int h = 0; h < KH; h++) part[r][h] = _mm256_fmadd_ps(qi, codes[h], part[r][h]);
        }
      }
      for (int h = 0; h < KH; h++) {
        const __m256 scales = q8_key_scales8(base + (h0 + h) / 2 * 17 * hd, hd, (h0 + h) % 2 * 8, g);
        for (int r = 0; r < R; r++) acc[r][h] = _mm256_fmadd_ps(part[r][h], scales, acc[r][h]);
      }
    }
  } else {
    for (int64_t i = 0; i < hd; i++) {
      __m256 keys[KH];
      for (int h = 0; h < KH; h++) keys[h] = load8(kt + (((h0 + h) / 2) * hd + i) * 16 + (h0 + h) % 2 * 8);
      for (int r = 0; r < R; r++) {
        const __m256 qi = _mm256_set1_ps(q[r * hd + i]);
        for (int h = 0; h < KH; h++) acc[r][h] = _mm256_fmadd_ps(qi, keys[h], acc[r][h]);
      }
    }
  }
  const __m256 scale = _mm256_set1_ps(scale_);
  for (int r = 0; r < R; r++)
    for (int h = 0; h < KH; h++) _mm256_storeu_ps(scores + r * lds + (h0 + h) * 8, _mm256_mul_ps(acc[r][h], scale));
}

template <int R, typename T>
void score_rows(const float* q, const T* kt, int64_t blocks, int64_t hd, float* scores, int64_t lds, float scale) {
  constexpr int KH = std::max(1, std::min(4, kAccumulators / (kQ8<T> ? 2 * R : R)));  // q8: sums per group too
  int64_t h = 0;
  for (; h + KH <= 2 * blocks; h += KH) score_halves<R, KH>(q, kt, h, hd, scores, lds, scale);
  for (; h < 2 * blocks; h++) score_halves<R, 1>(q, kt, h, hd, scores, lds, scale);
}

// the rows in passes of at most kPassRows
template <typename T>
void score_any(int64_t rows, const float* q, const T* kt, int64_t blocks, int64_t hd, float* scores, int64_t lds,
               float scale) {
  for (int64_t r = 0; r < rows; r += kPassRows) {
    const float* qr = q + r * hd;
    float* sr = scores + r * lds;
    switch (std::min<int64_t>(kPassRows, rows - r)) {
      case 4: score_rows<4>(qr, kt, blocks, hd, sr, lds, scale); break;
      case 3: score_rows<3>(qr, kt, blocks, hd, sr, lds, scale); break;
      case 2: score_rows<2>(qr, kt, blocks, hd, sr, lds, scale); break;
      default: score_rows<1>(qr, kt, blocks, hd, sr, lds, scale);
    }
  }
}

// scores -> cap * tanh(scores / cap), in place (Gemma 2's soft-capping)
inline void softcap_row(float* sh, int64_t length, float cap) {
  const __m256 vcap = _mm256_set1_ps(cap), vinv = _mm256_set1_ps(1.f / cap);
  int64_t u = 0;
  for (; u + 8 <= length; u += 8)
    _mm256_storeu_ps(sh + u, _mm256_mul_ps(vcap, tanh_ps(_mm256_mul_ps(_mm256_loadu_ps(sh + u), vinv))));
  for (; u < length; u++) sh[u] = cap * std::tanh(sh[u] / cap);
}

// a row of scores [length] -> softmax weights, unnormalised; returns their sum, its max at *top
inline float softmax_row(float* sh, int64_t length, float* top) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 vmax = ninf;
  int64_t u = 0;
  for (; u + 8 <= length; u += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sh + u));
  const __m256i mask = first_lanes(length - u);
  if (u < length)
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_maskload_ps(sh + u, mask), _mm256_castsi256_ps(mask)));
  *top = hmax(vmax);
  const __m256 vtop = _mm256_set1_ps(*top);
  __m256 vsum = _mm256_setzero_ps();
  for (u = 0; u + 8 <= length; u += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sh + u), vtop));
    _mm256_storeu_ps(sh + u, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (u < length) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_maskload_ps(sh + u, mask), vtop));
    _mm256_maskstore_ps(sh + u, mask, e);
    vsum = _mm256_add_ps(vsum, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));
  }
  return hsum(vsum);
}

// out [R, hd] = weights [R, lds] · V [length, hd] for R rows, DV vectors (8 outputs each) a pass
template <int R, int DV, typename T>
void weigh_pass(const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, int64_t d0, const float* inv,
                float* out) {
  __m256 acc[R][DV];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < DV; j++) acc[r][j] = _mm256_setzero_ps();
  for (int64_t u = 0; u < length; u++) {
    __m256 vu[DV];
    if constexpr (kQ8<T>) {
      const int8_t* row = reinterpret_cast<const int8_t*>(v + span<T>(u, hd));
      __m256 scale = _mm256_setzero_ps();
      for (int j = 0; j < DV; j++) {  // DV 4: d0 is a multiple of 32, the vectors one group
        if (DV != 4 || j == 0) scale = q8_value_scale8(row, hd, d0 + 8 * j);
        vu[j] = _mm256_mul_ps(load_codes8(row + d0 + 8 * j), scale);
      }
    } else {
      for (int j = 0; j < DV; j++) vu[j] = load8(v + u * hd + d0 + 8 * j);
    }
    for (int r = 0; r < R; r++) {
      const __m256 wu = _mm256_set1_ps(w[r * lds + u]);
      for (int j = 0; j < DV; j++) acc[r][j] = _mm256_fmadd_ps(wu, vu[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int j = 0; j < DV; j++)
      _mm256_storeu_ps(out + r * hd + d0 + 8 * j, _mm256_mul_ps(acc[r][j], _mm256_set1_ps(inv[r])));
}

template <int R, typename T>
void weigh_rows(const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, const float* inv, float* out) {
  constexpr int DV = std::max(1, std::min(4, kAccumulators / R));
  int64_t d0 = 0;
  for (; d0 + 8 * DV <= hd; d0 += 8 * DV) weigh_pass<R, DV>(w, lds, v, length, hd, d0, inv, out);
  for (; d0 < hd; d0 += 8) weigh_pass<R, 1>(w, lds, v, length, hd, d0, inv, out);
}

template <typename T>
void weigh_any(int64_t rows, const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, const float* inv,
               float* out) {
  for (int64_t r = 0; r < rows; r += kPassRows) {
    const float* wr = w + r * lds;
    float* o = out + r * hd;
    switch (std::min<int64_t>(kPassRows, rows - r)) {
      case 4: weigh_rows<4>(wr, lds, v, length, hd, inv + r, o); break;
      case 3: weigh_rows<3>(wr, lds, v, length, hd, inv + r, o); break;
      case 2: weigh_rows<2>(wr, lds, v, length, hd, inv + r, o); break;
      default: weigh_rows<1>(wr, lds, v, length, hd, inv + r, o);
    }
  }
}

}  // namespace
