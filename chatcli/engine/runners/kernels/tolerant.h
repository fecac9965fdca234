// A decode step whose threads never wait at a barrier for one that the scheduler has taken off its core.
//
// decode.cpp's barrier forward ends each of its stages (about eight a layer) at a barrier of the team.
// When another process keeps a core busy, the scheduler takes one of our threads off its core for a time
// slice (milliseconds) now and then, and every other thread waits at the next barrier until it is back.
// Here, for a call of fewer than kTolerantRows rows (decode steps, drafts, serve's batches) on a negative
// number of threads (runners/team.py picks it where another process keeps a core busy), a stage's
// items (a projection's output blocks, attention's tasks, the rows' cache stores) are split over the
// threads in ranges, and a thread that has done its own range does the items of a thread that is not
// there, from the back of that range, itself:
//  - an item is computed into the thread's own buffers, then committed (copied or added into the
//    buffers the threads share) by exactly one thread: the one whose compare-and-swap on the item's
//    state wins (Stages::take). A thread that comes back late loses, and what it computed from buffers
//    that have changed since reaches nothing;
//  - a stage's commits never write what its items (or the per-row work before it) read, and a thread
//    goes on to a stage only once every item of the one before is committed: an item that commits was
//    computed from the finished stages' buffers;
//  - the small per-row work between stages (norms and int8 rows, bias and rope, the activation) is done
//    by every thread for every row into its own buffers: no stage, no wait;
//  - item i committed in stage k: state[i] = 4k + 3 (4k + 2 while it is copied); a thread in stage k:
//    progress = k; a stage is done once a thread has gone past it.
// A thread waits for another's items only while that thread is in the stage and its next item comes
// within a few items' time; an idle machine runs as with barriers, with fewer stages. Every row is
// still computed alone and in the same order: the same bits as the barrier forward.
// The threads are pool.h's (not an OpenMP team) while the caller's sleeps; the call returns once every
// one has returned.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "moe.h"
#include "pool.h"
#include "step.h"

namespace {

std::atomic<int> g_tolerant{-1};      // 1 on, 0 every call with barriers ($CHATCLI_TOLERANT=off, chatcli_tolerant)
std::atomic<int64_t> g_stall_us{0};   // tests: the team's last thread sleeps this long before each commit
std::atomic<int64_t> g_taken_over{0};  // items a thread did from another's range (chatcli_taken_over)
std::atomic<int> g_fail_thread{-1};    // tests: this thread of a step throws at its start (chatcli_fail_thread)

constexpr int64_t kTolerantRows = 16;    // calls of fewer rows run here (AMX's prompt chunks do not)
constexpr int64_t kItemsPerThread = 8;   // a projection's items, per thread
constexpr int64_t kPatienceNs = 10000;   // the least wait for another thread's next item

inline int tolerant_state() {
  int state = g_tolerant.load(std::memory_order_relaxed);
  if (state < 0) {
    const char* env = std::getenv("CHATCLI_TOLERANT");
    state = (env && std::strcmp(env, "off") == 0) ? 0 : 1;
    g_tolerant.store(state, std::memory_order_relaxed);
  }
  return state;
}

// whether a call of `rows` rows on `threads` threads runs here
inline bool tolerant(int64_t rows, int threads) { return threads > 1 && rows < kTolerantRows && tolerant_state() == 1; }

class Stages {
 public:
  Stages(int threads, int64_t items) : threads_(threads), progress_(threads), state_(items) {
    for (auto& s : state_) s.store(0, std::memory_order_relaxed);
  }

  int threads() const { return threads_; }

  // whether stage k is done (a thread has gone past it): a thread that the scheduler held back skips
  // its per-row work for the stages the others have done
  bool done(int64_t k) const { return gone_past(k); }

