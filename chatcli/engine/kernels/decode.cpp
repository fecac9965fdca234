// The lean runner's decode step in one call, on AVX-512 (VNNI for int8 weights).
//
// `chatcli_decode` runs S rows (a sampled token, or a token and the draft that follows it)
// through every layer of a Llama decoder and writes their keys and values into the KV cache
// at positions pos..pos+S-1. It computes what `LeanRunner.decode_one_token` computes
// (RMSNorm weights folded into the projections, q/k rows in adjacent rope pairs), but with
// no per-op dispatch: one OpenMP team for the whole step, a barrier between stages. With a
// bf16 cache, keys and values are stored in bf16 but q and the attention output stay fp32
// (the torch path rounds those to bf16 too).
//
// Every number of a row is computed from that row alone, by one thread, in a fixed order:
// int8 activations get a scale and zero point per row, a dot product sums in int32 (exact
// in any order), an fp32 projection accumulates over k in order for each output. So the
// logits of a row do not depend on how many rows share the call or on the thread count:
// checking a draft gives the numbers that decoding its tokens one by one would give.
//
// Projections, y [S, n] = x [S, k] W^T:
//   int8: W packed as [ceil(n/16)][kp/4][16][4] int8 (16 outputs a block, 4 consecutive k
//     per 32-bit lane, as VPDPBUSD wants), symmetric per output row, scale [n], row sums
//     [n] (for the activations' zero point): y = xs * ws * (sum xq * wq - xz * wsum).
//   fp32: W as the lean runner keeps it for prefill, transposed [k, n] (w_t).
// The KV cache is [L, KV, capacity, hd] in fp32 or bf16 (round to nearest even).

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

extern "C" {

enum { WEIGHT_F32 = 0, WEIGHT_I8 = 1 };
enum { CACHE_F32 = 0, CACHE_BF16 = 1 };

struct Matrix {
  int32_t kind;      // WEIGHT_F32 or WEIGHT_I8
  int64_t n, k, kp;  // outputs, inputs, inputs padded to a multiple of 4 (int8)
  const void* w;     // fp32: [k, n]; int8: packed as above
  const float* scale;  // int8: [n]
  const int32_t* wsum;  // int8: [n]
};

struct Layer {
  Matrix qkv, out, gate_up, down;
};

struct Model {
  int64_t n_layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  float eps;
  const float* embed;  // [V, D]
  const float* rope;   // [T, hd/2, 2]: cos, sin
  const Layer* layers;
  Matrix head;
};

struct Cache {
  int32_t kind;  // CACHE_F32 or CACHE_BF16
  void* k;       // [L, KV, capacity, hd]
  void* v;
  int64_t capacity;
};

}  // extern "C"

namespace {

constexpr int kRowsPerPass = 4;  // activation rows that share one read of a weight block (at most)

// ---- projections, run inside an OpenMP team (each splits its output blocks) ---------------

struct Rows {  // the activation rows a projection reads
  int64_t count;
  const float* x;     // fp32: [count, ldx]
  int64_t ldx;
  const uint8_t* xq;  // int8: [count, kp]
  const float* xs;
  const int32_t* xz;
};

// y[s, n0..n0+16) for rows s0..s0+R, int8 block b; accumulate: y += instead of y =
template <int R>
void int8_block(const Matrix& m, int64_t b, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const int64_t quads = m.kp / 4;
  const int8_t* w = static_cast<const int8_t*>(m.w) + b * quads * 64;
  __m512i acc[R][2];
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
  int64_t q = 0;
  for (; q + 2 <= quads; q += 2) {
    const __m512i w0 = _mm512_loadu_si512(w + q * 64), w1 = _mm512_loadu_si512(w + q * 64 + 64);
    for (int r = 0; r < R; r++) {
      const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(xr[q]), w0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], _mm512_set1_epi32(xr[q + 1]), w1);
    }
  }
  if (q < quads) {
    const __m512i w0 = _mm512_loadu_si512(w + q * 64);
    for (int r = 0; r < R; r++) {
      const int32_t* xr = reinterpret_cast<const int32_t*>(in.xq + (s0 + r) * m.kp);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(xr[q]), w0);
    }
  }
  const int64_t n0 = b * 16;
  const int64_t width = std::min<int64_t>(16, m.n - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1u);
  const __m512 ws = _mm512_maskz_loadu_ps(mask, m.scale + n0);
  const __m512i wsum = _mm512_maskz_loadu_epi32(mask, m.wsum + n0);
  for (int r = 0; r < R; r++) {
    const int64_t s = s0 + r;
    const __m512i dot = _mm512_sub_epi32(_mm512_add_epi32(acc[r][0], acc[r][1]),
                                         _mm512_mullo_epi32(_mm512_set1_epi32(in.xz[s]), wsum));
    __m512 val = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(in.xs[s]), ws), _mm512_cvtepi32_ps(dot));
    float* out = y + s * ldy + n0;
    if (accumulate) val = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), val);
    _mm512_mask_storeu_ps(out, mask, val);
  }
}

