// The stages built on an instruction set's vector code (included after it, see decode.cpp):
// a projection of any weight kind, a grouped embedding row, a sandwich norm, attention of a tile.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#if defined(__AVX512F__)  // the kinds added since decode.cpp's own includes: GGUF's float tensors, IQ4_NL / IQ4_XS
#include "project_amx.h"
#include "project_float.h"
#include "project_iq4.h"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include "project_float_neon.h"
#include "project_iq4_neon.h"
#else
#include "project_float_avx2.h"
#include "project_iq4_avx2.h"
#endif
#include "project_raw.h"

namespace {

// x [d] <- x / rms(x) * w, in place (q/k norms, sandwich norms: weights that cannot be folded)
void rms_norm_scaled(float* x, const float* w, int64_t d, float eps) {
  rms_norm(x, d, eps, x);
  for (int64_t i = 0; i < d; i++) x[i] *= w[i];
}

// the outputs a unit of a projection writes: 16 (a block), or kPanel (an fp32 panel)
inline int64_t unit_width(const Matrix& m) { return m.kind == WEIGHT_F32 ? kPanel : 16; }

// y [S, n] (row stride ldy) = in · W^T, or += with accumulate, of a matrix that is not WEIGHT_PARTS, through
// `split(pass, units, work)`: work(unit, rows, s) for each of its units (unit_width outputs) and each pass of
// rows (`rows`: an integral_constant, at most `pass`'s; s: the pass's first row) that the caller gives it
template <typename Split>
void project_units(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate, Split split) {
  const int64_t blocks = (m.n + 15) / 16;
  using Int = std::integral_constant<int, kRowsPerPass>;
  using Float = std::integral_constant<int, kFloatRows>;
  if (m.kind == WEIGHT_Q4K)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      kquant_block<decltype(r)::value, WEIGHT_Q4K>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_Q5K)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      kquant_block<decltype(r)::value, WEIGHT_Q5K>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_Q6K)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      kquant_block<decltype(r)::value, WEIGHT_Q6K>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_Q3K)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      low_block<decltype(r)::value, WEIGHT_Q3K>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_Q2K)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      low_block<decltype(r)::value, WEIGHT_Q2K>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_F16)
    split(Float{}, blocks, [&](int64_t b, auto r, int64_t s) {
      float_block<decltype(r)::value, WEIGHT_F16>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_BF16)
    split(Float{}, blocks, [&](int64_t b, auto r, int64_t s) {
      float_block<decltype(r)::value, WEIGHT_BF16>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_F32R)
    split(Float{}, blocks, [&](int64_t b, auto r, int64_t s) {
      float_block<decltype(r)::value, WEIGHT_F32R>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_IQ4NL)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      iq4_block<decltype(r)::value, WEIGHT_IQ4NL>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_IQ4XS)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      iq4_block<decltype(r)::value, WEIGHT_IQ4XS>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_MXFP4)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) {
      iq4_block<decltype(r)::value, WEIGHT_MXFP4>(m, b, in, s, y, ldy, accumulate);
    });
  else if (m.kind == WEIGHT_Q4)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) { group_block<decltype(r)::value, 4>(m, b, in, s, y, ldy, accumulate); });
  else if (m.kind == WEIGHT_Q8)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) { group_block<decltype(r)::value, 8>(m, b, in, s, y, ldy, accumulate); });
  else if (m.kind == WEIGHT_I8)
    split(Int{}, blocks, [&](int64_t b, auto r, int64_t s) { int8_block<decltype(r)::value>(m, b, in, s, y, ldy, accumulate); });
  else
    split(std::integral_constant<int, kF32Rows>{}, (m.n + kPanel - 1) / kPanel, [&](int64_t p, auto r, int64_t s) {
      f32_panel<decltype(r)::value>(m, p, in, s, y, ldy, accumulate);
    });
}

