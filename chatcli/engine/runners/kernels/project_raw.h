// A GGUF's Q4_K and Q6_K rows as the file holds them (WEIGHT_RAW_Q4K, WEIGHT_RAW_Q6K: w is row 0, row r at
// w + r * k / 256 * 144 or 210 bytes): a mixture's experts read from the GGUF's own pages at a first start, before
// a process of their own has repacked them (weights/gguf_experts.py, runners/native_experts.py).
//
// Each block of 16 rows is put into the packed kind's layout (project.h's K-quants) as a projection reaches it,
// then the packed kind's own code runs on it: the same int32 dots and the same fp32 sums in the same order, so
// the same bits as the repacked file. AVX-512: 16 bytes of each of the block's rows at a time, transposed in
// registers (raw_words: four rows a 128-bit lane); a decode step's one or two rows take the codes straight into
// their dots (raw_block), more rows read them unpacked from this thread's scratch (raw_unpack, then kquant_block's
// passes). A decode step's row takes 2.1x the repacked rows' time at Q4_K, 3.2x at Q6_K, 16 rows 1.3x
// (`python benchmarks/raw_rows.py`, AMD EPYC Zen 4, 2 threads, 2026-12-07): the transposes cost more than the
// bandwidth leaves. The other builds pack each block with pack.h's pack_row, correct and slower still: the loader
// leaves experts in the GGUF on AVX-512 only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"
#include "pack.h"

namespace {

constexpr int kRawRows = 2;  // rows up to which a block's codes go straight into the dots (raw_block), not to memory

inline bool raw_rows(const Matrix& m) {
  return m.kind == WEIGHT_RAW_Q4K || m.kind == WEIGHT_RAW_Q6K || m.kind == WEIGHT_RAW_MXFP4;
}

// the packed kind a raw one is read as, and the GGUF block type its rows hold
inline int raw_packed_kind(const Matrix& m) {
  return m.kind == WEIGHT_RAW_Q4K ? WEIGHT_Q4K : m.kind == WEIGHT_RAW_Q6K ? WEIGHT_Q6K : WEIGHT_MXFP4;
}
inline int raw_ggml_type(const Matrix& m) {
  return m.kind == WEIGHT_RAW_Q4K ? RAW_Q4_K : m.kind == WEIGHT_RAW_Q6K ? RAW_Q6_K : RAW_MXFP4;
}
inline int64_t raw_row_bytes(const Matrix& m) {
  const int type = raw_ggml_type(m);
  return m.kp / raw_block_inputs(type) * raw_block_bytes(type);
}

// One block of 16 rows in the packed kind's arrays (a thread's own, kept for its next blocks): `m` the packed
// Matrix of those rows (block 0 of it), `codes` their codes unpacked (AVX-512) or null (in m.w and m.hi)
struct RawBlock {
  Matrix m;
  const uint8_t* codes;
};

// this thread's arrays for a block of `m` (codes unpacked [groups][512] on AVX-512, else packed w and hi; d, mins
// [supers][16]; sc, sm), each written whole by raw_unpack before it is read
inline RawBlock raw_arrays(const Matrix& m, int64_t b) {
  thread_local std::vector<uint8_t> buffer;
  const bool k6 = m.kind == WEIGHT_RAW_Q6K, mx = m.kind == WEIGHT_RAW_MXFP4;
  const int64_t groups = m.kp / 32, supers = mx ? groups : m.kp / 256;  // MXFP4: its scale (d) per group
#if defined(__AVX512F__)
  const int64_t code_bytes = groups * 512, hi_bytes = 0;
#else
  const int64_t code_bytes = groups * 256, hi_bytes = k6 ? groups * 128 : 0;
#endif
  const int64_t scale_bytes = mx ? 0 : groups * 16 * (k6 ? 2 : 1), min_bytes = k6 || mx ? 0 : groups * 16;
  const int64_t total = code_bytes + hi_bytes + 2 * supers * 16 * 2 + scale_bytes + min_bytes + 64;
  if (static_cast<int64_t>(buffer.size()) < total + 64) buffer.resize(total + 64);
  uint8_t* at = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) / 64 * 64);
  uint8_t* codes = at;
  uint8_t* hi = codes + code_bytes;
  uint16_t* d = reinterpret_cast<uint16_t*>(hi + hi_bytes);
  uint16_t* mins = d + supers * 16;
  uint8_t* sc = reinterpret_cast<uint8_t*>(mins + supers * 16);
  uint8_t* sm = sc + scale_bytes;
  Matrix pm{};
  pm.kind = raw_packed_kind(m);
  pm.n = std::min<int64_t>(16, m.n - b * 16);
  pm.k = m.k, pm.kp = m.kp;
  pm.w = codes, pm.d = d, pm.mins = k6 || mx ? nullptr : mins, pm.sc = mx ? nullptr : sc, pm.sm = k6 || mx ? nullptr : sm;
  pm.hi = hi_bytes ? hi : nullptr;
  return {pm, codes};
}