// y[s, n0..n0+16*V) for rows s0..s0+R from w_t [k, n], V vectors of 16 outputs
template <int R, int V>
void f32_block(const Matrix& m, int64_t n0, const Rows& in, int64_t s0, float* y, int64_t ldy, bool accumulate) {
  const float* w = static_cast<const float*>(m.w);
  __m512 acc[R][V];
  for (int r = 0; r < R; r++)
    for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < m.k; k++) {
    const float* wk = w + k * m.n + n0;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 8 * m.n), _MM_HINT_T0);
    __m512 wv[V];
    for (int v = 0; v < V; v++) wv[v] = _mm512_loadu_ps(wk + 16 * v);
    for (int r = 0; r < R; r++) {
      const __m512 xb = _mm512_set1_ps(in.x[(s0 + r) * in.ldx + k]);
      for (int v = 0; v < V; v++) acc[r][v] = _mm512_fmadd_ps(xb, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int v = 0; v < V; v++) {
      float* out = y + (s0 + r) * ldy + n0 + 16 * v;
      _mm512_storeu_ps(out, accumulate ? _mm512_add_ps(_mm512_loadu_ps(out), acc[r][v]) : acc[r][v]);
    }
}

// fp32 outputs past the last whole vector, one at a time (in the same k order)
void f32_tail(const Matrix& m, int64_t n0, const Rows& in, float* y, int64_t ldy, bool accumulate) {
  const float* w = static_cast<const float*>(m.w);
  for (int64_t s = 0; s < in.count; s++)
    for (int64_t n = n0; n < m.n; n++) {
      float acc = 0.f;
      for (int64_t k = 0; k < m.k; k++) acc = std::fma(in.x[s * in.ldx + k], w[k * m.n + n], acc);
      float* out = y + s * ldy + n;
      *out = accumulate ? *out + acc : acc;
    }
}

template <typename Block>
void each_row_pass(const Rows& in, Block block) {
  static_assert(kRowsPerPass == 4, "the passes below are written out for 4 rows");
  int64_t s = 0;
  for (; s + kRowsPerPass <= in.count; s += kRowsPerPass) block(std::integral_constant<int, kRowsPerPass>{}, s);
  switch (in.count - s) {
    case 3: block(std::integral_constant<int, 3>{}, s); break;
    case 2: block(std::integral_constant<int, 2>{}, s); break;
    case 1: block(std::integral_constant<int, 1>{}, s); break;
    default: break;
  }
}

// y [S, n] (row stride ldy) = in · W^T, or += with accumulate; called by every thread of a team
void project(const Matrix& m, const Rows& in, float* y, int64_t ldy, bool accumulate) {
  if (m.kind == WEIGHT_I8) {
    const int64_t blocks = (m.n + 15) / 16;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; b++)
      each_row_pass(in, [&](auto rows, int64_t s) { int8_block<decltype(rows)::value>(m, b, in, s, y, ldy, accumulate); });
    return;
  }
  constexpr int64_t kTile = 64;  // 4 vectors of outputs
  const int64_t tiles = m.n / kTile, vectors = (m.n % kTile) / 16, tail = tiles * kTile + vectors * 16;
#pragma omp for schedule(static)
  for (int64_t t = 0; t < tiles + vectors; t++) {
    if (t < tiles)
      each_row_pass(in, [&](auto rows, int64_t s) { f32_block<decltype(rows)::value, 4>(m, t * kTile, in, s, y, ldy, accumulate); });
    else
      each_row_pass(in, [&](auto rows, int64_t s) {
        f32_block<decltype(rows)::value, 1>(m, tiles * kTile + (t - tiles) * 16, in, s, y, ldy, accumulate);
      });
  }
