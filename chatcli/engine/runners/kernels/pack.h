// A GGUF tensor's raw blocks -> the kernel's layouts (project*.h), every value as the file holds it:
// what weights/kquant_blocks.py does in numpy (its reference, which the tests hold this to), ~20x
// faster, so that a first start repacks a 1B model's blocks in about a second. Scalar code, four bytes at a
// time where a type's codes are whole nibbles or bytes, blocks of 16 rows split over an OpenMP team: it runs
// once per file, the same in both builds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

enum { RAW_F32 = 0, RAW_F16 = 1, RAW_Q4_0 = 2, RAW_Q4_1 = 3, RAW_Q5_0 = 6, RAW_Q5_1 = 7, RAW_Q8_0 = 8, RAW_Q2_K = 10,
       RAW_Q3_K = 11, RAW_Q4_K = 12, RAW_Q5_K = 13, RAW_Q6_K = 14, RAW_IQ4_NL = 20, RAW_IQ4_XS = 23, RAW_BF16 = 30,
       RAW_MXFP4 = 39 };

// a type's bytes a block (of 32 inputs, 256 for the K-quants and IQ4_XS, one for the floats); 0 for a type
// the kernel does not pack
inline int64_t raw_block_bytes(int type) {
  switch (type) {
    case RAW_F32: return 4;
    case RAW_F16: return 2;
    case RAW_BF16: return 2;
    case RAW_Q4_0: return 18;
    case RAW_Q4_1: return 20;
    case RAW_Q5_0: return 22;
    case RAW_Q5_1: return 24;
    case RAW_Q8_0: return 34;
    case RAW_IQ4_NL: return 18;
    case RAW_IQ4_XS: return 136;
    case RAW_MXFP4: return 17;
    case RAW_Q2_K: return 84;
    case RAW_Q3_K: return 110;
    case RAW_Q4_K: return 144;
    case RAW_Q5_K: return 176;
    case RAW_Q6_K: return 210;
    default: return 0;
  }
}

inline bool raw_kquant(int type) { return type >= RAW_Q2_K && type <= RAW_Q6_K; }
inline bool raw_float(int type) { return type == RAW_F32 || type == RAW_F16 || type == RAW_BF16; }

// super-blocks of 256 inputs: the K-quants and IQ4_XS
inline bool raw_super(int type) { return raw_kquant(type) || type == RAW_IQ4_XS; }

// inputs a block of the type holds
inline int64_t raw_block_inputs(int type) { return raw_float(type) ? 1 : raw_super(type) ? 256 : 32; }

// MXFP4's E8M0 scale byte e as the bf16 of d = 2^(e - 128) (llama.cpp's half of the scale): exact, e = 0 and 1
// the float's subnormals 2^-128 and 2^-127
inline uint16_t e8m0_half_bf16(uint8_t e) { return static_cast<uint16_t>(e < 2 ? 0x0020u << e : (e - 1u) << 7); }

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
  uint8_t* w;    // codes: q4 / K-quants [B][G][4][64], q8 [B][G][8][64], Q3_K / Q2_K [B][G][2][64]; floats [B][k][16]
  uint8_t* hi;   // Q5_K / Q3_K [B][G][64], Q6_K [B][G][2][64]
  uint16_t* d;   // q4 / q8 / IQ4_NL [B][G][16]; K-quants / IQ4_XS [B][SB][16]
  uint16_t* m;   // mins: Q4_1 / Q5_1 [B][G][16]; Q4_K / Q5_K / Q2_K dmin [B][SB][16]
  uint8_t* sc;   // Q4_K / Q5_K / IQ4_XS [B][G][16]; Q6_K [B][2G][16]; Q3_K / Q2_K [B][G][16][2]
  uint8_t* sm;   // Q4_K / Q5_K [B][G][16]
};