#if defined(__AVX512F__)
// The vectors below hold 16 rows a lane each, not in order: lane 4 L + p holds row 4 p + L (a 4 x 4 transpose
// within each 128-bit lane puts them so); row_order()'s lane i is row i's lane (the same map both ways)
inline __m512i row_order() { return _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); }

// The words at `offset` of the block's rows, 16 bytes of each (rows past n: the last row's again): v[u] lane
// 4 L + p holds word u of row 4 p + L's bytes
inline void raw_words(const uint8_t* const (&row)[16], int64_t offset, __m512i (&v)[4]) {
  __m512i p[4];
  for (int m = 0; m < 4; m++) {
    __m512i x = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[4 * m] + offset)));
    for (int l = 1; l < 4; l++)
      x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[4 * m + l] + offset)), l);
    p[m] = x;
  }
  const __m512i t0 = _mm512_unpacklo_epi32(p[0], p[1]), t1 = _mm512_unpackhi_epi32(p[0], p[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(p[2], p[3]), t3 = _mm512_unpackhi_epi32(p[2], p[3]);
  v[0] = _mm512_unpacklo_epi64(t0, t2), v[1] = _mm512_unpackhi_epi64(t0, t2);
  v[2] = _mm512_unpacklo_epi64(t1, t3), v[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Super-block s of the block's rows, its scales and codes as the packed kind holds them but lanes in raw_words'
// order: d (and dmin) as fp16 words into d[16] (and dmin[16]), the scales (and mins) of its groups into sc and sm
// at their packed places (sc + (s 8 + g) 16, Q6_K: sc + (s 16 + e) 16); then its groups in order, a few at a
// time: quad(g, q, c) with c[i] group g + i's codes of quad q (inputs 4 q..4 q + 3), for q 0..7, then done(g, n)
template <int kKind, typename Quad, typename Done>
inline void raw_super(const uint8_t* const (&row)[16], int64_t s, uint16_t* d, uint16_t* dmin, uint8_t* sc, uint8_t* sm,
                      Quad quad, Done done) {
  const __m512i low4 = _mm512_set1_epi32(0x0F0F0F0F), low2 = _mm512_set1_epi32(0x03030303);
  const __m512i six = _mm512_set1_epi32(63), four = _mm512_set1_epi32(15), byte = _mm512_set1_epi32(0xFF);
  const auto put_bytes = [](uint8_t* to, __m512i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(to), _mm512_cvtepi32_epi8(v)); };
  const auto at = [](__m512i v, int shift) { return _mm512_srli_epi32(v, shift); };
  __m512i v[4];
  if constexpr (kKind == WEIGHT_Q6K) {  // ql[128] | qh[64] | scales[16] | d: code i of group g from ql[g/4*64 + g%2*32 + i] nibble g%4/2, qh bits g%4
    const int64_t x = s * 210;
    for (int lane = 0; lane < 16; lane++) d[lane] = half_at(row[4 * (lane % 4) + lane / 4] + x + 208);
    raw_words(row, x + 192, v);
    for (int t = 0; t < 4; t++)
      for (int e = 0; e < 4; e++) put_bytes(sc + (s * 16 + 4 * t + e) * 16, _mm512_and_si512(at(v[t], 8 * e), byte));
    for (int h = 0; h < 2; h++) {
      for (int half = 0; half < 2; half++) {
        __m512i a[4], b[4], hq[4];
        raw_words(row, x + h * 64 + 16 * half, a);
        raw_words(row, x + h * 64 + 32 + 16 * half, b);
        raw_words(row, x + 128 + h * 32 + 16 * half, hq);
        for (int u = 0; u < 4; u++) {
          const auto top = [&](int shift) { return _mm512_slli_epi32(_mm512_and_si512(at(hq[u], shift), low2), 4); };
          const __m512i c[4] = {_mm512_or_si512(_mm512_and_si512(a[u], low4), top(0)),
                                _mm512_or_si512(_mm512_and_si512(b[u], low4), top(2)),
                                _mm512_or_si512(_mm512_and_si512(at(a[u], 4), low4), top(4)),
                                _mm512_or_si512(_mm512_and_si512(at(b[u], 4), low4), top(6))};
          quad(s * 8 + h * 4, 4 * half + u, c);
        }
      }
      done(s * 8 + h * 4, 4);
    }
    return;
  }
  // d | dmin | scales[12] (6-bit scales and mins of 8 groups) | qs[128]: code i of group g at qs[g/2*32 + i] nibble g%2
  const int64_t x = s * 144;
  raw_words(row, x, v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm512_cvtepi32_epi16(v[0]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dmin), _mm512_cvtepi32_epi16(at(v[0], 16)));
  for (int j = 0; j < 4; j++) {  // get_scale_min_k4: j < 4 from the low 6 bits; j >= 4 from nibbles and top bits
    put_bytes(sc + (s * 8 + j) * 16, _mm512_and_si512(at(v[1], 8 * j), six));
    put_bytes(sm + (s * 8 + j) * 16, _mm512_and_si512(at(v[2], 8 * j), six));
    const __m512i top_sc = _mm512_slli_epi32(_mm512_and_si512(at(v[1], 8 * j + 6), _mm512_set1_epi32(3)), 4);
    const __m512i top_m = _mm512_slli_epi32(_mm512_and_si512(at(v[2], 8 * j + 6), _mm512_set1_epi32(3)), 4);
    put_bytes(sc + (s * 8 + 4 + j) * 16, _mm512_or_si512(_mm512_and_si512(at(v[3], 8 * j), four), top_sc));
    put_bytes(sm + (s * 8 + 4 + j) * 16, _mm512_or_si512(_mm512_and_si512(at(v[3], 8 * j + 4), four), top_m));
  }
  for (int pair = 0; pair < 4; pair++) {
    for (int half = 0; half < 2; half++) {
      raw_words(row, x + 16 + pair * 32 + 16 * half, v);
      for (int u = 0; u < 4; u++) {
        const __m512i c[2] = {_mm512_and_si512(v[u], low4), _mm512_and_si512(at(v[u], 4), low4)};
        quad(s * 8 + 2 * pair, 4 * half + u, c);
      }
    }
    done(s * 8 + 2 * pair, 2);
  }
}

// the block's 16 row pointers (rows past n: the last row, whose lanes are never stored)
inline void raw_row_pointers(const Matrix& m, int64_t b, const uint8_t* (&row)[16]) {
  const int64_t row_bytes = raw_row_bytes(m);
  for (int o = 0; o < 16; o++)
    row[o] = static_cast<const uint8_t*>(m.w) + std::min(b * 16 + o, m.n - 1) * row_bytes;
}

// super-block s's d (and dmin) as raw_super left them, into the packed arrays' row order at dp (and mp), and its
// scales (and mins) at their packed places in sc (and sm) put into row order in place
template <int kKind>
inline void raw_super_in_order(int64_t s, const uint16_t* d, const uint16_t* dmin, uint16_t* dp, uint16_t* mp,
                               uint8_t* sc, uint8_t* sm) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kEntries = k6 ? 16 : 8;  // scales a super-block holds
  const __m512i order = row_order();
  const auto in_order = [&](uint8_t* at) {  // 16 bytes in lane order -> row order, in place
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(at), _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(order, _mm512_cvtepu8_epi32(v))));
  };
  const auto halves = [&](const uint16_t* from, uint16_t* to) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), _mm512_cvtepi32_epi16(_mm512_permutexvar_epi32(order, v)));
  };
  halves(d, dp);
  if constexpr (!k6) halves(dmin, mp);
  for (int e = 0; e < kEntries; e++) in_order(sc + (s * kEntries + e) * 16);
  if constexpr (!k6)
    for (int e = 0; e < 8; e++) in_order(sm + (s * 8 + e) * 16);
}