#pragma omp single
  if (tail < m.n) f32_tail(m, tail, in, y, ldy, accumulate);
}

// ---- attention ------------------------------------------------------------------------------

template <typename T>
void attend(const float* q, const T* k, const T* v, int64_t length, int64_t hd, float* scores, float* out) {
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  float top = -INFINITY;
  for (int64_t t = 0; t < length; t++) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i += 16) acc = _mm512_fmadd_ps(load16(q + i), load16(k + t * hd + i), acc);
    scores[t] = hsum(acc) * scale;
    top = std::max(top, scores[t]);
  }
  const __m512 vtop = _mm512_set1_ps(top);
  __m512 vsum = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= length; t += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + t), vtop));
    _mm512_storeu_ps(scores + t, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (t < length) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (length - t)) - 1u);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores + t), vtop));
    _mm512_mask_storeu_ps(scores + t, mask, e);
    vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(mask, e));
  }
  const float inv = 1.f / hsum(vsum);
  for (int64_t i = 0; i < hd; i += 16) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t u = 0; u < length; u++) acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[u]), load16(v + u * hd + i), acc);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(acc, _mm512_set1_ps(inv)));
  }
}

template <typename T>
void store_row(T* dst, const float* src, int64_t n) {
  if constexpr (sizeof(T) == 4) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
  }
}

// ---- the step -------------------------------------------------------------------------------

struct Scratch {
  std::vector<float> x, h, qkv, att, gu, scores;
  std::vector<uint8_t> xq;
  std::vector<float> xs;
  std::vector<int32_t> xz;
};

// rows s of src [S, k] -> normalised (or not) and, for an int8 projection, quantized
Rows prepare(const Matrix& m, const float* src, int64_t lds, int64_t count, bool norm, float eps, Scratch& sc) {
  Rows rows{count, src, lds, sc.xq.data(), sc.xs.data(), sc.xz.data()};
  if (norm) {
    for (int64_t s = 0; s < count; s++) rms_norm(src + s * lds, m.k, eps, sc.h.data() + s * m.k);
    rows.x = sc.h.data();
    rows.ldx = m.k;
  }
  if (m.kind == WEIGHT_I8)
    for (int64_t s = 0; s < count; s++) quantize_row(rows.x + s * rows.ldx, m.k, m.kp, sc.xq.data() + s * m.kp, &sc.xs[s], &sc.xz[s]);
  return rows;
}