  // The next stage of thread t (`stage` counts them; every thread runs the same sequence): n items, each
  // computed by compute(i) into the thread's own buffers and committed by commit(i) by one thread.
  // Returns once every item is committed, or the stage is known to be done.
  template <typename Compute, typename Commit>
  void run(int t, int64_t& stage, int64_t n, Compute compute, Commit commit) {
    const int64_t k = ++stage;
    if (gone_past(k)) return;
    progress_[t].stage.store(k, std::memory_order_release);
    const int64_t lo = begin(t, n), hi = begin(t + 1, n), start = now_ns();
    for (int64_t i = lo; i < hi; i++) {
      if (taken(i, k)) continue;
      if (gone_past(k)) return;
      take(t, i, k, compute, commit);
    }
    const int64_t patience = std::max<int64_t>(kPatienceNs, hi > lo ? 4 * (now_ns() - start) / (hi - lo) : 0);
    for (int d = 1; d <= threads_; d++) {  // every range, ours last: wait for its thread, or do its items
      const int u = (t + d) % threads_;
      int64_t front = begin(u, n), back = begin(u + 1, n), deadline = now_ns() + patience;
      for (int spin = 1; front < back; spin++) {
        if (committed(front, k)) {  // its thread goes on
          front++;
          deadline = now_ns() + patience;
        } else if (committed(back - 1, k)) {
          back--;
        } else if (gone_past(k)) {
          return;
        } else if (!taken(back - 1, k) && (progress_[u].stage.load(std::memory_order_acquire) < k ||
                                           (spin % 32 == 0 && now_ns() > deadline))) {
          take(t, back - 1, k, compute, commit);  // its thread is not in the stage, or has stopped
          if (u != t) g_taken_over.fetch_add(1, std::memory_order_relaxed);
        } else {
          relax();
        }
      }
    }
  }

 private:
  struct alignas(64) Progress {
    std::atomic<int64_t> stage{0};
  };

  int64_t begin(int t, int64_t n) const { return n * t / threads_; }

  bool committed(int64_t i, int64_t k) const { return state_[i].load(std::memory_order_acquire) >= 4 * k + 3; }
  bool taken(int64_t i, int64_t k) const { return state_[i].load(std::memory_order_acquire) >= 4 * k + 2; }

  bool gone_past(int64_t k) const {
    for (const Progress& p : progress_)
      if (p.stage.load(std::memory_order_acquire) > k) return true;
    return false;
  }

  template <typename Compute, typename Commit>
  void take(int t, int64_t i, int64_t k, Compute& compute, Commit& commit) {
    compute(i);
    const int64_t stall = g_stall_us.load(std::memory_order_relaxed);
    if (stall > 0 && t == threads_ - 1) std::this_thread::sleep_for(std::chrono::microseconds(stall));
    int64_t s = state_[i].load(std::memory_order_acquire);
    if (s >= 4 * k + 2 || !state_[i].compare_exchange_strong(s, 4 * k + 2, std::memory_order_acq_rel)) return;
    commit(i);
    state_[i].store(4 * k + 3, std::memory_order_release);
  }