// run(integral_constant<int, kind>) with a K-quant matrix's kind (WEIGHT_Q4K, _Q5K or _Q6K)
template <typename Run>
void with_kquant_kind(const Matrix& m, Run run) {
  if (m.kind == WEIGHT_Q4K)
    run(std::integral_constant<int, WEIGHT_Q4K>{});
  else if (m.kind == WEIGHT_Q5K)
    run(std::integral_constant<int, WEIGHT_Q5K>{});
  else
    run(std::integral_constant<int, WEIGHT_Q6K>{});
}

// this thread's scratch of at least `bytes`, 64-byte aligned (a block's codes unpacked), kept for its next calls
inline uint8_t* thread_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) / 64 * 64);
}

// a K-quant projection of 16 rows or more where the CPU has AMX: rows in passes of 16 on its tiles
// (project_amx.h, the same bits as VNNI's passes, which take the rows left over); false: not here
inline bool project_amx(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate) {
#if defined(__AVX512F__)
  if (m.kind < WEIGHT_Q4K || m.kind > WEIGHT_Q6K || in.count < kAmxRows || !amx_ready()) return false;
  uint8_t* codes = thread_scratch(static_cast<size_t>(m.kp / 32 * 512));  // a block's codes unpacked
  with_kquant_kind(m, [&](auto kind) {
    constexpr int kKind = decltype(kind)::value;
    const auto vnni = [&](int64_t b, auto r, int64_t s) {
      kquant_block<decltype(r)::value, kKind>(m, b, in, s, y, ldy, accumulate);
    };
    const auto amx = [&](int64_t b, int64_t first, int64_t count) {
      kquant_amx<kKind>(m, b, in, first, count, y, ldy, accumulate, codes);
    };
    split_tiles(in, (m.n + 15) / 16, amx, vnni);
  });
  return true;
#else
  (void)m, (void)in, (void)y, (void)ldy, (void)accumulate;
  return false;
#endif
}

// a K-quant projection of kUnpackRows rows or more (a prompt's chunk) on the vector units: each block's codes
// unpacked once, then its passes of rows read them. AVX-512: unpack_group, kRowsPerPass rows a pass; AVX2:
// unpack_codes (the scale vectors too) and kquant_block_unpacked, kUnpackedPass rows a pass, half a block at a
// time. The same dots and sums, so the same bits as kquant_block's own passes; false: not here (NEON, fewer rows).
// blocks(pass, units, work): work(b, first, count) for each block b and run of rows (whole passes) the caller
// gives it: split_blocks over a team (project_unpacked), or a unit's every row (moe.h's project_item).
template <typename Blocks>
inline bool unpacked_passes(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate, Blocks blocks) {
#if defined(__aarch64__)
  (void)m, (void)in, (void)y, (void)ldy, (void)accumulate, (void)blocks;
  return false;
#else
  if (m.kind < WEIGHT_Q4K || m.kind > WEIGHT_Q6K || in.count < kUnpackRows) return false;
#if defined(__AVX512F__)
  constexpr int kPass = kRowsPerPass;
  uint8_t* unpacked = thread_scratch(static_cast<size_t>(m.kp / 32 * 512));
  const auto unpack = [&](auto kind, int64_t b) {
    for (int64_t g = 0; g < m.kp / 32; g++) unpack_group<decltype(kind)::value>(m, b, g, unpacked + g * 512);
  };
  const auto pass = [&](auto kind, auto rows, int64_t b, int64_t s) {
    kquant_block<decltype(rows)::value, decltype(kind)::value, true>(m, b, in, s, y, ldy, accumulate, unpacked);
  };
#else
  constexpr int kPass = kUnpackedPass;
  uint8_t* unpacked = thread_scratch(static_cast<size_t>(m.kp / 32 * kUnpackedBytes));
  const auto unpack = [&](auto kind, int64_t b) { unpack_codes<decltype(kind)::value>(m, b, unpacked); };
  const auto pass = [&](auto kind, auto rows, int64_t b, int64_t s) {
    kquant_block_unpacked<decltype(rows)::value, decltype(kind)::value>(m, b, in, s, y, ldy, accumulate, unpacked);
  };
#endif
  with_kquant_kind(m, [&](auto kind) {
    blocks(std::integral_constant<int, kPass>{}, (m.n + 15) / 16, [&](int64_t b, int64_t first, int64_t count) {
      unpack(kind, b);
      Rows part = in;
      part.count = count;
      each_row_pass<kPass>(part, [&](auto rows, int64_t s) { pass(kind, rows, b, first + s); });
    });
  });
  return true;
#endif
}