template <typename T>
void forward(const Model& m, const Cache& c, const int64_t* tokens, int64_t S, int64_t pos, float* logits,
             int64_t logit_rows, int threads) {
  const int64_t D = m.hidden, H = m.heads, KV = m.kv_heads, hd = m.head_dim, F = m.ffn;
  const int64_t n_qkv = (H + 2 * KV) * hd, group = H / KV, half = hd / 2;
  const int64_t widest = std::max({D, F, H * hd});
  Scratch sc;
  sc.x.resize(S * D);
  sc.h.resize(S * widest);
  sc.qkv.resize(S * n_qkv);
  sc.att.resize(S * H * hd);
  sc.gu.resize(S * 2 * F);
  sc.xq.resize(S * (widest + 64));
  sc.xs.resize(S);
  sc.xz.resize(S);
  sc.scores.resize(static_cast<size_t>(threads) * (pos + S + 16));
  for (int64_t s = 0; s < S; s++) std::memcpy(&sc.x[s * D], m.embed + tokens[s] * D, D * sizeof(float));
  T* k_cache = static_cast<T*>(c.k);
  T* v_cache = static_cast<T*>(c.v);
  Rows rows{};

#pragma omp parallel num_threads(threads)
  {
    float* scores = sc.scores.data() + static_cast<size_t>(omp_get_thread_num()) * (pos + S + 16);
    for (int64_t l = 0; l < m.n_layers; l++) {
      const Layer& layer = m.layers[l];
      T* kl = k_cache + l * KV * c.capacity * hd;
      T* vl = v_cache + l * KV * c.capacity * hd;
#pragma omp single
      rows = prepare(layer.qkv, sc.x.data(), D, S, true, m.eps, sc);
      project(layer.qkv, rows, sc.qkv.data(), n_qkv, false);
#pragma omp single
      for (int64_t s = 0; s < S; s++) {  // rope on q and k (adjacent pairs), then k and v into the cache
        float* row = &sc.qkv[s * n_qkv];
        const float* rope = m.rope + (pos + s) * hd;  // [hd/2, 2]
        for (int64_t head = 0; head < H + KV; head++)
          for (int64_t i = 0; i < half; i++) {
            float* p = row + head * hd + 2 * i;
            const float a = p[0], b = p[1], cs = rope[2 * i], sn = rope[2 * i + 1];
            p[0] = a * cs - b * sn;
            p[1] = a * sn + b * cs;
          }
        for (int64_t g = 0; g < KV; g++) {
          store_row(kl + (g * c.capacity + pos + s) * hd, row + (H + g) * hd, hd);
          store_row(vl + (g * c.capacity + pos + s) * hd, row + (H + KV + g) * hd, hd);
        }
      }
#pragma omp for schedule(static)
      for (int64_t task = 0; task < S * H; task++) {
        const int64_t s = task / H, head = task % H, g = head / group;
        attend(&sc.qkv[s * n_qkv + head * hd], kl + g * c.capacity * hd, vl + g * c.capacity * hd, pos + s + 1, hd,
               scores, &sc.att[(s * H + head) * hd]);
      }
#pragma omp single
      rows = prepare(layer.out, sc.att.data(), H * hd, S, false, m.eps, sc);
      project(layer.out, rows, sc.x.data(), D, true);
#pragma omp single
      rows = prepare(layer.gate_up, sc.x.data(), D, S, true, m.eps, sc);
      project(layer.gate_up, rows, sc.gu.data(), 2 * F, false);
#pragma omp single
      {
        for (int64_t s = 0; s < S; s++) {  // silu(gate) * up, in place of gate
          float* g = &sc.gu[s * 2 * F];
          const float* u = g + F;
          int64_t i = 0;
          for (; i + 16 <= F; i += 16) {
            const __m512 gv = _mm512_loadu_ps(g + i);
            const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));  // exp(-|g|)
            const __m512 sig = _mm512_mask_div_ps(_mm512_div_ps(e, _mm512_add_ps(e, _mm512_set1_ps(1.f))),
                                                  _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_GE_OQ),
                                                  _mm512_set1_ps(1.f), _mm512_add_ps(e, _mm512_set1_ps(1.f)));
            _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
          }
          for (; i < F; i++) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
        }
        rows = prepare(layer.down, sc.gu.data(), 2 * F, S, false, m.eps, sc);
      }
      project(layer.down, rows, sc.x.data(), D, true);
    }
#pragma omp single
    {
      const int64_t first = S - logit_rows;
      rows = prepare(m.head, sc.x.data() + first * D, D, logit_rows, true, m.eps, sc);
    }
    project(m.head, rows, logits, m.vocab, false);
  }
}

}  // namespace

extern "C" {

// S rows at positions pos.. -> logits [logit_rows, V] of the last logit_rows rows (1 or S)
int chatcli_decode(const Model* m, const Cache* c, const int64_t* tokens, int64_t rows, int64_t pos, float* logits,
                   int64_t logit_rows, int32_t threads) {
  if (rows < 1 || logit_rows < 1 || logit_rows > rows || pos + rows > c->capacity || m->head_dim % 16 != 0) return 1;
  try {  // no exception may cross into C (a failed allocation of the scratch space)
    if (c->kind == CACHE_BF16)
      forward<uint16_t>(*m, *c, tokens, rows, pos, logits, logit_rows, threads);
    else
      forward<float>(*m, *c, tokens, rows, pos, logits, logit_rows, threads);
  } catch (...) {
    return 2;
  }
  return 0;
}

// y [rows, n] = x [rows, k] W^T through one projection (the int8 head after a dense prefill; tests)
int chatcli_project(const Matrix* m, const float* x, int64_t rows, float* y, int32_t threads) {
  if (rows < 1) return 1;
  try {
    Scratch sc;
    sc.h.resize(rows * m->k);
    sc.xq.resize(rows * (m->kp + 64));
    sc.xs.resize(rows);
    sc.xz.resize(rows);
    const Rows in = prepare(*m, x, m->k, rows, false, 0.f, sc);
#pragma omp parallel num_threads(threads)
    project(*m, in, y, m->n, false);
  } catch (...) {
    return 2;
  }
  return 0;
}

}  // extern "C"
