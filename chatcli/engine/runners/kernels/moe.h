// A mixture-of-experts FFN (Qwen3-MoE, Mixtral, gpt-oss; see decode.cpp): in place of a layer's gate_up and down, a
// router [experts, D] scores each row's normalised input, the row takes its `experts_used` best experts
// (softmax over every expert, the k largest, their weights normalised to sum 1 where the model says so:
// Qwen3-MoE's norm_topk_prob, Mixtral's softmax over the top-k logits), and adds their outputs, each expert
// a gated MLP of its own (gate_up [2 Fe, D], down [D, Fe]) times its weight.
//
// Only the chosen experts' weights are read. The step's (row, expert) pairs are grouped by expert, so an
// expert's weights are read once for all the rows of a call that chose it (a prompt's chunk: each expert's
// blocks once a chunk, unpacked once where it has enough rows), into the pair's own output row; a row then
// adds its experts' outputs in the order of its choice. Every number of a row still comes from that row
// alone in a fixed order: a draft gives the bits of single steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "step.h"

namespace {

// A row's choice: softmax of the router's logits [E] (plus its bias: gpt-oss), the k largest (the lower expert first where two are
// equal) into ids, their probabilities into weights, divided by their sum where `norm`. NaN logits (damaged
// weights) choose the lowest experts not taken: NaN outputs, never an expert out of range.
inline void route_row(const float* logits, const float* bias, int64_t E, int64_t k, bool norm, int32_t* ids,
                      float* weights) {
  thread_local std::vector<float> p, z;
  thread_local std::vector<char> taken;
  p.resize(E);
  z.assign(logits, logits + E);
  if (bias)
    for (int64_t e = 0; e < E; e++) z[e] += bias[e];
  taken.assign(E, 0);
  float top = z[0], sum = 0.f;
  for (int64_t e = 1; e < E; e++) top = std::max(top, z[e]);
  for (int64_t e = 0; e < E; e++) sum += p[e] = std::exp(z[e] - top);
  for (int64_t e = 0; e < E; e++) p[e] /= sum;
  float chosen = 0.f;
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
    taken[best] = 1;
    ids[j] = static_cast<int32_t>(best);
    weights[j] = p[best];
    chosen += p[best];
  }
  if (norm)
    for (int64_t j = 0; j < k; j++) weights[j] /= chosen;
}

// The step's (row, expert) pairs: pair a = s k + j is row s's j-th choice; grouped by expert, expert e's
// pairs hold the places start[e]..start[e + 1] of the gathered buffers, rows in order; place[a] is pair a's
struct Routes {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int64_t> start, place;
  std::vector<int32_t> expert;  // per place: its pair's expert

  // every row's choice from the router's logits [S, E] (and its bias, or null), then the places (by one thread)
  void choose(const Model& m, const float* logits, int64_t S, const float* bias = nullptr) {
    const int64_t E = m.experts, k = m.experts_used;
    ids.resize(S * k), weights.resize(S * k), place.resize(S * k), expert.resize(S * k);
    for (int64_t s = 0; s < S; s++)
      route_row(logits + s * E, bias, E, k, m.norm_topk != 0, &ids[s * k], &weights[s * k]);
    start.assign(E + 1, 0);
    for (int64_t a = 0; a < S * k; a++) start[ids[a] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t a = 0; a < S * k; a++) place[a] = next[ids[a]]++;
    for (int64_t a = 0; a < S * k; a++) expert[place[a]] = ids[a];
  }

  int64_t count(int64_t e) const { return start[e + 1] - start[e]; }
};

// The rows `first`..first + count of `rows` (a projection over m's kind prepared them all), as Rows of their own
inline Rows rows_from(const Rows& rows, const Matrix& m, int64_t first, int64_t count) {
  Rows part = rows;
  part.count = count;
  part.x = rows.x + first * rows.ldx;
  part.xq = rows.xq + first * m.kp;
  part.xs = rows.xs + first;
  part.xz = rows.xz + first;
  part.gs = rows.gs + first * (m.kp / 32);
  part.gsum = rows.gsum + first * (m.kp / 32);
  part.hsum = rows.hsum + first * (m.kp / 16);
  return part;
}

// row s's experts' outputs (outs [places, D]) times their weights, summed in the order of its choice into t [D]
// (then added to the row's x: the same operations in both forwards)
// (each expert's down bias added to its output first where `bias` [E, D] is not null: gpt-oss)
inline void weigh_experts(const float* outs, const Routes& routes, int64_t s, int64_t k, int64_t D, float* t,
                          const float* bias = nullptr) {
  std::fill(t, t + D, 0.f);
  for (int64_t j = 0; j < k; j++) {
    const float w = routes.weights[s * k + j];
    const float* o = outs + routes.place[s * k + j] * D;
    if (bias) {
      const float* b = bias + routes.ids[s * k + j] * D;
      for (int64_t i = 0; i < D; i++) t[i] += w * (o[i] + b[i]);
    } else {
      for (int64_t i = 0; i < D; i++) t[i] += w * o[i];
    }
  }
}