// Q3_K / Q2_K: one output row's 32 codes of group `at` into 2-bit planes (and Q3_K's third bits), as put_group
inline void put_low_group(const Packed& p, bool q3, int64_t at, int64_t o, const uint8_t* c) {
  for (int v = 0; v < 2; v++)
    for (int t = 0; t < 4; t++) {
      int bits = 0;
      for (int j = 0; j < 4; j++) bits |= (c[4 * (4 * v + j) + t] & 3) << (2 * j);
      p.w[(at * 2 + v) * 64 + o * 4 + t] = static_cast<uint8_t>(bits);
    }
  if (q3)
    for (int t = 0; t < 4; t++) {
      int bits = 0;
      for (int q = 0; q < 8; q++) bits |= ((c[4 * q + t] >> 2) & 1) << q;
      p.hi[at * 64 + o * 4 + t] = static_cast<uint8_t>(bits);
    }
}

// Q3_K / Q2_K: super-block s (its raw bytes x) of output row o of block b into p
inline void pack_low(int type, const uint8_t* x, int64_t b, int64_t o, int64_t s, int64_t groups, int64_t supers,
                     const Packed& p) {
  const bool q3 = type == RAW_Q3_K;
  const int64_t at = (b * supers + s) * 16 + o;
  const uint8_t* qs = x + (q3 ? 32 : 16);  // Q3_K: hmask[32] | qs[64] | scales[12] | d; Q2_K: scales[16] | qs[64] | d | dmin
  uint8_t c[256], sc[16];
  for (int j = 0; j < 256; j++) {
    const int jj = j % 128;
    int code = (qs[j / 128 * 32 + jj % 32] >> (2 * (jj / 32))) & 3;
    if (q3) code |= ((x[j % 32] >> (j / 32)) & 1) << 2;
    c[j] = static_cast<uint8_t>(code);
  }
  if (q3) {
    p.d[at] = half_at(x + 108);
    for (int j = 0; j < 16; j++) {  // 6 bits: the low 4 in bytes 0..7, the high 2 in bytes 8..11
      const int low = (x[96 + j % 8] >> (4 * (j / 8))) & 15, top = (x[104 + j % 4] >> (2 * (j / 4))) & 3;
      sc[j] = static_cast<uint8_t>(static_cast<int8_t>((low | (top << 4)) - 32));
    }
  } else {
    p.d[at] = half_at(x + 80);
    p.m[at] = half_at(x + 82);
    std::memcpy(sc, x, 16);
  }
  for (int j = 0; j < 16; j++) p.sc[((b * groups + s * 8 + j / 2) * 16 + o) * 2 + j % 2] = sc[j];
  for (int g = 0; g < 8; g++) put_low_group(p, q3, b * groups + s * 8 + g, o, c + 32 * g);
}