// block b of a raw matrix into `out` (raw_arrays'): every super-block's d (and dmin), scales (and mins) and codes
// in row order, as pack_row and unpack_group would leave them
template <int kKind>
inline void raw_unpack(const Matrix& m, int64_t b, const RawBlock& out) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  const uint8_t* row[16];
  raw_row_pointers(m, b, row);
  const __m512i order = row_order();
  uint8_t* codes = const_cast<uint8_t*>(out.codes);
  uint8_t* sc = const_cast<uint8_t*>(out.m.sc);
  uint8_t* sm = const_cast<uint8_t*>(out.m.sm);
  alignas(64) uint16_t d[16], dmin[16];
  for (int64_t s = 0; s < m.kp / 256; s++) {
    raw_super<kKind>(
        row, s, d, dmin, sc, sm,
        [&](int64_t g, int q, const __m512i* c) {
          for (int i = 0; i < (k6 ? 4 : 2); i++) _mm512_store_si512(codes + ((g + i) * 8 + q) * 64, _mm512_permutexvar_epi32(order, c[i]));
        },
        [](int64_t, int) {});
    uint16_t* mins = k6 ? nullptr : const_cast<uint16_t*>(out.m.mins) + s * 16;
    raw_super_in_order<kKind>(s, d, dmin, const_cast<uint16_t*>(out.m.d) + s * 16, mins, sc, sm);
  }
}

