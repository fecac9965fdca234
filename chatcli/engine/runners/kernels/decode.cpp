// The lean runner's decode step in one call, built for AVX-512 with VNNI or for AVX2 with FMA and
// F16C (kernels/__init__.py: BUILDS), the same stages on 16- or 8-lane vectors.
//
// `chatcli_decode` runs S rows of one sequence (a prompt chunk, a sampled token, or a token and the
// draft that follows it), `chatcli_decode_batch` the rows of several sequences (`Segment`s, each with its
// own KV cache and positions: every weight read once for all of them), through every layer of a decoder of a lean family (Llama, and the extras of Mistral, Qwen2/3,
// Phi-3 and Gemma 2/3 where a layer has them: q/k/v biases, q/k norms, a sliding window, its own
// rope table, sandwich norms, GeGLU, soft-capped scores; see families.py) and writes their keys and values into the KV cache
// at positions pos..pos+S-1. It computes what `LeanRunner.decode_one_token` computes
// (RMSNorm weights folded into the projections, q/k rows in adjacent rope pairs), but with
// no per-op dispatch: one OpenMP team for the whole step, a barrier between stages. With a
// bf16 cache, keys and values are stored in bf16 but q and the attention output stay fp32
// (the torch path rounds those to bf16 too).
//
// Every number of a row is computed from that row alone, by one thread, in a fixed order:
// int8 activations get a scale and zero point per row (q4 / q8: a scale per row and group), a dot product sums in int32 (exact
// in any order), an fp32 projection accumulates over k in order for each output. So the
// logits of a row do not depend on how many rows share the call or on the thread count:
// checking a draft gives the numbers that decoding its tokens one by one would give.
//
// Projections (fp32 panels, int8, q4 / q8 blocks, K-quants) are in project.h, Q3_K and Q2_K in project_low.h;
// where the CPU has AMX, a K-quant projection of 16 rows or more (a prompt's chunk) runs on its tiles
// (project_amx.h), to the same bits.
// The KV cache holds, per layer, keys [KV, capacity/16, hd, 16] (blocks of 16 positions, transposed) and
// values [KV, capacity, hd], in fp32 or bf16 (round to nearest even), of positions base..base+capacity-1;
// capacity and base are multiples of 16. A layer that attends to every position has base 0; a sliding
// layer's strip moves on (kv_memory.Strip) and holds at least its window.
// Attention over that cache is in attention.h, the per-row stages in simd.h.

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include "attention.h"
#include "project.h"
#include "project_low.h"
#include "simd.h"
#elif defined(__aarch64__) && defined(__ARM_NEON)  // NEON with SDOT: the same stages on 4-lane vectors
#include "attention_neon.h"
#include "project_low_neon.h"
#include "project_neon.h"
#include "simd_neon.h"
#else  // AVX2, FMA and F16C: the same stages on 8-lane vectors
#include "attention_avx2.h"
#include "project_avx2.h"
#include "project_low_avx2.h"
#include "simd_avx2.h"
#endif
#include "common.h"
#include "pack.h"
#include "steps.h"

extern "C" {

enum { CACHE_F32 = 0, CACHE_BF16 = 1 };

struct Layer {
  Matrix qkv, out, gate_up, down;
  const float* rope;      // [T, hd/2, 2]: cos, sin (this layer's table)
  int64_t window;         // positions a row attends to at most, itself included (0: all)
  const float* qkv_bias;  // [(H + 2 KV) hd] or null
  const float* q_norm;    // [hd] or null (with k_norm): RMSNorm of each q and k head before rope
  const float* k_norm;
  const float* post_attn_norm;  // [D] or null (with post_ffn_norm): RMSNorm of each block's output
  const float* post_ffn_norm;
};

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

struct Model {
  int64_t n_layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  float eps;
  float attn_scale;    // scores' scale
  float attn_softcap;  // scores -> cap * tanh(scores / cap) (0: none)
  int32_t act;         // ACT_SILU or ACT_GELU_TANH
  const float* embed;  // [V, D], or null: rows of embed_rows
  const Layer* layers;
  Matrix head;
  const Matrix* embed_rows;  // q4 / q8 files: the embedding's blocks (a tied model's head), or null
  float embed_scale;         // what each row looked up from embed_rows is multiplied by (Gemma: sqrt(D))
};

struct Cache {
  int32_t kind;             // CACHE_F32 or CACHE_BF16
  void* const* k;           // per layer: [KV, capacity/16, hd, 16]
  void* const* v;           // per layer: [KV, capacity, hd]
  const int64_t* capacity;  // per layer: the positions it holds
  const int64_t* base;      // per layer: the first of them
};

// One sequence's rows in a step (`chatcli_decode_batch`): `rows` consecutive positions from `pos` on,
// their keys and values into `cache`, logits for its last `logit_rows` rows (1 or rows)
struct Segment {
  const Cache* cache;
  int64_t pos, rows, logit_rows;
};

}  // extern "C"