inline uint32_t word_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline void put_word(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// one output row's 4-bit codes of group `at`, nibble `shift` (0 or 4) of q[0..31], into the codes as
// put_group pairs them (code t low, code 4 + t high), four bytes at a time: the K-quants' fast path
inline void put_nibbles(const Packed& p, int64_t at, int64_t o, const uint8_t* q, int shift) {
  for (int pair = 0; pair < 4; pair++) {
    const uint32_t lo = (word_at(q + 8 * pair) >> shift) & 0x0F0F0F0Fu, up = (word_at(q + 8 * pair + 4) >> shift) & 0x0F0F0F0Fu;
    put_word(p.w + (at * 4 + pair) * 64 + o * 4, lo | (up << 4));
  }
}

// one output row's 32 codes of group `at` (= block * groups + group) into the codes (q4 / q8 kinds and
// IQ4s; the K-quants go four bytes at a time, put_nibbles): each byte gathers codes of this row and group only, so it is stored once (o: the row within its block)
inline void put_group(const Packed& p, int type, int64_t at, int64_t o, const uint8_t* c) {
  if (type == RAW_Q8_0 || type == RAW_Q5_0 || type == RAW_Q5_1) {
    for (int q = 0; q < 8; q++) std::memcpy(p.w + (at * 8 + q) * 64 + o * 4, c + 4 * q, 4);
    return;
  }
  for (int pair = 0; pair < 4; pair++)
    for (int t = 0; t < 4; t++)
      p.w[(at * 4 + pair) * 64 + o * 4 + t] = static_cast<uint8_t>((c[8 * pair + t] & 15) | ((c[8 * pair + 4 + t] & 15) << 4));
}

// Q4_0 / Q4_1 / IQ4_NL / MXFP4: one output row's group `at` from its 16 bytes of nibbles (code i: qs[i % 16],
// nibble i / 16) into the codes as put_group pairs them, four bytes at a time (the same bytes as put_group)
inline void put_nibble_group(const Packed& p, int64_t at, int64_t o, const uint8_t* qs) {
  for (int pair = 0; pair < 4; pair++) {
    const uint8_t* q = qs + 8 * (pair % 2);
    const int shift = 4 * (pair / 2);
    const uint32_t lo = (word_at(q) >> shift) & 0x0F0F0F0Fu, up = (word_at(q + 4) >> shift) & 0x0F0F0F0Fu;
    put_word(p.w + (at * 4 + pair) * 64 + o * 4, lo | (up << 4));
  }
}

inline bool raw_nibbles(int type) {  // 32 four-bit codes a block, nothing else to them
  return type == RAW_Q4_0 || type == RAW_Q4_1 || type == RAW_IQ4_NL || type == RAW_MXFP4;
}

// a float row's k elements of kBytes each into every 16th slot from dst
template <int kBytes>
inline void place_elements(uint8_t* dst, const uint8_t* row, int64_t k) {
  for (int64_t i = 0; i < k; i++) std::memcpy(dst + i * 16 * kBytes, row + i * kBytes, kBytes);
}

// output row r (its raw bytes `row`) into p
inline void pack_row(int type, const uint8_t* row, int64_t r, int64_t k, int64_t block, const Packed& p) {
  const int64_t groups = k / 32, supers = k / 256;
  const int64_t b = r / 16, o = r % 16;
  if (raw_float(type)) {  // F32 / F16 / BF16: each element as it is, input i of the block's 16 outputs side by side
    if (block == 4)
      place_elements<4>(p.w + (b * k * 16 + o) * 4, row, k);
    else
      place_elements<2>(p.w + (b * k * 16 + o) * 2, row, k);
    return;
  }
  if (!raw_super(type)) {
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t* x = row + g * block;
      const int64_t at = (b * groups + g) * 16 + o;
      p.d[at] = type == RAW_MXFP4 ? e8m0_half_bf16(x[0]) : half_at(x);
      if (type == RAW_Q4_1 || type == RAW_Q5_1) p.m[at] = half_at(x + 2);
      if (raw_nibbles(type)) {  // the fast path: no code taken apart
        put_nibble_group(p, b * groups + g, o, x + (type == RAW_MXFP4 ? 1 : type == RAW_Q4_1 ? 4 : 2));
        continue;
      }
      if (type == RAW_Q8_0) {  // int8 q as the code q + 128, four at a time (+128 is the sign bit flipped)
        for (int q = 0; q < 8; q++) put_word(p.w + ((b * groups + g) * 8 + q) * 64 + o * 4, word_at(x + 2 + 4 * q) ^ 0x80808080u);
        continue;
      }
      // Q5_0 / Q5_1: d (| m) | qh (bit i: code i's fifth) | 16 bytes of nibbles, codes as the q8 kind's
      const uint8_t* qs = x + (type == RAW_Q5_0 ? 6 : 8);
      uint32_t qh = 0;
      std::memcpy(&qh, x + (type == RAW_Q5_0 ? 2 : 4), 4);
      const int zero = type == RAW_Q5_0 ? 112 : 0;  // the q8 kind's d (c - 128) = d (q - 16)
      uint8_t c[32];
      for (int i = 0; i < 32; i++)
        c[i] = static_cast<uint8_t>((((qs[i % 16] >> (4 * (i / 16))) & 15) | (((qh >> i) & 1u) << 4)) + zero);
      put_group(p, type, b * groups + g, o, c);
    }
    return;
  }
  for (int64_t s = 0; s < supers; s++) {
    const uint8_t* x = row + s * block;
    const int64_t at = (b * supers + s) * 16 + o;
    if (type == RAW_Q3_K || type == RAW_Q2_K) {
      pack_low(type, x, b, o, s, groups, supers, p);
      continue;
    }
    if (type == RAW_IQ4_XS) {  // d | scales_h (2 bits a group) | scales_l[4] (4 bits a group) | qs[128]
      p.d[at] = half_at(x);
      const int high = x[2] | (x[3] << 8);
      uint8_t c[256];
      for (int g = 0; g < 8; g++) {
        const int scale = ((x[4 + g / 2] >> (4 * (g % 2))) & 15) | (((high >> (2 * g)) & 3) << 4);
        p.sc[(b * groups + s * 8 + g) * 16 + o] = static_cast<uint8_t>(static_cast<int8_t>(scale - 32));
        for (int j = 0; j < 32; j++) c[32 * g + j] = static_cast<uint8_t>((x[8 + 16 * g + j % 16] >> (4 * (j / 16))) & 15);
      }
      for (int g = 0; g < 8; g++) put_group(p, type, b * groups + s * 8 + g, o, c + 32 * g);
      continue;
    }
    if (type == RAW_Q6_K) {  // ql[128] (low nibbles) | qh[64] (2 high bits) | scales[16] | d
      const uint8_t *ql = x, *qh = x + 128, *scales = x + 192;
      p.d[at] = half_at(x + 208);
      for (int j = 0; j < 16; j++) p.sc[((b * groups + s * 8) * 2 + j) * 16 + o] = scales[j];
      for (int g = 0; g < 8; g++) {  // code i of group g: ql[g/4*64 + g%2*32 + i] nibble g%4/2, qh[g/4*32 + i] bits g%4
        const int64_t ga = b * groups + s * 8 + g;
        put_nibbles(p, ga, o, ql + g / 4 * 64 + g % 2 * 32, 4 * (g % 4 / 2));
        for (int v = 0; v < 2; v++) {
          uint32_t bits = 0;
          for (int j = 0; j < 4; j++) bits |= ((word_at(qh + g / 4 * 32 + 16 * v + 4 * j) >> (2 * (g % 4))) & 0x03030303u) << (2 * j);
          put_word(p.hi + (ga * 2 + v) * 64 + o * 4, bits);
        }
      }
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
    const uint8_t* qs = x + (type == RAW_Q5_K ? 48 : 16);  // code i of group g: qs[g/2*32 + i] nibble g%2
    for (int g = 0; g < 8; g++) {
      const int64_t ga = b * groups + s * 8 + g;
      put_nibbles(p, ga, o, qs + g / 2 * 32, 4 * (g % 2));
      if (type == RAW_Q5_K) {  // the fifth bit: bit g of qh[i] (qh = x + 16)
        uint32_t bits = 0;
        for (int q = 0; q < 8; q++) bits |= ((word_at(x + 16 + 4 * q) >> g) & 0x01010101u) << q;
        put_word(p.hi + ga * 64 + o * 4, bits);
      }
    }
  }
}

// rows [n, row bytes] of `type` with k inputs -> p (see Packed); 0, or 1 for a type it does not pack
int pack_rows(int type, const uint8_t* raw, int64_t n, int64_t k, const Packed& p) {
  const int64_t block = raw_block_bytes(type);
  if (!block) return 1;
  const int64_t row_bytes = k / raw_block_inputs(type) * block;
#pragma omp parallel for schedule(static)  // blocks of 16 rows: each writes bytes of its own only
  for (int64_t b = 0; b < (n + 15) / 16; b++)
    for (int64_t r = b * 16; r < std::min(n, b * 16 + 16); r++) pack_row(type, raw + r * row_bytes, r, k, block, p);
  return 0;
}

}  // namespace
