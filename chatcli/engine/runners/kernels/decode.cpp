// The lean runner's decode step in one call, built for AVX-512 with VNNI or for AVX2 with FMA and
// F16C (kernels/__init__.py: BUILDS), the same stages on 16- or 8-lane vectors.
//
// `chatcli_decode` runs S rows of one sequence (a prompt chunk, a sampled token, or a token and the
// draft that follows it), `chatcli_decode_batch` the rows of several sequences (`Segment`s, each with its
// own KV cache and positions: every weight read once for all of them), through every layer of a decoder of a lean family (Llama, and the extras of Mistral, Qwen2/3,
// Phi-3, Gemma 2/3, SmolLM3, Granite and OLMo 2 where a layer has them: q/k/v biases, q/k norms (of each head
// or of all of q and k), a sliding window, its own rope table or none, sandwich norms or norms on the outputs
// alone, a residual scale, GeGLU, soft-capped scores; see families.py; a mixture of experts in place of
// the MLP: Qwen3-MoE's, Mixtral's, moe.h) and writes their keys and values into the KV cache
// at positions pos..pos+S-1. It computes what `LeanRunner.decode_one_token` computes
// (RMSNorm weights folded into the projections, q/k rows in adjacent rope pairs), but with
// no per-op dispatch: one OpenMP team for the whole step, a barrier between stages (a call of fewer
// than 16 rows on a negative number of threads runs its stages without barriers: tolerant.h; step.h
// holds what both share). With a
// bf16 cache, keys and values are stored in bf16 but q and the attention output stay fp32
// (the torch path rounds those to bf16 too).
//
// Every number of a row is computed from that row alone, by one thread (but a decode step's long row's attention:
// its key chunks by several, folded after in their order, step.h's Unit), in a fixed order:
// int8 activations get a scale and zero point per row (q4 / q8: a scale per row and group), a dot product sums in int32 (exact
// in any order), an fp32 projection accumulates over k in order for each output. So the
// logits of a row do not depend on how many rows share the call or on the thread count:
// checking a draft gives the numbers that decoding its tokens one by one would give.
//
// Projections (fp32 panels, int8, q4 / q8 blocks, K-quants) are in project.h, Q3_K and Q2_K in project_low.h;
// where the CPU has AMX, a K-quant projection of 16 rows or more (a prompt's chunk) runs on its tiles
// (project_amx.h), to the same bits; else its passes of rows read each block's codes unpacked once (steps.h's
// project_unpacked). The AVX2 build's K-quants are in project_kquant_avx2.h.
// The KV cache holds, per layer, keys [KV, capacity/16, hd, 16] (blocks of 16 positions, transposed) and
// values [KV, capacity, hd], in fp32, bf16 or fp16 (each rounded to nearest even) or q8_0 (int8 codes with an fp16 scale per
// 32 dimensions of a position, quantized as a position is written; common.h: Q8), of positions base..base+capacity-1;
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
#include <cstdlib>
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
#include "project_kquant_avx2.h"
#include "project_low_avx2.h"
#include "simd_avx2.h"
#endif
#include "common.h"
#include "pack.h"
#include "steps.h"
#include "step.h"
#include "moe.h"
#include "tolerant.h"