namespace {

// ---- the step -------------------------------------------------------------------------------

struct Scratch {
  std::vector<float> x, h, qkv, att, gu, scores, post;
  std::vector<uint8_t> xq;
  std::vector<float> xs, gs, gsum;
  std::vector<int32_t> xz, hsum;

  // room for `rows` rows of up to `width` inputs (padded to 256) in every activation buffer but h
  void size_activations(int64_t rows, int64_t width) {
    const int64_t padded = (width + 255) / 256 * 256;
    xq.resize(rows * (padded + 64));
    xs.resize(rows);
    xz.resize(rows);
    gs.resize(rows * (padded / 32 + 2));
    gsum.resize(rows * (padded / 32 + 2));
    hsum.resize(rows * (padded / 16 + 2));
  }
};

// The rows a projection reads: `src [count, k]` itself, or its normalised rows in sc.h
Rows rows_for(const Matrix& m, const float* src, int64_t lds, int64_t count, bool norm, const Scratch& sc) {
  Rows rows{count, src, lds, sc.xq.data(), sc.xs.data(), sc.xz.data(), sc.gs.data(), sc.gsum.data(), sc.hsum.data()};
  if (norm) {
    rows.x = sc.h.data();
    rows.ldx = m.k;
  }
  return rows;
}

// rows s of src [S, k] -> normalised (or not) and, for an int8 projection, quantized; each row by one
// thread (called by every thread of a team; ends with its barrier)
Rows prepare(const Matrix& m, const float* src, int64_t lds, int64_t count, bool norm, float eps, Scratch& sc) {
  const Rows rows = rows_for(m, src, lds, count, norm, sc);
#pragma omp for schedule(static)
  for (int64_t s = 0; s < count; s++) {
    if (norm) {
      float* h = sc.h.data() + s * m.k;
      rms_norm(src + s * lds, m.k, eps, h);
      if (m.norm)
        for (int64_t i = 0; i < m.k; i++) h[i] *= m.norm[i];
    }
    const float* x = rows.x + s * rows.ldx;
    if (m.kind == WEIGHT_I8) quantize_row(x, m.k, m.kp, sc.xq.data() + s * m.kp, &sc.xs[s], &sc.xz[s]);
    if (grouped(m)) {
      const int64_t groups = m.kp / 32;
      int8_t* xq = reinterpret_cast<int8_t*>(sc.xq.data()) + s * m.kp;
      quantize_groups(x, m.k, m.kp, xq, &sc.gs[s * groups], &sc.gsum[s * groups]);
      if (reads_hsum(m)) {
        int32_t* hs = &sc.hsum[s * (m.kp / 16)];
        for (int64_t h = 0; h < m.kp / 16; h++) {
          int32_t t = 0;
          for (int i = 0; i < 16; i++) t += xq[h * 16 + i];
          hs[h] = t;
        }
      }
    }
  }
  return rows;
}

// x += in · W^T, or, with a sandwich norm (Gemma), x += rms_norm(in · W^T) * norm (ends with a barrier)
void project_residual(const Matrix& w, const Rows& in, const float* norm, float eps, Scratch& sc) {
  const int64_t D = w.n;
  if (!norm) {
    project(w, in, sc.x.data(), D, true);
    return;
  }
  project(w, in, sc.post.data(), D, false);
#pragma omp for schedule(static)
  for (int64_t s = 0; s < in.count; s++) {
    float* y = &sc.post[s * D];
    rms_norm_scaled(y, norm, D, eps);
    for (int64_t i = 0; i < D; i++) sc.x[s * D + i] += y[i];
  }
}

// An attention task: `positions` rows of segment `seg` from row `s` (of the step) on, `heads` heads from
// `head`, of KV group g
struct Task {
  int64_t seg, s, positions, g, head, heads;
};

// Every segment's attention tasks: one head a task where a segment has few rows (a decode step), so
// that every thread has some; else tiles of positions. The tiling changes no bits (attend: a row's
// sums in the same order whatever the rows around it).
std::vector<Task> attention_tasks(const Segment* segs, int64_t n_segs, int64_t KV, int64_t group, int threads) {
  const int64_t part = std::min<int64_t>(group, kMaxGroup);  // heads a task attends together
  const int64_t parts = (group + part - 1) / part;
  std::vector<Task> tasks;
  int64_t first = 0;
  for (int64_t j = 0; j < n_segs; j++) {
    const int64_t S = segs[j].rows;
    const int64_t per_task = S * KV * parts >= 4 * threads ? part : 1;
    const int64_t tile = per_task == 1 ? 1 : std::max<int64_t>(1, kTileRows / per_task);  // positions a task
    const int64_t tiles = (S + tile - 1) / tile, tasks_per_group = (group + per_task - 1) / per_task;
    for (int64_t task = 0; task < tiles * KV * tasks_per_group; task++) {
      const int64_t s = task / (KV * tasks_per_group) * tile, g = task / tasks_per_group % KV;
      const int64_t head = g * group + task % tasks_per_group * per_task;
      tasks.push_back({j, first + s, std::min(tile, S - s), g, head, std::min(per_task, (g + 1) * group - head)});
    }
    first += S;
  }
  return tasks;
}

// The rows of n_segs sequences (tokens: every segment's in turn) through every layer, each row with its
// own cache and position; logits [sum of logit_rows, V]: each segment's last logit_rows rows in turn
template <typename T>
void forward(const Model& m, const Segment* segs, int64_t n_segs, const int64_t* tokens, float* logits, int threads) {
  const int64_t D = m.hidden, H = m.heads, KV = m.kv_heads, hd = m.head_dim, F = m.ffn;
  const int64_t n_qkv = (H + 2 * KV) * hd, group = H / KV, half = hd / 2;
  const int64_t widest = std::max({D, F, H * hd});
  std::vector<int64_t> row_seg, row_pos, picked;  // per row: its segment and position; the rows with logits
  int64_t longest = 0;  // the most positions a row sees
  for (int64_t j = 0; j < n_segs; j++) {
    for (int64_t r = 0; r < segs[j].rows; r++) {
      if (r >= segs[j].rows - segs[j].logit_rows) picked.push_back(static_cast<int64_t>(row_seg.size()));
      row_seg.push_back(j);
      row_pos.push_back(segs[j].pos + r);
    }
    longest = std::max(longest, segs[j].pos + segs[j].rows);
  }
  const int64_t S = static_cast<int64_t>(row_seg.size()), L = static_cast<int64_t>(picked.size());
  Scratch sc;
  sc.x.resize(S * D);
  sc.h.resize(S * widest);
  sc.qkv.resize(S * n_qkv);
  sc.att.resize(S * H * hd);
  sc.gu.resize(S * 2 * F);
  sc.post.resize(S * D);
  sc.size_activations(S, widest);
  const std::vector<Task> tasks = attention_tasks(segs, n_segs, KV, group, threads);
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const size_t scratch_per_thread = static_cast<size_t>(kTileRows) * (2 * hd + longest + 48);
  sc.scores.resize(static_cast<size_t>(threads) * scratch_per_thread);
  std::vector<float> last(n_segs > 1 ? L * D : 0);  // the rows with logits, gathered (several segments)
  for (int64_t s = 0; s < S; s++) {
    if (m.embed)
      std::memcpy(&sc.x[s * D], m.embed + tokens[s] * D, D * sizeof(float));
    else
      dequantize_row(*m.embed_rows, tokens[s], m.embed_scale, &sc.x[s * D]);
  }

  // Every stage splits its rows (or output blocks, or heads) over the team; a barrier ends each.
#pragma omp parallel num_threads(threads)
  {
    float* scratch = sc.scores.data() + static_cast<size_t>(omp_get_thread_num()) * scratch_per_thread;
    for (int64_t l = 0; l < m.n_layers; l++) {
      const Layer& layer = m.layers[l];
      Rows rows = prepare(layer.qkv, sc.x.data(), D, S, true, m.eps, sc);
      project(layer.qkv, rows, sc.qkv.data(), n_qkv, false);
#pragma omp for schedule(static)
      for (int64_t s = 0; s < S; s++) {  // bias, q/k norms, rope on q and k (adjacent pairs), k and v into the cache
        const Cache& c = *segs[row_seg[s]].cache;
        T* kl = static_cast<T*>(c.k[l]);  // [KV, capacity/16, hd, 16]
        T* vl = static_cast<T*>(c.v[l]);  // [KV, capacity, hd]
        const int64_t cap = c.capacity[l], base = c.base[l], pos = row_pos[s];
        float* row = &sc.qkv[s * n_qkv];
        if (layer.qkv_bias)
          for (int64_t i = 0; i < n_qkv; i++) row[i] += layer.qkv_bias[i];
        if (layer.q_norm)
          for (int64_t h = 0; h < H + KV; h++) rms_norm_scaled(row + h * hd, h < H ? layer.q_norm : layer.k_norm, hd, m.eps);
        rope_row(row, layer.rope + pos * hd, H + KV, half);  // rope [hd/2, 2] of this position
        for (int64_t g = 0; g < KV; g++) {
          store_key(kl + g * cap * hd, pos - base, row + (H + g) * hd, hd);
          store_value(vl + (g * cap + pos - base) * hd, row + (H + KV + g) * hd, hd);
        }
      }
#pragma omp for schedule(static, 1)  // interleaved: a causal row's cost grows with its position
      for (int64_t i = 0; i < n_tasks; i++) {
        const Task& t = tasks[i];
        const Cache& c = *segs[t.seg].cache;
        const int64_t cap = c.capacity[l], base = c.base[l];
        const T* kl = static_cast<const T*>(c.k[l]) + t.g * cap * hd;
        const T* vl = static_cast<const T*>(c.v[l]) + t.g * cap * hd;
        attend(&sc.qkv[t.s * n_qkv + t.head * hd], n_qkv, t.positions, t.heads, kl, vl, base, row_pos[t.s] + 1, hd,
               layer.window, m.attn_scale, m.attn_softcap, scratch, &sc.att[(t.s * H + t.head) * hd], H * hd);
      }
      rows = prepare(layer.out, sc.att.data(), H * hd, S, false, m.eps, sc);
      project_residual(layer.out, rows, layer.post_attn_norm, m.eps, sc);
      rows = prepare(layer.gate_up, sc.x.data(), D, S, true, m.eps, sc);
      project(layer.gate_up, rows, sc.gu.data(), 2 * F, false);
#pragma omp for schedule(static)
      for (int64_t s = 0; s < S; s++) {  // act(gate) * up, in place of gate
        if (m.act == ACT_GELU_TANH)
          gelu_tanh_mul_row(&sc.gu[s * 2 * F], F);
        else
          silu_mul_row(&sc.gu[s * 2 * F], F);
      }
      rows = prepare(layer.down, sc.gu.data(), 2 * F, S, false, m.eps, sc);
      project_residual(layer.down, rows, layer.post_ffn_norm, m.eps, sc);
    }
    const float* x = sc.x.data() + (S - L) * D;  // one segment: its last rows, as they are
    if (n_segs > 1) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < L; i++) std::memcpy(&last[i * D], &sc.x[picked[i] * D], D * sizeof(float));
      x = last.data();
    }
    const Rows rows = prepare(m.head, x, D, L, true, m.eps, sc);
    project(m.head, rows, logits, m.vocab, false);
  }
}