inline bool project_unpacked(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate) {
  return unpacked_passes(m, in, y, ldy, accumulate, [&](auto pass, int64_t units, auto work) {
    split_blocks<decltype(pass)::value>(in, units, work);
  });
}

// y [S, n] (row stride ldy) = in · W^T, or += with accumulate; called by every thread of a team, each
// unit and row block by one of them (split)
void project(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate) {
  if (m.kind == WEIGHT_PARTS) {  // each part into its columns (a barrier after each)
    int64_t at = 0;
    for (int64_t i = 0; i < m.n_parts; i++) {
      project(m.parts[i], in, y + at, ldy, accumulate);
      at += m.parts[i].n;
    }
  } else if (raw_rows(m)) {
    raw_passes(m, in, y, ldy, accumulate, [&](auto pass, int64_t units, auto work) {
      split_blocks<decltype(pass)::value>(in, units, work);
    });
  } else if (!project_amx(m, in, y, ldy, accumulate) && !project_unpacked(m, in, y, ldy, accumulate)) {
    project_units(m, in, y, ldy, accumulate, [&](auto pass, int64_t units, auto work) {
      split<decltype(pass)::value>(in, units, work);
    });
  }
}

// row r of a K-quant matrix, dequantized into out [k], times `scale` (see dequantize_row)
inline void dequantize_kquant_row(const Matrix& m, int64_t r, float scale, float* out) {
  const int64_t groups = m.kp / 32, supers = m.kp / 256, b = r / 16, o = r % 16;
  const bool k6 = m.kind == WEIGHT_Q6K;
  const int high = m.kind == WEIGHT_Q4K ? 0 : m.kind == WEIGHT_Q5K ? 1 : 2;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 256;
  for (int64_t g = 0; g < groups; g++) {
    const int64_t sb = (b * supers + g / 8) * 16 + o;
    const float d = half_to_float(m.d[sb]), dmin = k6 ? 0.f : half_to_float(m.mins[sb]);
    for (int64_t i = 0; i < 32 && g * 32 + i < m.k; i++) {
      const int64_t quad = i / 4, lane = o * 4 + i % 4;
      int code = (w[(g * 4 + quad / 2) * 64 + lane] >> (4 * (quad % 2))) & 15;
      if (high == 1) code |= ((m.hi[(b * groups + g) * 64 + lane] >> quad) & 1) << 4;
      if (high == 2) code |= ((m.hi[((b * groups + g) * 2 + quad / 4) * 64 + lane] >> (2 * (quad % 4))) & 3) << 4;
      float v;
      if (k6) {
        const int8_t sc = static_cast<int8_t>(m.sc[((b * groups + g) * 2 + i / 16) * 16 + o]);
        v = d * static_cast<float>(sc) * static_cast<float>(code - 32);
      } else {
        const int64_t at = (b * groups + g) * 16 + o;
        v = d * static_cast<float>(m.sc[at]) * static_cast<float>(code) - dmin * static_cast<float>(m.sm[at]);
      }
      out[g * 32 + i] = v * scale;
    }
  }
}