// y[s, 16 b..16 b + 16) for rows s0..s0+R of a raw matrix, its codes taken from the rows as they are read (a decode
// step's few rows: no block unpacked to memory first); project.h's kquant_block's dots and sums, lanes in
// raw_words' order until the store
template <int R, int kKind>
void raw_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kGroups = k6 ? 4 : 2, kScales = k6 ? 2 : 1;  // groups a raw_super batch, scales a group
  const int64_t groups = m.kp / 32;
  const uint8_t* row[16];
  raw_row_pointers(m, b, row);
  thread_local std::vector<uint8_t> scales;  // this block's, at their packed places
  if (static_cast<int64_t>(scales.size()) < groups * 32 * 2) scales.resize(groups * 32 * 2);
  uint8_t* sc = scales.data();
  uint8_t* sm = sc + groups * 32;
  alignas(64) uint16_t d16[16], dmin16[16];
  __m512 sum[R];
  for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_ps();
  __m512i acc[R][kGroups][kScales];
  const int64_t supers = m.kp / 256, span = 16 * raw_row_bytes(m), share = (span / supers + 63) / 64 * 64;
  const uint8_t* next = static_cast<const uint8_t*>(m.w) + (b + 1) * span;  // the next block's rows, in order
  for (int64_t s = 0; s < supers; s++) {
    for (int64_t at = s * share; at < std::min(span, (s + 1) * share); at += 64) __builtin_prefetch(next + at, 0, 3);
    __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
    bool scaled = false;
    raw_super<kKind>(
        row, s, d16, dmin16, sc, sm,
        [&](int64_t g, int q, const __m512i* c) {
          if (q == 0)
            for (int r = 0; r < R; r++)
              for (int i = 0; i < kGroups; i++)
                for (int h = 0; h < kScales; h++) acc[r][i][h] = _mm512_setzero_si512();
          for (int r = 0; r < R; r++) {
            const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp);
            for (int i = 0; i < kGroups; i++)
              acc[r][i][k6 ? q / 4 : 0] = _mm512_dpbusd_epi32(acc[r][i][k6 ? q / 4 : 0], c[i], _mm512_set1_epi32(xr[(g + i) * 8 + q]));
          }
        },
        [&](int64_t g, int n) {
          if (!scaled) {
            d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d16)));
            if constexpr (!k6) dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dmin16)));
            scaled = true;
          }
          for (int i = 0; i < n; i++)
            kquant_sums<R, k6>(sum, in, s0, g + i, groups, d, dmin, sc, sm, [&](int r, int h) { return acc[r][i][h]; });
        });
  }
  const __m512i order = row_order();
  for (int r = 0; r < R; r++) sum[r] = _mm512_permutexvar_ps(order, sum[r]);
  store_block<R>(sum, m, b, s0, y, ldy, accumulate);
}

