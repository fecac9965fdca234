// Attention of the decode step (see decode.cpp) over the blocked key cache, aarch64 NEON:
// attention_avx2.h's scores, soft-capping, softmax and weighing on 4-lane vectors (a quarter of a key
// block a vector). As there, a score is one chain of FMAs over the dimensions in order and an output one
// chain over the keys in order, whatever the rows and blocks computed beside it; softmax's sum and the
// scalar tails are AVX2's, so the scores, weights and outputs are its bits.
#pragma once

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "simd_neon.h"

namespace {

constexpr int kAccumulators = 24;  // of NEON's 32 vector registers, those a pass keeps sums in
constexpr int kPassRows = 4;       // query rows a pass scores or weighs (a tile's rows in such passes)

// 4 int8 codes at p as fp32
inline float32x4_t load_codes4(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(word)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
}

// a q8 cache's key quarter (4 keys from lane `lane` of a block): the scales of dimensions 32 g..32 g + 31
inline float32x4_t q8_key_scales4(const int8_t* block, int64_t hd, int64_t lane, int64_t g) {
  return load_half4(reinterpret_cast<const uint16_t*>(block + 16 * hd + g * 32 + lane * 2));
}

// a q8 cache's value row (codes, then the row's scales): the scale of dimension d, 4 times
inline float32x4_t q8_value_scale4(const int8_t* row, int64_t hd, int64_t d) {
  return vdupq_n_f32(half_to_float(reinterpret_cast<const uint16_t*>(row + hd)[d / 32]));
}

// scores [R, lds] of R query rows q [R, hd] against key quarters k0..k0+KQ (4 keys each: quarter k is
// block k/4's lanes 4 (k%4)..) of the transposed keys kt
template <int R, int KQ, typename T>
void score_quarters(const float* q, const T* kt, int64_t k0, int64_t hd, float* scores, int64_t lds, float scale_) {
  float32x4_t acc[R][KQ];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < KQ; h++) acc[r][h] = vdupq_n_f32(0.f);
  if constexpr (kQ8<T>) {  // per 32 dimensions: sums of q * code, then times the keys' scales
    const int8_t* base = reinterpret_cast<const int8_t*>(kt);
    for (int64_t g = 0; g < hd / 32; g++) {
      float32x4_t part[R][KQ];
      for (int r = 0; r < R; r++)
        for (int h = 0; h < KQ; h++) part[r][h] = vdupq_n_f32(0.f);
      for (int64_t i = g * 32; i < g * 32 + 32; i++) {
        float32x4_t codes[KQ];
        for (int h = 0; h < KQ; h++) codes[h] = load_codes4(base + (k0 + h) / 4 * 17 * hd + i * 16 + (k0 + h) % 4 * 4);
        for (int r = 0; r < R; r++) {
          const float32x4_t qi = vdupq_n_f32(q[r * hd + i]);
          for (int h = 0; h < KQ; h++) part[r][h] = vfmaq_f32(part[r][h], qi, codes[h]);
        }
      }
      for (int h = 0; h < KQ; h++) {
        const float32x4_t scales = q8_key_scales4(base + (k0 + h) / 4 * 17 * hd, hd, (k0 + h) % 4 * 4, g);
        for (int r = 0; r < R; r++) acc[r][h] = vfmaq_f32(acc[r][h], part[r][h], scales);
      }
    }
  } else {
    for (int64_t i = 0; i < hd; i++) {
      float32x4_t keys[KQ];
      for (int h = 0; h < KQ; h++) keys[h] = load4(kt + (((k0 + h) / 4) * hd + i) * 16 + (k0 + h) % 4 * 4);
      for (int r = 0; r < R; r++) {
        const float32x4_t qi = vdupq_n_f32(q[r * hd + i]);
        for (int h = 0; h < KQ; h++) acc[r][h] = vfmaq_f32(acc[r][h], qi, keys[h]);
      }
    }
  }
  const float32x4_t scale = vdupq_n_f32(scale_);
  for (int r = 0; r < R; r++)
    for (int h = 0; h < KQ; h++) vst1q_f32(scores + r * lds + (k0 + h) * 4, vmulq_f32(acc[r][h], scale));
}

