// The K-quants' projections (Q4_K, Q5_K, Q6_K) for 16 activation rows at a time on AMX's int8 tiles, where
// the CPU has them (Sapphire Rapids and later; the AVX-512 build only). A prompt's chunk is most of its
// time in these dots: one TDPBSUD multiplies 16 rows by a group's 32 inputs for 16 outputs, where VNNI
// needs 128 instructions.
//
// The same numbers as kquant_block (project.h), bit for bit: each group's (Q6_K: each 16 inputs') dot is
// exact in int32 whichever unit sums it, and the fp32 sums after it are kquant_block's operations in its
// order. So a row gives the same bits on AMX (a prompt's chunk) as alone on VNNI (a decode step, a
// draft), and prefill, drafts and single steps still agree.
//
// Linux lends a process AMX's tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM); amx_ready()
// asks once. Tiles are per thread: each call loads its configuration and releases the tiles after, so a
// library that uses AMX on the same threads (oneDNN in torch) finds them as it left them.
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.h"

namespace {

constexpr int kAmxRows = 16;  // activation rows an AMX pass computes

// -1: not looked yet; 0: VNNI only; 1: AMX for K-quant passes of 16 rows
std::atomic<int> g_amx{-1};

// the CPU has AMX's tiles and int8 dots, and the kernel (Linux) lends this process their state
inline bool amx_available() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;  // AMX-TILE, AMX-INT8
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// whether K-quant projections of 16 rows or more go to AMX ($CHATCLI_AMX=off: never)
inline bool amx_ready() {
  int state = g_amx.load(std::memory_order_relaxed);
  if (state < 0) {
    const char* env = std::getenv("CHATCLI_AMX");
    state = (env && std::strcmp(env, "off") == 0) ? 0 : amx_available() ? 1 : 0;
    g_amx.store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// one dot of 16 rows (tile 4, from xq with stride kp) by a scale's codes (tile 5) into tile kC, stored at dots;
// AMX's intrinsics take tile numbers as literals
template <int kC>
__attribute__((target("amx-tile,amx-int8"))) inline void tile_dot(const uint8_t* xq, int64_t kp, const uint8_t* codes,
                                                                   int32_t* dots) {
  _tile_loadd(4, xq, kp);
  _tile_loadd(5, codes, 64);
  if constexpr (kC == 0) {
    _tile_zero(0);
    _tile_dpbsud(0, 4, 5);
    _tile_stored(0, dots, 64);
  } else if constexpr (kC == 1) {
    _tile_zero(1);
    _tile_dpbsud(1, 4, 5);
    _tile_stored(1, dots, 64);
  } else if constexpr (kC == 2) {
    _tile_zero(2);
    _tile_dpbsud(2, 4, 5);
    _tile_stored(2, dots, 64);
  } else {
    _tile_zero(3);
    _tile_dpbsud(3, 4, 5);
    _tile_stored(3, dots, 64);
  }
}

// group g's dots for the 16 rows at xq (stride kp) into dots [kScales][16][16], on tiles kC (and kC + 1: Q6_K's
// second 16 inputs, their own scale)
template <bool k6, int kC>
__attribute__((target("amx-tile,amx-int8"))) inline void group_dots(const uint8_t* xq, int64_t kp, const uint8_t* codes,
                                                                     int32_t* dots) {
  tile_dot<kC>(xq, kp, codes, dots);
  if constexpr (k6) tile_dot<kC + 1>(xq + 16, kp, codes + 4 * 64, dots + 256);
}

// y[first..first+count, 16 b..16 b + 16) for K-quant block b (kKind: WEIGHT_Q4K, _Q5K or _Q6K), count a multiple
// of 16, as kquant_block<R, kKind> gives them. The block's codes are unpacked once into `codes` (groups x 512
// bytes); each pass of 16 rows then runs group g + 1's dots on the tiles while the vector units sum group g's.
template <int kKind>
__attribute__((target("amx-tile,amx-int8"))) void kquant_amx(const Matrix& m, int64_t b, const Rows& in, int64_t first,
                                                              int64_t count, float* y, int64_t ldy, bool accumulate,
                                                              uint8_t* codes) {
  constexpr bool k6 = kKind == WEIGHT_Q6K;
  constexpr int kScales = k6 ? 2 : 1;
  const int64_t groups = m.kp / 32;
  const KBlock block = k_block<kKind>(m, b);
  const uint16_t *dp = block.d, *mp = block.dmin;
  const uint8_t *scp = block.sc, *smp = block.sm;
  for (int64_t g = 0; g < groups; g++) unpack_group<kKind>(m, b, g, codes + g * 512);
  TileConfig config;
  for (int t = 0; t < 4; t++) config.rows[t] = kAmxRows, config.colsb[t] = 64;
  config.rows[4] = kAmxRows, config.colsb[4] = k6 ? 16 : 32;
  config.rows[5] = k6 ? 4 : 8, config.colsb[5] = 64;
  _tile_loadconfig(&config);
  alignas(64) int32_t dots[2][kScales][16][16];  // [group parity][scale][row][output]
  for (int64_t s0 = first; s0 < first + count; s0 += kAmxRows) {
    const uint8_t* xq = in.xq + s0 * m.kp;
    __m512 sum[kAmxRows];
    for (int r = 0; r < kAmxRows; r++) sum[r] = _mm512_setzero_ps();
    __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
    group_dots<k6, 0>(xq, m.kp, codes, &dots[0][0][0][0]);
    for (int64_t g = 0; g < groups; g++) {
      if (g + 1 < groups) {  // the next group's dots, on the other tiles, while this one is summed
        if ((g + 1) % 2)
          group_dots<k6, 2>(xq + (g + 1) * 32, m.kp, codes + (g + 1) * 512, &dots[1][0][0][0]);
        else
          group_dots<k6, 0>(xq + (g + 1) * 32, m.kp, codes + (g + 1) * 512, &dots[0][0][0][0]);
      }
      const int32_t(*dot)[16][16] = dots[g % 2];
      if (g % 8 == 0) {
        d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + g / 8 * 16)));
        if constexpr (!k6) dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + g / 8 * 16)));
      }
      kquant_sums<kAmxRows, k6>(sum, in, s0, g, groups, d, dmin, scp, smp,
                                [&](int r, int h) { return _mm512_load_si512(dot[h][r]); });
    }
    store_block<kAmxRows>(sum, m, b, s0, y, ldy, accumulate);
  }
  _tile_release();
}

// every (unit, row block) pair once over the team, as split does: each row block's whole passes of 16 rows on
// AMX (amx(unit, first, count)), what is left in VNNI's passes (vnni(unit, r, s), as split's work)
template <typename Amx, typename Vnni>
void split_tiles(const Rows& in, int64_t units, Amx amx, Vnni vnni) {
  split_blocks<kAmxRows>(in, units, [&](int64_t unit, int64_t first, int64_t count) {
    const int64_t tiled = count / kAmxRows * kAmxRows;
    if (tiled) amx(unit, first, tiled);
    if (tiled < count) {
      Rows part = in;
      part.count = count - tiled;
      each_row_pass<kRowsPerPass>(part, [&](auto r, int64_t s) { vnni(unit, r, first + tiled + s); });
    }
  });
}

}  // namespace