// row r of a Q3_K / Q2_K matrix (project_low.h), dequantized into out [k], times `scale` (see dequantize_row)
inline void dequantize_low_row(const Matrix& m, int64_t r, float scale, float* out) {
  const int64_t groups = m.kp / 32, supers = m.kp / 256, b = r / 16, o = r % 16;
  const bool k3 = m.kind == WEIGHT_Q3K;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 128;
  for (int64_t g = 0; g < groups; g++) {
    const int64_t sb = (b * supers + g / 8) * 16 + o;
    const float d = half_to_float(m.d[sb]), dmin = k3 ? 0.f : half_to_float(m.mins[sb]);
    for (int64_t i = 0; i < 32 && g * 32 + i < m.k; i++) {
      const int64_t quad = i / 4, lane = o * 4 + i % 4;
      int code = (w[(g * 2 + quad / 4) * 64 + lane] >> (2 * (quad % 4))) & 3;
      const uint8_t sc = m.sc[((b * groups + g) * 16 + o) * 2 + i / 16];
      float v;
      if (k3) {
        code |= ((m.hi[(b * groups + g) * 64 + lane] >> quad) & 1) << 2;
        v = d * static_cast<float>(static_cast<int8_t>(sc)) * static_cast<float>(code - 4);
      } else {
        v = d * static_cast<float>(sc & 15) * static_cast<float>(code) - dmin * static_cast<float>(sc >> 4);
      }
      out[g * 32 + i] = v * scale;
    }
  }
}

// row r of an F16 / BF16 / F32 matrix (project_float.h) into out [k], times `scale` (see dequantize_row)
inline void float_row(const Matrix& m, int64_t r, float scale, float* out) {
  const int64_t at = r / 16 * m.k * 16 + r % 16;
  for (int64_t i = 0; i < m.k; i++) {
    float v;
    if (m.kind == WEIGHT_F32R)
      v = static_cast<const float*>(m.w)[at + i * 16];
    else if (m.kind == WEIGHT_F16)
      v = half_to_float(static_cast<const uint16_t*>(m.w)[at + i * 16]);
    else
      v = bf16_to_float(static_cast<const uint16_t*>(m.w)[at + i * 16]);
    out[i] = v * scale;
  }
}

// row r of an IQ4_NL / IQ4_XS / MXFP4 matrix (project_iq4.h), dequantized into out [k], times `scale` (see dequantize_row)
inline void dequantize_iq4_row(const Matrix& m, int64_t r, float scale, float* out) {
  const int64_t groups = m.kp / 32, supers = m.kp / 256, b = r / 16, o = r % 16;
  const bool xs = m.kind == WEIGHT_IQ4XS;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * 256;
  for (int64_t g = 0; g < groups; g++) {
    const uint16_t dh = m.d[(b * (xs ? supers : groups) + (xs ? g / 8 : g)) * 16 + o];
    float d = m.kind == WEIGHT_MXFP4 ? bf16_to_float(dh) : half_to_float(dh);
    if (xs) d *= static_cast<float>(static_cast<int8_t>(m.sc[(b * groups + g) * 16 + o]));
    for (int64_t i = 0; i < 32 && g * 32 + i < m.k; i++) {
      const int64_t quad = i / 4, lane = o * 4 + i % 4;
      const int index = (w[(g * 4 + quad / 2) * 64 + lane] >> (4 * (quad % 2))) & 15;
      out[g * 32 + i] = d * static_cast<float>((m.kind == WEIGHT_MXFP4 ? kMXFP4Values : kIQ4Values)[index]) * scale;
    }
  }
}