// pack.h's pack_rows for Q4_K and Q6_K rows of whole super-blocks (a lean file's conversion, the experts' repacking):
// each whole block of 16 rows at once through raw_super's transposes, a last block of fewer rows row by row
// (pack_row, its padding left as the caller zeroed it); the same bytes. False where it does not apply.
inline bool pack_kquant_rows(int type, const uint8_t* raw, int64_t n, int64_t k, const Packed& p) {
  if ((type != RAW_Q4_K && type != RAW_Q6_K) || k % 256) return false;
  const bool k6 = type == RAW_Q6_K;
  const int64_t block = raw_block_bytes(type), row_bytes = k / 256 * block, groups = k / 32, supers = k / 256;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < (n + 15) / 16; b++) {
    if (b * 16 + 16 > n) {
      for (int64_t r = b * 16; r < n; r++) pack_row(type, raw + r * row_bytes, r, k, block, p);
      continue;
    }
    const uint8_t* row[16];
    for (int o = 0; o < 16; o++) row[o] = raw + (b * 16 + o) * row_bytes;
    const __m512i order = row_order(), low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    uint8_t* sc = p.sc + b * groups * 16 * (k6 ? 2 : 1);
    uint8_t* sm = k6 ? nullptr : p.sm + b * groups * 16;
    alignas(64) uint16_t d[16], dmin[16];
    __m512i held[4], high[4];
    const auto quad = [&](int64_t g, int q, const __m512i* c) {  // codes of quads 2j and 2j + 1 share a byte
      for (int i = 0; i < (k6 ? 4 : 2); i++) {
        const __m512i code = _mm512_permutexvar_epi32(order, c[i]);
        const int64_t at = b * groups + g + i;
        if (q % 2 == 0) {
          held[i] = code;
        } else {
          const __m512i pair = _mm512_or_si512(_mm512_and_si512(held[i], low4),
                                               _mm512_slli_epi32(_mm512_and_si512(code, low4), 4));
          _mm512_storeu_si512(p.w + (at * 4 + q / 2) * 64, pair);
        }
        if (!k6) continue;  // Q6_K: quad q's 5th and 6th bits at bits 2 (q % 4) of hi vector q / 4
        const __m512i bits = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(code, 4), low2), 2 * (q % 4));
        high[i] = q % 4 == 0 ? bits : _mm512_or_si512(high[i], bits);
        if (q % 4 == 3) _mm512_storeu_si512(p.hi + (at * 2 + q / 4) * 64, high[i]);
      }
    };
    for (int64_t s = 0; s < supers; s++) {
      const int64_t at = (b * supers + s) * 16;
      if (k6) {
        raw_super<WEIGHT_Q6K>(row, s, d, dmin, sc, sm, quad, [](int64_t, int) {});
        raw_super_in_order<WEIGHT_Q6K>(s, d, dmin, p.d + at, nullptr, sc, sm);
      } else {
        raw_super<WEIGHT_Q4K>(row, s, d, dmin, sc, sm, quad, [](int64_t, int) {});
        raw_super_in_order<WEIGHT_Q4K>(s, d, dmin, p.d + at, p.m + at, sc, sm);
      }
    }
  }
  return true;
}

