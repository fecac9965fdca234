// A GGUF tensor's raw blocks -> the kernel's layouts (project.h), every value as the file holds it:
// what weights/kquant_blocks.py does in numpy (its reference, which the tests hold this to), ~20x
// faster, so that a first start repacks a 1B model's blocks in about a second. Scalar code, blocks of
// 16 rows split over an OpenMP team: it runs once per file, the same in both builds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

enum { RAW_Q4_0 = 2, RAW_Q4_1 = 3, RAW_Q5_0 = 6, RAW_Q5_1 = 7, RAW_Q8_0 = 8, RAW_Q4_K = 12, RAW_Q5_K = 13, RAW_Q6_K = 14 };

inline uint16_t half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins
inline void scale_min(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; j++) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

struct Packed {  // the arrays one tensor (rows 0..n of a chunk) is packed into (padding zeroed by the caller)
  uint8_t* w;    // codes: q4 / K-quants [B][G][4][64], q8 [B][G][8][64]
  uint8_t* hi;   // Q5_K [B][G][64], Q6_K [B][G][2][64]
  uint16_t* d;   // q4 / q8 [B][G][16]; K-quants [B][SB][16]
  uint16_t* m;   // mins: Q4_1 / Q5_1 [B][G][16]; Q4_K / Q5_K dmin [B][SB][16]
  uint8_t* sc;   // Q4_K / Q5_K [B][G][16]; Q6_K [B][2G][16]
  uint8_t* sm;   // Q4_K / Q5_K [B][G][16]
};

// one output row's 32 codes of group `at` (= block * groups + group) into the codes and high bits: each
// byte gathers codes of this row and group only, so it is stored once (o: the row within its block)
inline void put_group(const Packed& p, int type, int64_t at, int64_t o, const uint8_t* c) {
  if (type == RAW_Q8_0 || type == RAW_Q5_0 || type == RAW_Q5_1) {
    for (int q = 0; q < 8; q++) std::memcpy(p.w + (at * 8 + q) * 64 + o * 4, c + 4 * q, 4);
    return;
  }
  for (int pair = 0; pair < 4; pair++)
    for (int t = 0; t < 4; t++)
      p.w[(at * 4 + pair) * 64 + o * 4 + t] = static_cast<uint8_t>((c[8 * pair + t] & 15) | ((c[8 * pair + 4 + t] & 15) << 4));
  if (type == RAW_Q5_K)
    for (int t = 0; t < 4; t++) {
      int bits = 0;
      for (int q = 0; q < 8; q++) bits |= ((c[4 * q + t] >> 4) & 1) << q;
      p.hi[at * 64 + o * 4 + t] = static_cast<uint8_t>(bits);
    }
  if (type == RAW_Q6_K)
    for (int v = 0; v < 2; v++)
      for (int t = 0; t < 4; t++) {
        int bits = 0;
        for (int j = 0; j < 4; j++) bits |= ((c[4 * (4 * v + j) + t] >> 4) & 3) << (2 * j);
        p.hi[(at * 2 + v) * 64 + o * 4 + t] = static_cast<uint8_t>(bits);
      }
}