// row r of a q4 / q8 (or K-quant, or float) matrix, dequantized into out [k], times `scale`: the embedding
// of a grouped file, read from its blocks (a tied model's head), so that a lookup touches no other copy
inline void dequantize_row(const Matrix& m, int64_t r, float scale, float* out) {
  if (m.kind >= WEIGHT_Q4K && m.kind <= WEIGHT_Q6K) return dequantize_kquant_row(m, r, scale, out);
  if (m.kind == WEIGHT_Q3K || m.kind == WEIGHT_Q2K) return dequantize_low_row(m, r, scale, out);
  if (floating(m)) return float_row(m, r, scale, out);
  if (m.kind == WEIGHT_IQ4NL || m.kind == WEIGHT_IQ4XS || m.kind == WEIGHT_MXFP4) return dequantize_iq4_row(m, r, scale, out);
  const int64_t groups = m.kp / 32, b = r / 16, o = r % 16;
  const int quads = m.kind == WEIGHT_Q8 ? 8 : 4;
  const uint8_t* w = static_cast<const uint8_t*>(m.w) + b * groups * quads * 64;
  for (int64_t g = 0; g < groups; g++) {
    const int64_t at = (b * groups + g) * 16 + o;
    const float d = half_to_float(m.d[at]), mn = m.mins ? half_to_float(m.mins[at]) : 0.f;
    const int zero = m.mins ? 0 : (quads == 8 ? 128 : 8);
    for (int64_t i = 0; i < 32 && g * 32 + i < m.k; i++) {
      const int64_t quad = i / 4, lane = o * 4 + i % 4;
      const int code = quads == 8 ? w[(g * 8 + quad) * 64 + lane] : (w[(g * 4 + quad / 2) * 64 + lane] >> (4 * (quad % 2))) & 15;
      const float v = m.mins ? d * static_cast<float>(code) + mn : static_cast<float>(code - zero) * d;
      out[g * 32 + i] = v * scale;
    }
  }
}

// A row's softmax over its keys, a chunk (kChunk positions) at a time: the chunks' maxima m, sums s of e^(x - m)
// and weighted values o [hd] folded in order (`fold_chunk`), so that a row's bits are the same whether its chunks
// were attended by one task in turn (a prefill's tile, a short row) or by several tasks at once (a decode step's
// long row split over the team: step.h's Unit, `Step::attend_task` then `Step::fold_unit`).
struct Fold {
  float m, s;  // the max so far, the sum of e^(x - m)
  float* acc;  // [hd]: the values weighed by e^(x - m)
};

// fold a chunk's (mk, sk, ok) into f; a chunk the row has no key in (mk = -inf) changes nothing, and the first is
// taken as it is (a row of one chunk: its sums as one softmax gives them)
inline void fold_chunk(Fold& f, float mk, float sk, const float* ok, int64_t hd) {
  if (mk == -INFINITY) return;
  if (f.m == -INFINITY) {
    f.m = mk, f.s = sk;
    std::memcpy(f.acc, ok, hd * sizeof(float));
    return;
  }
  const float top = std::max(f.m, mk), a = std::exp(f.m - top), b = std::exp(mk - top);
  f.s = f.s * a + sk * b;
  for (int64_t i = 0; i < hd; i++) f.acc[i] = f.acc[i] * a + ok[i] * b;
  f.m = top;
}

// a folded row's output [hd]: its values over its sum (and a sink's term: gpt-oss; nullptr: none)
inline void finish_fold(const Fold& f, const float* sink, int64_t hd, float* out) {
  float inv = 1.f / f.s;
  if (sink) inv /= 1.f + inv * std::exp(*sink - f.m);  // 1 / (sum + e^(sink - max))
  for (int64_t i = 0; i < hd; i++) out[i] = f.acc[i] * inv;
}

// The first key a row that sees `length` keys reads, rounded down to its block of 16: with a window, the first of its
// last `window` keys; else 0. A tile reads from its first row's; the cache must hold keys from there on.
inline int64_t first_key(int64_t length, int64_t window) {
  return window ? std::max<int64_t>(0, length - window) / 16 * 16 : 0;
}