// y[s, 16 b..16 b + 16) for rows s0..s0+R of a raw MXFP4 matrix (17 bytes a group of 32: its E8M0 scale, then code i
// in qs[i % 16]'s nibble i / 16): project_iq4.h's iq4_block's dots and sums on codes taken straight from the rows, for
// any number of rows (one transpose a group serves them all), lanes in raw_words' order until the store
template <int R>
void raw_mxfp4_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t groups = m.kp / 32, halves = m.kp / 16;
  const uint8_t* row[16];
  raw_row_pointers(m, b, row);
  alignas(16) uint8_t shifted[16], e[16];
  for (int i = 0; i < 16; i++) shifted[i] = static_cast<uint8_t>(kMXFP4Values[i] + 128);
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(shifted)));
  const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi32(2), one = _mm512_set1_epi32(1);
  const int64_t span = 16 * raw_row_bytes(m), share = (span / groups + 63) / 64 * 64;
  const uint8_t* next = static_cast<const uint8_t*>(m.w) + (b + 1) * span;  // the next block's rows, in order
  __m512 sum[R];
  for (int r = 0; r < R; r++) sum[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; g++) {
    for (int64_t at = g * share; at < std::min(span, (g + 1) * share); at += 64) __builtin_prefetch(next + at, 0, 3);
    for (int lane = 0; lane < 16; lane++) e[lane] = row[4 * (lane % 4) + lane / 4][g * 17];
    // d as pack.h's e8m0_half_bf16 makes it (e < 2: 0x20 << e, else (e - 1) << 7), a bf16 put in fp32's top half
    const __m512i ev = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(e)));
    const __m512i bits = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(ev, two),
                                                 _mm512_slli_epi32(_mm512_sub_epi32(ev, one), 7),
                                                 _mm512_sllv_epi32(_mm512_set1_epi32(0x20), ev));
    const __m512 d = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
    __m512i v[4];
    raw_words(row, g * 17 + 1, v);
    __m512i acc[R];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
    for (int u = 0; u < 4; u++) {  // quad u in the low nibbles, u + 4 in the high ones
      const __m512i c0 = _mm512_shuffle_epi8(table, _mm512_and_si512(v[u], nibble));
      const __m512i c1 = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v[u], 4), nibble));
      for (int r = 0; r < R; r++) {
        const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp) + g * 8;
        acc[r] = _mm512_dpbusd_epi32(acc[r], c0, _mm512_set1_epi32(xr[u]));
        acc[r] = _mm512_dpbusd_epi32(acc[r], c1, _mm512_set1_epi32(xr[u + 4]));
      }
    }
    for (int r = 0; r < R; r++) {
      const int64_t s = s0 + r;
      const int32_t* hs = in.hsum + s * halves + 2 * g;
      const __m512i dot = _mm512_sub_epi32(acc[r], _mm512_set1_epi32(128 * (hs[0] + hs[1])));
      sum[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(in.gs[s * groups + g])), _mm512_cvtepi32_ps(dot), sum[r]);
    }
  }
  const __m512i order = row_order();
  for (int r = 0; r < R; r++) sum[r] = _mm512_permutexvar_ps(order, sum[r]);
  store_block<R>(sum, m, b, s0, y, ldy, accumulate);
}
#else
// block b of a raw matrix into `out` (raw_arrays'), packed row by row as the repacked file holds it
template <int kKind>
inline void raw_unpack(const Matrix& m, int64_t b, const RawBlock& out) {
  const int64_t row_bytes = raw_row_bytes(m);
  const Packed p{const_cast<uint8_t*>(out.codes), const_cast<uint8_t*>(out.m.hi), const_cast<uint16_t*>(out.m.d), const_cast<uint16_t*>(out.m.mins),
                 const_cast<uint8_t*>(out.m.sc), const_cast<uint8_t*>(out.m.sm)};
  const uint8_t* base = static_cast<const uint8_t*>(m.w) + b * 16 * row_bytes;
  for (int64_t o = 0; o < out.m.n; o++) pack_row(raw_ggml_type(m), base + o * row_bytes, o, m.k, raw_block_bytes(raw_ggml_type(m)), p);
}
#endif