namespace {

// rows of src [S, k] -> prepare_row each, every row by one thread (called by every thread of a team; ends
// with its barrier); the Rows a projection reads
Rows prepare(const Matrix& m, const float* src, int64_t lds, int64_t count, bool norm, float eps, Scratch& sc) {
#pragma omp for schedule(static)
  for (int64_t s = 0; s < count; s++) prepare_row(m, src, lds, s, norm, eps, sc);
  return rows_for(m, src, lds, count, norm, sc);
}

// x += in · W^T, or, with a sandwich norm (Gemma, OLMo 2), a residual scale (Granite) or a bias (gpt-oss's
// attention output), x += post_row(in · W^T)
// (ends with a barrier)
void project_residual(const Model& m, const Matrix& w, const Rows& in, const float* norm, Scratch& sc,
                      const float* bias = nullptr) {
  const int64_t D = w.n;
  if (!norm && !bias && m.residual_scale == 1.f) {
    project(w, in, sc.x.data(), D, true);
    return;
  }
  project(w, in, sc.post.data(), D, false);
#pragma omp for schedule(static)
  for (int64_t s = 0; s < in.count; s++) {
    float* y = &sc.post[s * D];
    post_row(m, y, norm, D, bias);
    for (int64_t i = 0; i < D; i++) sc.x[s * D + i] += y[i];
  }
}

// The step's rows through every layer with the team at a barrier after each stage; logits [sum of
// logit_rows, V]: each segment's last logit_rows rows in turn
template <typename T>
void forward_barrier(Step& step, float* logits, int threads) {
  const Model& m = step.m;
  Scratch& sc = step.sc;
  const int64_t D = step.D, H = step.H, hd = step.hd, F = step.F, n_qkv = step.n_qkv, S = step.S, L = step.L;
  std::vector<float> last(step.n_segs > 1 ? L * D : 0);  // the rows with logits, gathered (several segments)
  Experts experts;  // a mixture of experts' buffers (moe.h), where the model has one
  experts.size(m, S);

  // Every stage splits its rows (or output blocks, or heads) over the team; a barrier ends each.
#pragma omp parallel num_threads(threads)
  {
    float* scratch = sc.scores.data() + static_cast<size_t>(omp_get_thread_num()) * step.scratch_per_thread;
    for (int64_t l = 0; l < m.n_layers; l++) {
      const Layer& layer = m.layers[l];
      Rows rows = prepare(layer.qkv, sc.x.data(), D, S, m.pre_norm, m.eps, sc);
      project(layer.qkv, rows, sc.qkv.data(), n_qkv, false);
#pragma omp for schedule(static)
      for (int64_t s = 0; s < S; s++) {  // bias, q/k norms, rope on q and k; k and v into the cache
        step.rope_qkv(layer, s, &sc.qkv[s * n_qkv]);
        step.store_kv<T>(l, s, &sc.qkv[s * n_qkv]);
      }
      const AttentionSet& set = step.set(l);
      const int64_t n_tasks = static_cast<int64_t>(set.tasks.size()), n_units = static_cast<int64_t>(set.units.size());
#pragma omp for schedule(static, 1)  // interleaved: a causal row's cost grows with its position
      for (int64_t i = 0; i < n_tasks; i++) {
        const Task& t = set.tasks[i];
        if (t.unit < 0)
          step.attend_task<T>(l, i, &sc.qkv[t.s * n_qkv], scratch, &sc.att[(t.s * H + t.head) * hd], H * hd);
        else
          step.attend_task<T>(l, i, &sc.qkv[t.s * n_qkv], scratch, &step.partials[step.part_offset(set, t)], 0);
      }
      if (n_units) {  // a decode step's long rows: their chunks folded
#pragma omp for schedule(static)
        for (int64_t u = 0; u < n_units; u++) {
          const Unit& unit = set.units[u];
          step.fold_unit(l, u, scratch, &sc.att[(unit.s * H + unit.head) * hd], H * hd);
        }
      }
      rows = prepare(layer.out, sc.att.data(), H * hd, S, false, m.eps, sc);
      project_residual(m, layer.out, rows, layer.post_attn_norm, sc, layer.out_bias);
      if (layer.router) {
        experts_barrier(m, layer, S, sc, experts);
        continue;
      }
      rows = prepare(layer.gate_up, sc.x.data(), D, S, m.pre_norm, m.eps, sc);
      project(layer.gate_up, rows, sc.gu.data(), 2 * F, false);
#pragma omp for schedule(static)
      for (int64_t s = 0; s < S; s++) act_row(m, &sc.gu[s * 2 * F], F);  // act(gate) * up, in place of gate
      rows = prepare(layer.down, sc.gu.data(), 2 * F, S, false, m.eps, sc);
      project_residual(m, layer.down, rows, layer.post_ffn_norm, sc);
    }
    const float* x = sc.x.data() + (S - L) * D;  // one segment: its last rows, as they are
    if (step.n_segs > 1) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < L; i++) std::memcpy(&last[i * D], &sc.x[step.picked[i] * D], D * sizeof(float));
      x = last.data();
    }
    const Rows rows = prepare(m.head, x, D, L, true, m.eps, sc);
    project(m.head, rows, logits, m.vocab, false);
  }
}