template <int R, typename T>
void score_rows(const float* q, const T* kt, int64_t blocks, int64_t hd, float* scores, int64_t lds, float scale) {
  constexpr int KQ = std::max(1, std::min(8, kAccumulators / (kQ8<T> ? 2 * R : R)));  // q8: sums per group too
  int64_t h = 0;
  for (; h + KQ <= 4 * blocks; h += KQ) score_quarters<R, KQ>(q, kt, h, hd, scores, lds, scale);
  for (; h < 4 * blocks; h++) score_quarters<R, 1>(q, kt, h, hd, scores, lds, scale);
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

// scores -> cap * tanh(scores / cap), in place (Gemma 2's soft-capping): vectors over AVX2's 8s, its tail
inline void softcap_row(float* sh, int64_t length, float cap) {
  const float32x4_t vcap = vdupq_n_f32(cap), vinv = vdupq_n_f32(1.f / cap);
  int64_t u = 0;
  for (; u + 8 <= length; u += 8)
    for (int j = 0; j < 8; j += 4) vst1q_f32(sh + u + j, vmulq_f32(vcap, tanh_ps(vmulq_f32(vld1q_f32(sh + u + j), vinv))));
  for (; u < length; u++) sh[u] = cap * std::tanh(sh[u] / cap);
}

// a row of scores [length] -> softmax weights, unnormalised; returns their sum (AVX2's: 8 lanes summed
// apart, the last, partial 8 as its masked lanes, then its reduction), its max at *top_out
inline float softmax_row(float* sh, int64_t length, float* top_out) {
  float top = -INFINITY;
  int64_t u = 0;
  if (length >= 4) {
    float32x4_t vmax = vdupq_n_f32(-INFINITY);
    for (; u + 4 <= length; u += 4) vmax = vmaxq_f32(vmax, vld1q_f32(sh + u));
    top = vmaxvq_f32(vmax);
  }
  for (; u < length; u++) top = std::max(top, sh[u]);
  *top_out = top;
  const float32x4_t vtop = vdupq_n_f32(top);
  float32x4_t lo = vdupq_n_f32(0.f), hi = vdupq_n_f32(0.f);
  for (u = 0; u + 8 <= length; u += 8) {
    const float32x4_t a = exp_ps(vsubq_f32(vld1q_f32(sh + u), vtop)), b = exp_ps(vsubq_f32(vld1q_f32(sh + u + 4), vtop));
    vst1q_f32(sh + u, a);
    vst1q_f32(sh + u + 4, b);
    lo = vaddq_f32(lo, a);
    hi = vaddq_f32(hi, b);
  }
  if (u < length) {  // the lanes past the row are 0 in the sums
    const int64_t left = length - u;
    float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    std::memcpy(part, sh + u, left * sizeof(float));
    float e[8];
    vst1q_f32(e, exp_ps(vsubq_f32(vld1q_f32(part), vtop)));
    vst1q_f32(e + 4, exp_ps(vsubq_f32(vld1q_f32(part + 4), vtop)));
    std::fill(e + left, e + 8, 0.f);
    std::memcpy(sh + u, e, left * sizeof(float));
    lo = vaddq_f32(lo, vld1q_f32(e));
    hi = vaddq_f32(hi, vld1q_f32(e + 4));
  }
  return hsum8(lo, hi);
}

// out [R, hd] = weights [R, lds] · V [length, hd] for R rows, DV vectors (4 outputs each) a pass
template <int R, int DV, typename T>
void weigh_pass(const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, int64_t d0, const float* inv,
                float* out) {
  float32x4_t acc[R][DV];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < DV; j++) acc[r][j] = vdupq_n_f32(0.f);
  for (int64_t u = 0; u < length; u++) {
    float32x4_t vu[DV];
    if constexpr (kQ8<T>) {
      const int8_t* row = reinterpret_cast<const int8_t*>(v + span<T>(u, hd));
      float32x4_t scale = vdupq_n_f32(0.f);
      for (int j = 0; j < DV; j++) {  // DV 8: d0 is a multiple of 32, the vectors one group
        if (DV != 8 || j == 0) scale = q8_value_scale4(row, hd, d0 + 4 * j);
        vu[j] = vmulq_f32(load_codes4(row + d0 + 4 * j), scale);
      }
    } else {
      for (int j = 0; j < DV; j++) vu[j] = load4(v + u * hd + d0 + 4 * j);
    }
    for (int r = 0; r < R; r++) {
      const float32x4_t wu = vdupq_n_f32(w[r * lds + u]);
      for (int j = 0; j < DV; j++) acc[r][j] = vfmaq_f32(acc[r][j], wu, vu[j]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int j = 0; j < DV; j++) vst1q_f32(out + r * hd + d0 + 4 * j, vmulq_f32(acc[r][j], vdupq_n_f32(inv[r])));
}

template <int R, typename T>
void weigh_rows(const float* w, int64_t lds, const T* v, int64_t length, int64_t hd, const float* inv, float* out) {
  constexpr int DV = std::max(1, std::min(8, kAccumulators / R));
  int64_t d0 = 0;
  for (; d0 + 4 * DV <= hd; d0 += 4 * DV) weigh_pass<R, DV>(w, lds, v, length, hd, d0, inv, out);
  for (; d0 < hd; d0 += 4) weigh_pass<R, 1>(w, lds, v, length, hd, d0, inv, out);
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