// the experts' down biases [E, D] (after their gate_up ones), or null
inline const float* down_bias(const Model& m, const Layer& layer) {
  return layer.experts_bias ? layer.experts_bias + m.experts * 2 * m.expert_ffn : nullptr;
}

// place `at`'s gate_up output row [2 Fe] plus its expert's gate_up bias (gpt-oss), then act(gate) * up in place
inline void expert_act_row(const Model& m, const Layer& layer, const Routes& routes, int64_t at, float* row) {
  const int64_t Fe = m.expert_ffn;
  if (layer.experts_bias) {
    const float* b = layer.experts_bias + routes.expert[at] * 2 * Fe;
    for (int64_t i = 0; i < 2 * Fe; i++) row[i] += b[i];
  }
  act_row(m, row, Fe);
}

// One projection of a list run as one split (a call's chosen experts', few rows each): a matrix that is not
// WEIGHT_PARTS, its rows, where its outputs go
struct Job {
  const Matrix* w;
  Rows in;
  float* y;
  int64_t ldy;
};

// `w` over rows `in` into y as jobs: a WEIGHT_PARTS' parts each into its columns
inline void add_jobs(std::vector<Job>& jobs, const Matrix& w, const Rows& in, float* y, int64_t ldy) {
  if (w.kind != WEIGHT_PARTS) return jobs.push_back({&w, in, y, ldy});
  int64_t at = 0;
  for (int64_t i = 0; i < w.n_parts; i++) {
    add_jobs(jobs, w.parts[i], in, y + at, ldy);
    at += w.parts[i].n;
  }
}

// A run of one job's units (unit_width outputs each): u0..u1
struct JobItem {
  int64_t job, u0, u1;
};

// the jobs' units in runs, about `items` of them (one more a job at most), the same list for every thread
inline std::vector<JobItem> job_items(const std::vector<Job>& jobs, int64_t items) {
  const auto units = [](const Job& j) { return (j.w->n + unit_width(*j.w) - 1) / unit_width(*j.w); };
  int64_t total = 0;
  for (const Job& j : jobs) total += units(j);
  const int64_t per = std::max<int64_t>(1, total / std::max<int64_t>(1, items));
  std::vector<JobItem> out;
  for (int64_t j = 0; j < static_cast<int64_t>(jobs.size()); j++)
    for (int64_t u = 0; u < units(jobs[j]); u += per) out.push_back({j, u, std::min(units(jobs[j]), u + per)});
  return out;
}

// an item's units, every row of its job, into y (unit u's outputs of row s at y[s ldy + u width]): each row in
// passes of rows as project() splits them (a K-quant's codes unpacked once a unit where the rows are enough), so
// the same bits
inline void project_item(const std::vector<Job>& jobs, const JobItem& it, float* y, int64_t ldy) {
  const Job& job = jobs[it.job];
  const auto units = [&](auto, int64_t, auto work) {
    for (int64_t u = it.u0; u < it.u1; u++) work(u, 0, job.in.count);
  };
  if (raw_rows(*job.w)) return raw_passes(*job.w, job.in, y, ldy, false, units);
  if (unpacked_passes(*job.w, job.in, y, ldy, false, units)) return;
  project_units(*job.w, job.in, y, ldy, false, [&](auto pass, int64_t, auto work) {
    for (int64_t u = it.u0; u < it.u1; u++)
      each_row_pass<decltype(pass)::value>(job.in, [&](auto r, int64_t s) { work(u, r, s); });
  });
}

// each expert that rows chose: project(w(e), its pairs' rows of `in`, into y's rows from its first place), all
// as one split of the team (one barrier, not one a projection; an item a run of an expert's units, taken as
// threads come free: experts have more rows or fewer); where the CPU has AMX, a prompt's chunk (kAmxCallRows rows
// or more) goes expert by expert, each on its tiles
constexpr int64_t kAmxCallRows = 16;
template <typename Of>
void project_experts(const Routes& routes, int64_t E, int64_t S, Of w, const Rows& in, float* y, int64_t ldy) {
#if defined(__AVX512F__)
  if (S >= kAmxCallRows && amx_ready()) {
    for (int64_t e = 0; e < E; e++)
      if (routes.count(e)) project(w(e), rows_from(in, w(e), routes.start[e], routes.count(e)), y + routes.start[e] * ldy, ldy, false);
    return;
  }
#endif
  (void)S;
  std::vector<Job> jobs;
  for (int64_t e = 0; e < E; e++)
    if (routes.count(e)) add_jobs(jobs, w(e), rows_from(in, w(e), routes.start[e], routes.count(e)), y + routes.start[e] * ldy, ldy);
  const std::vector<JobItem> items = job_items(jobs, omp_get_num_threads() * 8);
#pragma omp for schedule(dynamic, 1)
  for (size_t i = 0; i < items.size(); i++) {
    const Job& job = jobs[items[i].job];
    project_item(jobs, items[i], job.y, job.ldy);
  }
}

// What the experts' stages share in a step: the router's logits, the routes, the pairs' gathered inputs
// (moe.h [S k, D]), their gate_up outputs (moe.gu [S k, 2 Fe]) and their outputs (moe.post [S k, D])
struct Experts {
  std::vector<float> logits;
  Routes routes;
  Scratch sc;