// The key chunks [c_lo, c_hi) of a tile of `positions` consecutive query positions x `heads` heads of one KV group
// (rows p * heads + h, at most kTileRows), the first position seeing `length` cached keys: q rows at
// q + p * ldq + h * hd; emit(k, r, m, s, o) gets chunk k's max, sum and weighted values o [hd] of each row r
// (m = -inf: the row has no key in it). K (transposed blocks) and V are read once for the tile's rows; they hold
// positions from `base` on (a multiple of 16, at most the first key a row reads). With a window, a row sees only
// its last `window` keys: the tile starts at the key block of its first row's first key. A row's weights outside
// its own keys are 0, and adding 0 * v leaves a sum's bits as they are: each row sums in the same order whatever
// the rows around it, so a prefill and the same tokens one at a time give the same bits.
// scratch: kTileRows * (2 hd + length + positions + 48) floats.
template <typename T, typename Emit>
void attend_chunks(const float* q, int64_t ldq, int64_t positions, int64_t heads, const T* kt, const T* v, int64_t base,
                   int64_t length, int64_t hd, int64_t window, float scale, float softcap, float* scratch, int64_t c_lo,
                   int64_t c_hi, Emit emit) {
  const int64_t rows = positions * heads, last = length + positions - 1;  // the last row's length
  const int64_t blocks = (last + 15) / 16, lds = blocks * 16 + 16;
  const int64_t u0 = first_key(length, window);
  float* qt = scratch;                       // [rows, hd]
  float* ot = scratch + kTileRows * hd;      // [rows, hd]
  float* scores = ot + kTileRows * hd;       // [rows, lds]
  for (int64_t p = 0; p < positions; p++) std::memcpy(qt + p * heads * hd, q + p * ldq, heads * hd * sizeof(float));
  static const float ones[kTileRows] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f};
  float top[kTileRows], sum[kTileRows];
  const int64_t lo = std::max(c_lo, u0 / kChunk), hi = std::min(c_hi, (last + kChunk - 1) / kChunk);
  for (int64_t k = lo; k < hi; k++) {
    const int64_t ua = std::max(u0, k * kChunk), ub = std::min(last, (k + 1) * kChunk);  // ua: a block's first key
    score_any<T>(rows, qt, kt + span<T>(ua - base, hd), (ub - ua + 15) / 16, hd, scores + ua, lds, scale);
    for (int64_t r = 0; r < rows; r++) {
      float* w = scores + r * lds;
      const int64_t own = length + r / heads, first = window ? std::max<int64_t>(0, own - window) : 0;
      const int64_t a = std::max(first, ua), b = std::min(own, ub);  // the row's keys in this chunk
      top[r] = -INFINITY, sum[r] = 0.f;
      if (a < b) {
        if (softcap > 0.f) softcap_row(w + a, b - a, softcap);
        sum[r] = softmax_row(w + a, b - a, &top[r]);
      }
      std::fill(w + ua, w + std::max(ua, std::min(a, ub)), 0.f);
      std::fill(w + std::max(ua, b), w + ub, 0.f);
    }
    weigh_any<T>(rows, scores + ua, lds, v + span<T>(ua - base, hd), ub - ua, hd, ones, ot);
    for (int64_t r = 0; r < rows; r++) emit(k, r, top[r], sum[r], ot + r * hd);
  }
}

// A tile's attention over all its keys (see attend_chunks), outputs at out + p * ldo + h * hd. `sinks` (gpt-oss;
// null: none): the heads' sink logits, each a term e^(sink - max) more in its rows' softmax denominator (a key of
// value 0). scratch: kTileRows * (3 hd + length + positions + 48) floats.
template <typename T>
void attend(const float* q, int64_t ldq, int64_t positions, int64_t heads, const T* kt, const T* v, int64_t base,
            int64_t length, int64_t hd, int64_t window, float scale, float softcap, float* scratch, float* out, int64_t ldo,
            const float* sinks = nullptr) {
  const int64_t rows = positions * heads;
  float* acc = scratch + static_cast<int64_t>(kTileRows) * (2 * hd + length + positions + 48);  // [rows, hd]
  Fold folds[kTileRows];
  for (int64_t r = 0; r < rows; r++) folds[r] = {-INFINITY, 0.f, acc + r * hd};
  attend_chunks<T>(q, ldq, positions, heads, kt, v, base, length, hd, window, scale, softcap, scratch, 0, INT64_MAX,
                   [&](int64_t, int64_t r, float m, float s, const float* o) { fold_chunk(folds[r], m, s, o, hd); });
  for (int64_t r = 0; r < rows; r++)
    finish_fold(folds[r], sinks ? sinks + r % heads : nullptr, hd, out + r / heads * ldo + r % heads * hd);
}

}  // namespace