// output row r (its raw bytes `row`) into p
inline void pack_row(int type, const uint8_t* row, int64_t r, int64_t k, int64_t block, const Packed& p) {
  const int64_t groups = k / 32, supers = k / 256;
  const bool kq = type == RAW_Q4_K || type == RAW_Q5_K || type == RAW_Q6_K;
  const int64_t b = r / 16, o = r % 16;
  if (!kq) {
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t* x = row + g * block;
      const int64_t at = (b * groups + g) * 16 + o;
      p.d[at] = half_at(x);
      if (type == RAW_Q4_1 || type == RAW_Q5_1) p.m[at] = half_at(x + 2);
      uint8_t c[32];
      if (type == RAW_Q8_0) {
        for (int i = 0; i < 32; i++) c[i] = static_cast<uint8_t>(static_cast<int>(static_cast<int8_t>(x[2 + i])) + 128);
      } else {
        const uint8_t* qs = x + (type == RAW_Q4_0 ? 2 : type == RAW_Q4_1 ? 4 : type == RAW_Q5_0 ? 6 : 8);
        uint32_t qh = 0;
        if (type == RAW_Q5_0 || type == RAW_Q5_1) std::memcpy(&qh, x + (type == RAW_Q5_0 ? 2 : 4), 4);
        const int zero = type == RAW_Q5_0 ? 112 : 0;  // the q8 kind's d (c - 128) = d (q - 16)
        for (int i = 0; i < 32; i++)
          c[i] = static_cast<uint8_t>((((qs[i % 16] >> (4 * (i / 16))) & 15) | (((qh >> i) & 1u) << 4)) + zero);
      }
      put_group(p, type, b * groups + g, o, c);
    }
    return;
  }
  for (int64_t s = 0; s < supers; s++) {
    const uint8_t* x = row + s * block;
    const int64_t at = (b * supers + s) * 16 + o;
    if (type == RAW_Q6_K) {
      const uint8_t *ql = x, *qh = x + 128, *scales = x + 192;
      p.d[at] = half_at(x + 208);
      for (int j = 0; j < 16; j++) p.sc[((b * groups + s * 8) * 2 + j) * 16 + o] = scales[j];
      uint8_t c[256];
      for (int j = 0; j < 256; j++) {
        const int h = j / 128, jj = j % 128;
        const int low = (ql[h * 64 + jj % 64] >> (4 * (jj / 64))) & 15;
        const int high = (qh[h * 32 + jj % 32] >> (2 * (jj / 32))) & 3;
        c[j] = static_cast<uint8_t>(low | (high << 4));
      }
      for (int g = 0; g < 8; g++) put_group(p, type, b * groups + s * 8 + g, o, c + 32 * g);
      continue;  // the next super-block
    }
    p.d[at] = half_at(x);
    p.m[at] = half_at(x + 2);
    uint8_t sc[8], mn[8];
    scale_min(x + 4, sc, mn);
    for (int j = 0; j < 8; j++) {
      p.sc[(b * groups + s * 8 + j) * 16 + o] = sc[j];
      p.sm[(b * groups + s * 8 + j) * 16 + o] = mn[j];
    }
    const uint8_t* qs = x + (type == RAW_Q5_K ? 48 : 16);
    uint8_t c[256];
    for (int j = 0; j < 256; j++) {
      int code = (qs[j / 64 * 32 + j % 32] >> (4 * (j % 64 / 32))) & 15;
      if (type == RAW_Q5_K) code |= ((x[16 + j % 32] >> (j / 32)) & 1) << 4;
      c[j] = static_cast<uint8_t>(code);
    }
    for (int g = 0; g < 8; g++) put_group(p, type, b * groups + s * 8 + g, o, c + 32 * g);
  }
}

// rows [n, row bytes] of `type` with k inputs -> p (see Packed); 0, or 1 for a type it does not pack
int pack_rows(int type, const uint8_t* raw, int64_t n, int64_t k, const Packed& p) {
  const bool kq = type == RAW_Q4_K || type == RAW_Q5_K || type == RAW_Q6_K;
  const int64_t block = type == RAW_Q4_0 ? 18 : type == RAW_Q4_1 ? 20 : type == RAW_Q5_0 ? 22 : type == RAW_Q5_1 ? 24
                      : type == RAW_Q8_0 ? 34 : type == RAW_Q4_K ? 144 : type == RAW_Q5_K ? 176 : type == RAW_Q6_K ? 210 : 0;
  if (!block) return 1;
  const int64_t row_bytes = (kq ? k / 256 : k / 32) * block;
#pragma omp parallel for schedule(static)  // blocks of 16 rows: each writes bytes of its own only
  for (int64_t b = 0; b < (n + 15) / 16; b++)
    for (int64_t r = b * 16; r < std::min(n, b * 16 + 16); r++) pack_row(type, raw + r * row_bytes, r, k, block, p);
  return 0;
}

}  // namespace