  void size(const Model& m, int64_t S) {
    if (m.experts < 1) return;
    const int64_t pairs = S * m.experts_used, D = m.hidden, Fe = m.expert_ffn;
    logits.resize(S * m.experts);
    sc.h.resize(pairs * D);
    sc.gu.resize(pairs * 2 * Fe);
    sc.post.resize(pairs * D);
    sc.size_activations(pairs, std::max(D, Fe));
  }
};

// row `from`'s prepared activations (prepare_row's: int8 codes and scales, for `m`'s kind) copied to row `to`
inline void copy_prepared_row(const Matrix& m, int64_t from, int64_t to, Scratch& sc) {
  if (m.kind != WEIGHT_I8 && !grouped(m)) return;  // float kinds read the row itself
  std::memcpy(&sc.xq[to * m.kp], &sc.xq[from * m.kp], m.kp);
  if (m.kind == WEIGHT_I8) sc.xs[to] = sc.xs[from], sc.xz[to] = sc.xz[from];
  if (grouped(m)) {
    const int64_t groups = m.kp / 32;
    std::memcpy(&sc.gs[to * groups], &sc.gs[from * groups], groups * sizeof(float));
    std::memcpy(&sc.gsum[to * groups], &sc.gsum[from * groups], groups * sizeof(float));
    if (reads_hsum(m)) std::memcpy(&sc.hsum[to * (m.kp / 16)], &sc.hsum[from * (m.kp / 16)], m.kp / 16 * sizeof(int32_t));
  }
}

// each pair's normalised row (h: the router's prepared rows, `ldh` apart) at its place in mc.h, prepared there
// for the experts' gate_up (`first`: any of them), the pairs of rows s0..s1: a row's k pairs hold the same
// input, prepared once (its first pair's place) and copied to the others' places (the same bytes)
inline void gather_pairs(const Model& m, const Routes& routes, const float* h, int64_t ldh, const Matrix& first,
                         int64_t s0, int64_t s1, Scratch& mc) {
  const int64_t D = m.hidden, k = m.experts_used;
  for (int64_t s = s0; s < s1; s++) {
    const int64_t head = routes.place[s * k];
    for (int64_t j = 0; j < k; j++) {
      const int64_t at = routes.place[s * k + j];
      std::memcpy(&mc.h[at * D], h + s * ldh, D * sizeof(float));
      if (j == 0)
        prepare_row(first, mc.h.data(), D, at, false, m.eps, mc);
      else
        copy_prepared_row(first, head, at, mc);
    }
  }
}

// x [S, D] += the layer's experts over the step's rows (times the residual scale: Granite's), on an OpenMP team with
// a barrier after each stage (called by every thread); sc.h holds the router's normalised rows after its projection
inline void experts_barrier(const Model& m, const Layer& layer, int64_t S, Scratch& sc, Experts& ex) {
  const int64_t D = m.hidden, E = m.experts, k = m.experts_used, Fe = m.expert_ffn, pairs = S * k;
  const Matrix& router = *layer.router;
  const Matrix* gate_up = layer.experts;
  const Matrix* down = layer.experts + E;
#pragma omp for schedule(static)
  for (int64_t s = 0; s < S; s++) prepare_row(router, sc.x.data(), D, s, true, m.eps, sc);
  project(router, rows_for(router, sc.x.data(), D, S, true, sc), ex.logits.data(), E, false);
#pragma omp single
  ex.routes.choose(m, ex.logits.data(), S, layer.router_bias);
  Scratch& mc = ex.sc;
#pragma omp for schedule(static)
  for (int64_t s = 0; s < S; s++) gather_pairs(m, ex.routes, sc.h.data(), router.k, gate_up[0], s, s + 1, mc);
  const Rows in = rows_for(gate_up[0], mc.h.data(), D, pairs, false, mc);
  project_experts(ex.routes, E, S, [&](int64_t e) -> const Matrix& { return gate_up[e]; }, in, mc.gu.data(), 2 * Fe);
#pragma omp for schedule(static)
  for (int64_t at = 0; at < pairs; at++) {
    expert_act_row(m, layer, ex.routes, at, &mc.gu[at * 2 * Fe]);
    prepare_row(down[0], mc.gu.data(), 2 * Fe, at, false, m.eps, mc);
  }
  const Rows mid = rows_for(down[0], mc.gu.data(), 2 * Fe, pairs, false, mc);
  project_experts(ex.routes, E, S, [&](int64_t e) -> const Matrix& { return down[e]; }, mid, mc.post.data(), D);
  thread_local std::vector<float> t;
  t.resize(D);
#pragma omp for schedule(static)
  for (int64_t s = 0; s < S; s++) {
    weigh_experts(mc.post.data(), ex.routes, s, k, D, t.data(), down_bias(m, layer));
    post_row(m, t.data(), nullptr, D);  // the residual scale (GraniteMoE's), where it is not 1
    for (int64_t i = 0; i < D; i++) sc.x[s * D + i] += t[i];
  }
}

}  // namespace