  int threads_;
  std::vector<Progress> progress_;
  std::vector<std::atomic<int64_t>> state_;
};

// a thread's own buffers: its prepared rows, its roped qkv rows, its activation rows, an item's outputs
struct Own {
  Scratch sc;
  std::vector<float> qkv, gu, last, out;
};

// y [S, ldy] (+)= in · W^T as stages of thread t: each item a run of units (unit_width outputs) into own.out,
// then copied (added, with accumulate) into y; the parts of WEIGHT_PARTS one stage each
void project_stage(Stages& stages, int t, int64_t& stage, const Matrix& w, const Rows& in, float* y, int64_t ldy,
                   bool accumulate, std::vector<float>& out) {
  if (w.kind == WEIGHT_PARTS) {
    int64_t at = 0;
    for (int64_t i = 0; i < w.n_parts; i++) {
      project_stage(stages, t, stage, w.parts[i], in, y + at, ldy, accumulate, out);
      at += w.parts[i].n;
    }
    return;
  }
  const int64_t width = unit_width(w), units = (w.n + width - 1) / width;
  const int64_t n = std::min<int64_t>(units, stages.threads() * kItemsPerThread);
  const auto first = [&](int64_t i) { return i * units / n; };  // item i: units first(i)..first(i + 1)
  const auto compute = [&](int64_t i) {
    const int64_t u0 = first(i), u1 = first(i + 1), ldo = (u1 - u0) * width;
    if (out.size() < static_cast<size_t>(in.count * ldo)) out.resize(in.count * ldo);
    float* o = out.data() - u0 * width;  // unit u's outputs of row s at out[s * ldo + (u - u0) * width]
    project_units(w, in, o, ldo, false, [&](auto pass, int64_t, auto work) {
      for (int64_t u = u0; u < u1; u++)
        each_row_pass<decltype(pass)::value>(in, [&](auto r, int64_t s) { work(u, r, s); });
    });
  };
  const auto commit = [&](int64_t i) {
    const int64_t c0 = first(i) * width, ldo = (first(i + 1) - first(i)) * width;
    const int64_t cols = std::min(first(i + 1) * width, w.n) - c0;
    for (int64_t s = 0; s < in.count; s++) {
      float* dst = y + s * ldy + c0;
      const float* src = out.data() + s * ldo;
      if (accumulate)
        for (int64_t c = 0; c < cols; c++) dst[c] += src[c];
      else
        std::memcpy(dst, src, cols * sizeof(float));
    }
  };
  stages.run(t, stage, n, compute, commit);
}

// the jobs as one stage of thread t: each item (job_items) a run of one job's units into own.out, then copied
// into its y
void project_jobs_stage(Stages& stages, int t, int64_t& stage, const std::vector<Job>& jobs, std::vector<float>& out) {
  const std::vector<JobItem> items = job_items(jobs, stages.threads() * kItemsPerThread);
  const auto compute = [&](int64_t i) {
    const JobItem& it = items[i];
    const Job& job = jobs[it.job];
    const int64_t width = unit_width(*job.w), ldo = (it.u1 - it.u0) * width;
    if (out.size() < static_cast<size_t>(job.in.count * ldo)) out.resize(job.in.count * ldo);
    project_item(jobs, it, out.data() - it.u0 * width, ldo);  // unit u's row s at out[s ldo + (u - u0) width]
  };
  const auto commit = [&](int64_t i) {
    const JobItem& it = items[i];
    const Job& job = jobs[it.job];
    const int64_t width = unit_width(*job.w), ldo = (it.u1 - it.u0) * width;
    const int64_t cols = std::min(it.u1 * width, job.w->n) - it.u0 * width;
    for (int64_t s = 0; s < job.in.count; s++)
      std::memcpy(job.y + s * job.ldy + it.u0 * width, out.data() + s * ldo, cols * sizeof(float));
  };
  stages.run(t, stage, static_cast<int64_t>(items.size()), compute, commit);
}

// A thread's own for a mixture's experts (moe.h): its routes (every thread the same), its gathered and prepared
// rows, its copy of the pairs' gate_up outputs
struct OwnExperts {
  Routes routes;
  Scratch sc;
  std::vector<float> gu;