// The rows of n_segs sequences (tokens: every segment's in turn) through every layer, each row with its
// own cache and position; logits [sum of logit_rows, V]: each segment's last logit_rows rows in turn.
// `threads` < 0: as many, and a call of a few rows (a decode step) without barriers, on pool.h's threads
// while the caller's sleeps (tolerant.h): slower than barriers on an idle machine, far faster beside a busy
// process; runners/team.py learns which (and how many threads) from the steps' times.
template <typename T>
void forward(const Model& m, const Segment* segs, int64_t n_segs, const int64_t* tokens, float* logits, int threads) {
  const int width = std::max(1, std::abs(threads));
  Step step(m, segs, n_segs, tokens, width);
  if (threads < 0 && tolerant(step.S, width))
    forward_tolerant<T>(step, logits, width);
  else
    forward_barrier<T>(step, logits, width);
}

// 0 where every segment's rows fit its cache (and the model's heads the kernel's), else 1
int check_segments(const Model* m, const Segment* segs, int64_t n_segs) {
  if (n_segs < 1 || m->head_dim % 16 != 0 || m->head_dim > kMaxHeadDim || (!m->embed && !m->embed_rows)) return 1;
  if (!segs[0].cache || segs[0].cache->kind < CACHE_F32 || segs[0].cache->kind > CACHE_F16) return 1;
  if (segs[0].cache->kind == CACHE_Q8 && m->head_dim % 32 != 0) return 1;  // a scale per 32 dimensions
  for (int64_t l = 0; l < m->n_layers; l++) {  // a mixture of experts: a router of one output per expert, k of them
    const Layer& layer = m->layers[l];
    if (layer.router && (m->experts_used < 1 || m->experts_used > m->experts || m->expert_ffn < 1 ||
                         layer.router->n != m->experts || !layer.experts))
      return 1;
  }
  for (int64_t j = 0; j < n_segs; j++) {
    const Segment& g = segs[j];
    if (g.rows < 1 || g.logit_rows < 1 || g.logit_rows > g.rows || !g.cache || g.cache->kind != segs[0].cache->kind)
      return 1;
    for (int64_t l = 0; l < m->n_layers; l++) {  // each layer holds what its rows write and read
      const int64_t base = g.cache->base[l], window = m->layers[l].window;
      const int64_t first = first_key(g.pos + 1, window);
      if (g.cache->capacity[l] % 16 != 0 || base % 16 != 0 || base < 0 || base > first ||
          g.pos + g.rows - base > g.cache->capacity[l])
        return 1;
    }
  }
  return 0;
}

}  // namespace

extern "C" {

// S rows at positions pos.. -> logits [logit_rows, V] of the last logit_rows rows (1 or S); threads < 0: as
// many, a decode step without barriers (see forward)
int chatcli_decode_batch(const Model* m, const Segment* segs, int64_t n_segs, const int64_t* tokens, float* logits,
                         int32_t threads) {
  if (check_segments(m, segs, n_segs)) return 1;
  try {  // no exception may cross into C (a failed allocation of the scratch space)
    if (segs[0].cache->kind == CACHE_BF16)
      forward<uint16_t>(*m, segs, n_segs, tokens, logits, threads);
    else if (segs[0].cache->kind == CACHE_Q8)
      forward<Q8>(*m, segs, n_segs, tokens, logits, threads);
    else if (segs[0].cache->kind == CACHE_F16)
      forward<F16>(*m, segs, n_segs, tokens, logits, threads);
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
#if defined(__AVX512F__)
  if (pack_kquant_rows(type, raw, n, k, Packed{w, hi, d, m, sc, sm})) return 0;  // Q4_K, Q6_K: project_raw.h
#endif
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

// whether calls of fewer than 16 rows on a negative number of threads run without barriers (tolerant.h):
// mode 0 never, 1 yes, -1 leave as is; returns the state now. stall_us >= 0 (tests): the team's last
// thread sleeps this long before each of its commits, so that the others do its items (-1: as is).
int chatcli_tolerant(int32_t mode, int64_t stall_us) {
  if (mode == 0 || mode == 1) g_tolerant.store(mode);
  if (stall_us >= 0) g_stall_us.store(stall_us);
  return tolerant_state();
}

// the items a thread of a tolerant team has done from another's range since the library loaded (tests)
int64_t chatcli_taken_over() { return g_taken_over.load(); }

// the split units (step.h: Unit) whose chunks a decode step folded since the library loaded (tests)
int64_t chatcli_split_units() { return g_split_units.load(); }

// tests: thread t of every step without barriers throws at its start (-1: none); the step fails (status 2)
void chatcli_fail_thread(int32_t t) { g_fail_thread.store(t); }

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