// y [S, n] (+= with accumulate) of a raw matrix: blocks(pass, units, work) gives work(b, first, count) each block b
// and run of rows (whole passes) its caller takes (split_blocks over a team, or moe.h's project_item's units); each
// block is made once for its rows, then read by the packed kind's passes
template <typename Blocks>
void raw_passes(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate, Blocks blocks) {
  const auto run = [&](auto kind) {
    constexpr int kKind = decltype(kind)::value;
    blocks(std::integral_constant<int, kRowsPerPass>{}, (m.n + 15) / 16, [&](int64_t b, int64_t first, int64_t count) {
#if defined(__AVX512F__)
      if (count <= kRawRows) {  // a decode step's: the codes straight from the rows into the dots
        Rows part = in;
        part.count = count;
        each_row_pass<kRawRows>(part, [&](auto rows, int64_t s) {
          raw_block<decltype(rows)::value, kKind>(m, b, in, first + s, y, ldy, accumulate);
        });
        return;
      }
#endif
      const RawBlock block = raw_arrays(m, b);
      raw_unpack<kKind>(m, b, block);
      Rows part = in;
      part.count = count;
      each_row_pass<kRowsPerPass>(part, [&](auto rows, int64_t s) {
        constexpr int R = decltype(rows)::value;
#if defined(__AVX512F__)
        kquant_block<R, kKind, true>(block.m, 0, in, first + s, y + b * 16, ldy, accumulate, block.codes);
#else
        kquant_block<R, kKind>(block.m, 0, in, first + s, y + b * 16, ldy, accumulate);
#endif
      });
    });
  };
  if (m.kind == WEIGHT_RAW_MXFP4) {
    blocks(std::integral_constant<int, kRowsPerPass>{}, (m.n + 15) / 16, [&](int64_t b, int64_t first, int64_t count) {
      Rows part = in;
      part.count = count;
#if defined(__AVX512F__)
      each_row_pass<kRowsPerPass>(part, [&](auto rows, int64_t s) {
        raw_mxfp4_block<decltype(rows)::value>(m, b, in, first + s, y, ldy, accumulate);
      });
#else
      const RawBlock block = raw_arrays(m, b);
      raw_unpack<WEIGHT_MXFP4>(m, b, block);
      each_row_pass<kRowsPerPass>(part, [&](auto rows, int64_t s) {
        iq4_block<decltype(rows)::value, WEIGHT_MXFP4>(block.m, 0, in, first + s, y + b * 16, ldy, accumulate);
      });
#endif
    });
  } else if (m.kind == WEIGHT_RAW_Q4K) {
    run(std::integral_constant<int, WEIGHT_Q4K>{});
  } else {
    run(std::integral_constant<int, WEIGHT_Q6K>{});
  }
}

}  // namespace