  void size(const Model& m, int64_t S) {
    if (m.experts < 1) return;
    const int64_t pairs = S * m.experts_used;
    sc.h.resize(pairs * m.hidden);
    sc.size_activations(pairs, std::max(m.hidden, m.expert_ffn));
    gu.resize(pairs * 2 * m.expert_ffn);
  }
};

// x += layer's experts (moe.h) as stages of thread t: the router, every chosen expert's gate_up, their downs, each
// row's weighted sum added (times the residual scale: Granite's). The per-row work (the router's rows, the routes,
// the pairs' rows, the activation) is done by every thread into its own, unless the stages that read it are done.
void experts_stages(Stages& stages, int t, int64_t& stage, const Model& m, const Layer& layer, int64_t S, Scratch& sc,
                    Experts& shared, Own& own, OwnExperts& mine) {
  const int64_t D = m.hidden, E = m.experts, k = m.experts_used, Fe = m.expert_ffn, pairs = S * k;
  const Matrix& router = *layer.router;
  const Matrix* gate_up = layer.experts;
  const Matrix* down = layer.experts + E;
  const Routes& routes = mine.routes;
  const bool behind = stages.done(stage + (router.kind == WEIGHT_PARTS ? router.n_parts : 1) + 3);
  if (!behind)
    for (int64_t s = 0; s < S; s++) prepare_row(router, sc.x.data(), D, s, true, m.eps, own.sc);
  const Rows rows = rows_for(router, sc.x.data(), D, S, true, own.sc);
  project_stage(stages, t, stage, router, rows, shared.logits.data(), E, false, own.out);
  std::vector<Job> jobs;
  if (!behind) {
    mine.routes.choose(m, shared.logits.data(), S, layer.router_bias);
    gather_pairs(m, routes, own.sc.h.data(), router.k, gate_up[0], 0, S, mine.sc);
    const Rows in = rows_for(gate_up[0], mine.sc.h.data(), D, pairs, false, mine.sc);
    for (int64_t e = 0; e < E; e++)
      if (routes.count(e))
        add_jobs(jobs, gate_up[e], rows_from(in, gate_up[e], routes.start[e], routes.count(e)),
                 &shared.sc.gu[routes.start[e] * 2 * Fe], 2 * Fe);
  }
  project_jobs_stage(stages, t, stage, jobs, own.out);
  jobs.clear();
  if (!behind) {
    for (int64_t at = 0; at < pairs; at++) {
      std::memcpy(&mine.gu[at * 2 * Fe], &shared.sc.gu[at * 2 * Fe], 2 * Fe * sizeof(float));
      expert_act_row(m, layer, routes, at, &mine.gu[at * 2 * Fe]);
      prepare_row(down[0], mine.gu.data(), 2 * Fe, at, false, m.eps, mine.sc);
    }
    const Rows mid = rows_for(down[0], mine.gu.data(), 2 * Fe, pairs, false, mine.sc);
    for (int64_t e = 0; e < E; e++)
      if (routes.count(e))
        add_jobs(jobs, down[e], rows_from(mid, down[e], routes.start[e], routes.count(e)),
                 &shared.sc.post[routes.start[e] * D], D);
  }
  project_jobs_stage(stages, t, stage, jobs, own.out);
  stages.run(
      t, stage, S,
      [&](int64_t s) {
        if (own.out.size() < static_cast<size_t>(D)) own.out.resize(D);
        weigh_experts(shared.sc.post.data(), routes, s, k, D, own.out.data(), down_bias(m, layer));
        post_row(m, own.out.data(), nullptr, D);  // as experts_barrier: the residual scale
      },
      [&](int64_t s) {
        for (int64_t i = 0; i < D; i++) sc.x[s * D + i] += own.out[i];
      });
}

// The step's rows through every layer as tolerant stages (see the top); logits as forward_barrier's
template <typename T>
void forward_tolerant(Step& step, float* logits, int threads) {
  const Model& m = step.m;
  Scratch& sc = step.sc;
  const int64_t D = step.D, H = step.H, hd = step.hd, F = step.F, n_qkv = step.n_qkv, S = step.S, L = step.L;
  const int64_t n_tasks = step.attention_items();
  const int64_t jobs = m.experts ? threads * kItemsPerThread + 4 * S * m.experts_used : 0;  // project_jobs_stage's
  Stages stages(threads, std::max({threads * kItemsPerThread, n_tasks, S, jobs}));
  Experts experts;  // a mixture of experts' shared buffers (moe.h), where the model has one
  experts.size(m, S);
  const std::function<void(int)> body = [&](int t) {
    if (t == g_fail_thread.load(std::memory_order_relaxed)) throw std::runtime_error("a test's failure");
    int64_t stage = 0;
    Own own;
    own.sc.h.resize(S * step.widest);
    own.sc.size_activations(S, step.widest);
    own.qkv.resize(S * n_qkv);
    own.gu.resize(S * 2 * F);
    OwnExperts mine;
    mine.size(m, S);
    float* scratch = sc.scores.data() + static_cast<size_t>(t) * step.scratch_per_thread;
    // whether the next `stages_ahead` stages are done: per-row work for them is skipped
    const auto skip = [&](int64_t stages_ahead) { return stages.done(stage + stages_ahead); };
    const auto uses = [](const Matrix& w) { return w.kind == WEIGHT_PARTS ? w.n_parts : int64_t{1}; };  // stages
    const auto prepare_own = [&](const Matrix& w, const float* src, int64_t lds, int64_t count, bool norm) {
      if (!skip(uses(w)))
        for (int64_t s = 0; s < count; s++) prepare_row(w, src, lds, s, norm, m.eps, own.sc);
      return rows_for(w, src, lds, count, norm, own.sc);
    };
    const auto residual = [&](const Matrix& w, const Rows& in, const float* norm, const float* bias) {  // x += post_row(in · W^T)
      if (!norm && !bias && m.residual_scale == 1.f) return project_stage(stages, t, stage, w, in, sc.x.data(), D, true, own.out);
      project_stage(stages, t, stage, w, in, sc.post.data(), D, false, own.out);
      stages.run(
          t, stage, S,
          [&](int64_t s) {
            own.out.assign(sc.post.begin() + s * D, sc.post.begin() + (s + 1) * D);
            post_row(m, own.out.data(), norm, D, bias);
          },
          [&](int64_t s) {
            for (int64_t i = 0; i < D; i++) sc.x[s * D + i] += own.out[i];
          });
    };
    for (int64_t l = 0; l < m.n_layers; l++) {
      const Layer& layer = m.layers[l];
      Rows rows = prepare_own(layer.qkv, sc.x.data(), D, S, m.pre_norm);
      project_stage(stages, t, stage, layer.qkv, rows, sc.qkv.data(), n_qkv, false, own.out);
      for (int64_t s = 0; s < S && !skip(2); s++) {  // bias, q/k norms, rope: every thread its own copy
        std::memcpy(&own.qkv[s * n_qkv], &sc.qkv[s * n_qkv], n_qkv * sizeof(float));
        step.rope_qkv(layer, s, &own.qkv[s * n_qkv]);
      }
      stages.run(
          t, stage, S, [](int64_t) {}, [&](int64_t s) { step.store_kv<T>(l, s, &own.qkv[s * n_qkv]); });
      const AttentionSet& set = step.set(l);
      const auto to_att = [&](int64_t s, int64_t head, int64_t positions, int64_t heads) {  // own.out's rows
        for (int64_t p = 0; p < positions; p++)
          std::memcpy(&sc.att[((s + p) * H + head) * hd], &own.out[p * heads * hd], heads * hd * sizeof(float));
      };
      stages.run(
          t, stage, static_cast<int64_t>(set.tasks.size()),
          [&](int64_t i) {
            const Task& task = set.tasks[i];
            const int64_t floats = task.unit < 0 ? task.positions * task.heads * hd : step.part_floats(task);
            own.out.resize(std::max<size_t>(own.out.size(), floats));
            step.attend_task<T>(l, i, &own.qkv[task.s * n_qkv], scratch, own.out.data(), task.heads * hd);
          },
          [&](int64_t i) {
            const Task& task = set.tasks[i];
            if (task.unit >= 0) {  // a split unit's chunks
              std::memcpy(&step.partials[step.part_offset(set, task)], own.out.data(), step.part_floats(task) * sizeof(float));
              return;
            }
            to_att(task.s, task.head, task.positions, task.heads);
          });
      if (!set.units.empty())  // a decode step's long rows: their chunks folded
        stages.run(
            t, stage, static_cast<int64_t>(set.units.size()),
            [&](int64_t u) {
              const Unit& unit = set.units[u];
              own.out.resize(std::max<size_t>(own.out.size(), unit.positions * unit.heads * hd));
              step.fold_unit(l, u, scratch, own.out.data(), unit.heads * hd);
            },
            [&](int64_t u) {
              const Unit& unit = set.units[u];
              to_att(unit.s, unit.head, unit.positions, unit.heads);
            });
      rows = prepare_own(layer.out, sc.att.data(), H * hd, S, false);
      residual(layer.out, rows, layer.post_attn_norm, layer.out_bias);
      if (layer.router) {
        experts_stages(stages, t, stage, m, layer, S, sc, experts, own, mine);
        continue;
      }
      rows = prepare_own(layer.gate_up, sc.x.data(), D, S, m.pre_norm);
      project_stage(stages, t, stage, layer.gate_up, rows, sc.gu.data(), 2 * F, false, own.out);
      for (int64_t s = 0; s < S && !skip(uses(layer.down)); s++) {  // act(gate) * up, in place of gate
        std::memcpy(&own.gu[s * 2 * F], &sc.gu[s * 2 * F], 2 * F * sizeof(float));
        act_row(m, &own.gu[s * 2 * F], F);
      }
      rows = prepare_own(layer.down, own.gu.data(), 2 * F, S, false);
      residual(layer.down, rows, layer.post_ffn_norm, nullptr);
    }
    const float* x = sc.x.data() + (S - L) * D;  // one segment: its last rows, as they are
    if (step.n_segs > 1) {
      own.last.resize(L * D);
      for (int64_t i = 0; i < L; i++) std::memcpy(&own.last[i * D], &sc.x[step.picked[i] * D], D * sizeof(float));
      x = own.last.data();
    }
    const Rows rows = prepare_own(m.head, x, D, L, true);
    project_stage(stages, t, stage, m.head, rows, logits, m.vocab, false, own.out);
  };
  pool().run(threads, body);
}

}  // namespace