// 0 where every segment's rows fit its cache (and the model's heads the kernel's), else 1
int check_segments(const Model* m, const Segment* segs, int64_t n_segs) {
  if (n_segs < 1 || m->head_dim % 16 != 0 || m->head_dim > kMaxHeadDim || (!m->embed && !m->embed_rows)) return 1;
  for (int64_t j = 0; j < n_segs; j++) {
    const Segment& g = segs[j];
    if (g.rows < 1 || g.logit_rows < 1 || g.logit_rows > g.rows || !g.cache || g.cache->kind != segs[0].cache->kind)
      return 1;
    for (int64_t l = 0; l < m->n_layers; l++) {  // each layer holds what its rows write and read
      const int64_t base = g.cache->base[l], window = m->layers[l].window;
      const int64_t first = window ? std::max<int64_t>(0, g.pos + 1 - window) / 16 * 16 : 0;
      if (g.cache->capacity[l] % 16 != 0 || base % 16 != 0 || base < 0 || base > first ||
          g.pos + g.rows - base > g.cache->capacity[l])
        return 1;
    }
  }
  return 0;
}

}  // namespace

extern "C" {

// S rows at positions pos.. -> logits [logit_rows, V] of the last logit_rows rows (1 or S)
int chatcli_decode_batch(const Model* m, const Segment* segs, int64_t n_segs, const int64_t* tokens, float* logits,
                         int32_t threads) {
  if (check_segments(m, segs, n_segs)) return 1;
  try {  // no exception may cross into C (a failed allocation of the scratch space)
    if (segs[0].cache->kind == CACHE_BF16)
      forward<uint16_t>(*m, segs, n_segs, tokens, logits, threads);
    else
      forward<float>(*m, segs, n_segs, tokens, logits, threads);
  } catch (...) {
    return 2;
  }
  return 0;
}

// one sequence's rows: chatcli_decode_batch of one segment
int chatcli_decode(const Model* m, const Cache* c, const int64_t* tokens, int64_t rows, int64_t pos, float* logits,
                   int64_t logit_rows, int32_t threads) {
  const Segment one{c, pos, rows, logit_rows};
  return chatcli_decode_batch(m, &one, 1, tokens, logits, threads);
}

// a GGUF tensor's rows [n, row bytes] of ggml type `type` (k inputs) into the kernel's arrays (pack.h),
// zeroed by the caller; 0, or 1 for a type it does not pack
int chatcli_pack(int32_t type, const uint8_t* raw, int64_t n, int64_t k, uint8_t* w, uint8_t* hi, uint16_t* d,
                 uint16_t* m, uint8_t* sc, uint8_t* sm) {
  return pack_rows(type, raw, n, k, Packed{w, hi, d, m, sc, sm});
}

// whether K-quant projections of 16 rows or more run on AMX (project_amx.h): mode 0 never, 1 where the CPU
// has it, -1 leave as is; returns the state now (1: AMX runs). Tests compare the two paths with it.
int chatcli_amx(int32_t mode) {
#if defined(__AVX512F__)
  if (mode == 0) g_amx.store(0);
  if (mode == 1) g_amx.store(amx_available() ? 1 : 0);
  return amx_ready() ? 1 : 0;
#else
  (void)mode;
  return 0;
#endif
}

// y [rows, n] = x [rows, k] W^T through one projection, each row as if alone (for tests)
int chatcli_project(const Matrix* m, const float* x, int64_t rows, float* y, int32_t threads) {
  if (rows < 1) return 1;
  try {
    Scratch sc;
    sc.h.resize(rows * m->k);
    sc.size_activations(rows, m->kp);
    const Rows in = prepare(*m, x, m->k, rows, false, 0.f, sc);
#pragma omp parallel num_threads(threads)
    project(*m, in, y, m->n, false);
  } catch (...) {
    return 2;
  }
  return 0;
}

}  // extern "C"
