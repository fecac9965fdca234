// One call's rows and what its stages share (see decode.cpp): the model, cache and segment structs the
// runner passes, the activation buffers, a row's preparation for a projection, the attention tasks.
// Both ways of running the stages take a Step: decode.cpp's barrier forward and tolerant.h's.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

extern "C" {

enum { CACHE_F32 = 0, CACHE_BF16 = 1, CACHE_Q8 = 2, CACHE_F16 = 3 };

struct Layer {
  Matrix qkv, out, gate_up, down;
  const float* rope;      // [T, hd/2, 2]: cos, sin (this layer's table), or null: q and k not rotated (SmolLM3)
  int64_t window;         // positions a row attends to at most, itself included (0: all)
  const float* qkv_bias;  // [(H + 2 KV) hd] or null
  const float* q_norm;    // [hd] or null (with k_norm): RMSNorm of each q and k head before rope
  const float* k_norm;
  const float* post_attn_norm;  // [D] or null (with post_ffn_norm): RMSNorm of each block's output
  const float* post_ffn_norm;
  const Matrix* router;   // [experts, D] or null (a dense layer): the layer's FFN is a mixture of experts (moe.h)
  const Matrix* experts;  // with a router: every expert's gate_up [2 expert_ffn, D], then every one's down
  // gpt-oss (null where a family has none): attention's output bias [D], the router's bias [experts], the experts'
  // biases (every one's gate_up [2 expert_ffn], then every one's down [D]), each head's sink logit [H]
  const float* out_bias;
  const float* router_bias;
  const float* experts_bias;
  const float* sinks;
};

enum { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_SWIGLU_OAI = 2 };

struct Model {
  int64_t n_layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  float eps;
  float attn_scale;    // scores' scale
  float attn_softcap;  // scores -> cap * tanh(scores / cap) (0: none)
  int32_t act;         // ACT_SILU, ACT_GELU_TANH or ACT_SWIGLU_OAI (gpt-oss)
  const float* embed;  // [V, D], or null: rows of embed_rows
  const Layer* layers;
  Matrix head;
  const Matrix* embed_rows;  // q4 / q8 files: the embedding's blocks (a tied model's head), or null
  float embed_scale;         // what each row looked up from embed_rows is multiplied by (Gemma: sqrt(D))
  int64_t experts, experts_used, expert_ffn;  // a mixture of experts' layers (moe.h): experts, those a row takes, Fe
  int32_t norm_topk;                          // 1: a row's experts' weights divided by their sum
  int32_t pre_norm;       // 1: RMSNorm before attention and the MLP; 0: none (OLMo 2, whose norms are on the outputs)
  int32_t qk_norm_whole;  // 1: q_norm / k_norm span all of q [H hd] and all of k [KV hd] (OLMo 2), not each head
  float residual_scale;   // each block's output times this as it joins the residual (Granite; 1: as it is)
};

struct Cache {
  int32_t kind;             // CACHE_F32, CACHE_BF16, CACHE_Q8 (common.h: Q8's bytes) or CACHE_F16
  void* const* k;           // per layer: [KV, capacity/16, hd, 16] (q8: codes and scales a block)
  void* const* v;           // per layer: [KV, capacity, hd] (q8: codes and scales a row)
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

// row s of src [S, lds] -> normalised into sc.h (times the matrix's norm weight) or not and, for an int8
// projection, quantized into sc's activation buffers (what rows_for's Rows read)
void prepare_row(const Matrix& m, const float* src, int64_t lds, int64_t s, bool norm, float eps, Scratch& sc) {
  if (norm) {
    float* h = sc.h.data() + s * m.k;
    rms_norm(src + s * lds, m.k, eps, h);
    if (m.norm)
      for (int64_t i = 0; i < m.k; i++) h[i] *= m.norm[i];
  }
  const float* x = norm ? sc.h.data() + s * m.k : src + s * lds;
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

// 32 values x[i] -> int8 codes q[i * stride] and their fp16 scale (GGUF's Q8_0: amax / 127, the codes
// rounded to nearest against the scale as stored); the same bits on every build
inline uint16_t quantize_q8(const float* x, int8_t* q, int64_t stride) {
  float amax = 0.f;
  for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[i]));
  const uint16_t d = float_to_half(amax / 127.f);
  const float stored = half_to_float(d), inv = stored > 0.f ? 1.f / stored : 0.f;
  for (int i = 0; i < 32; i++) {
    const float code = std::nearbyint(x[i] * inv);  // NaN: 0
    q[i * stride] = static_cast<int8_t>(code == code ? std::min(127.f, std::max(-127.f, code)) : 0.f);
  }
  return d;
}

// a key row into its q8 block (kt: one KV head's blocks of 17 hd bytes, see common.h's Q8)
inline void store_key(Q8* kt, int64_t position, const float* src, int64_t hd) {
  int8_t* block = reinterpret_cast<int8_t*>(kt + position / 16 * 17 * hd);
  uint16_t* scales = reinterpret_cast<uint16_t*>(block + 16 * hd);  // [hd/32, 16]
  const int64_t lane = position % 16;
  for (int64_t g = 0; g < hd / 32; g++) scales[g * 16 + lane] = quantize_q8(src + g * 32, block + g * 32 * 16 + lane, 16);
}

// a value row as q8: its codes, then its scales
inline void store_value(Q8* dst, const float* src, int64_t hd) {
  int8_t* codes = reinterpret_cast<int8_t*>(dst);
  uint16_t* scales = reinterpret_cast<uint16_t*>(codes + hd);
  for (int64_t g = 0; g < hd / 32; g++) scales[g] = quantize_q8(src + g * 32, codes + g * 32, 1);
}

// a key row into its transposed block, a value row as it is, each element as fp16 (round to nearest even)
inline void store_key(F16* kt, int64_t position, const float* src, int64_t hd) {
  F16* dst = kt + (position / 16) * hd * 16 + position % 16;
  for (int64_t i = 0; i < hd; i++) dst[i * 16].bits = float_to_half(src[i]);
}

inline void store_value(F16* dst, const float* src, int64_t hd) {
  for (int64_t i = 0; i < hd; i++) dst[i].bits = float_to_half(src[i]);
}

// An attention task: `positions` rows of segment `seg` from row `s` (of the step) on, `heads` heads from
// `head`, of KV group g; all their keys, or (a part of a split unit: `unit` >= 0) the key chunks [c_lo, c_hi)
struct Task {
  int64_t seg, s, positions, g, head, heads;
  int64_t c_lo = 0, c_hi = INT64_MAX, unit = -1;
};

// A decode step's long rows, split over the team: the tasks of one tile and head range each attend some of its
// key chunks (c0 .. c0 + chunks - 1) into the partials (at `off`: per chunk, per row, its max, sum and weighted
// values [hd]), then one folds them in order (steps.h: fold_chunk), as one task would have.
struct Unit {
  int64_t seg, s, positions, g, head, heads, c0, chunks, off;
};

// floats a row's partial of one chunk takes: its max, its sum, its weighted values [hd]
inline int64_t slot_floats(int64_t hd) { return hd + 2; }

constexpr int64_t kSplitChunks = 3;     // a decode step's rows of this many key chunks or more are split
std::atomic<int64_t> g_split_units{0};  // units folded since the library loaded (chatcli_split_units: tests)

// The attention of the layers of one window (0: none): its tasks, its split units and the partials they need
struct AttentionSet {
  int64_t window;
  std::vector<Task> tasks;
  std::vector<Unit> units;
  int64_t partials = 0;  // floats
};

// Heads a task attends together in a segment of S rows: all of a group's (at most kMaxGroup: `part`) where the
// rows give every thread tasks enough (a prompt's chunk); else (a decode step) the count whose busiest thread
// has the least to do, a task costing its K and V read and converted once (about two heads' sums) and a head's
// sums for each head: a step's 9 heads in 3 groups on 2 threads run as 3 tasks of 3 heads (the busiest thread
// 2 tasks, 10 units), not 9 of one (5 tasks, 15 units, each group's keys read three times).
inline int64_t heads_per_task(int64_t S, int64_t KV, int64_t group, int64_t part, int threads) {
  const int64_t parts = (group + part - 1) / part;
  if (S * KV * parts >= 4 * threads) return part;
  int64_t best = part, least = INT64_MAX;
  for (int64_t p = part; p >= 1; p--) {
    const int64_t tasks = S * KV * ((group + p - 1) / p);
    const int64_t busiest = (tasks + threads - 1) / threads * (2 + p);
    if (busiest < least) best = p, least = busiest;
  }
  return best;
}

// Every segment's attention tasks for layers of `window` (0: none): heads_per_task heads a task, tiles of positions
// where a task holds several heads. The tiling changes no bits (attend: a row's sums in the same order whatever
// the rows around it). A decode step (too few tasks for the team) whose rows read kSplitChunks key chunks or more
// attends all of a group's heads together (its keys read once) and splits the chunks over ~4 tasks a thread,
// folded after (Unit): the same bits as one task, which folds the same chunks in the same order.
AttentionSet attention_tasks(const Segment* segs, int64_t n_segs, int64_t KV, int64_t group, int64_t hd, int threads,
                             int64_t window) {
  const int64_t part = std::min<int64_t>(group, kMaxGroup);  // heads a task attends together at most
  AttentionSet set{window, {}, {}, 0};
  int64_t first = 0;
  for (int64_t j = 0; j < n_segs; j++) {
    const int64_t S = segs[j].rows, parts = (group + part - 1) / part;
    const auto chunks_of = [&](int64_t s, int64_t positions, int64_t& c0) {  // the key chunks a tile reads
      const int64_t length = segs[j].pos + s + 1, last = length + positions - 1;
      c0 = first_key(length, window) / kChunk;
      return (last + kChunk - 1) / kChunk - c0;
    };
    const int64_t split_tile = std::max<int64_t>(1, kTileRows / part), tiles = (S + split_tile - 1) / split_tile;
    int64_t c0 = 0;
    if (threads > 1 && S * KV * parts < 4 * threads && chunks_of(0, std::min(split_tile, S), c0) >= kSplitChunks) {
      const int64_t units = tiles * KV * parts, want = (4 * threads + units - 1) / units;  // tasks a unit
      for (int64_t u = 0; u < units; u++) {
        const int64_t s = u / (KV * parts) * split_tile, g = u / parts % KV, head = g * group + u % parts * part;
        const int64_t positions = std::min(split_tile, S - s), heads = std::min(part, (g + 1) * group - head);
        const int64_t chunks = chunks_of(s, positions, c0), n = std::min(want, chunks);
        const int64_t unit = static_cast<int64_t>(set.units.size());
        set.units.push_back({j, first + s, positions, g, head, heads, c0, chunks, set.partials});
        set.partials += chunks * positions * heads * slot_floats(hd);
        for (int64_t i = 0; i < n; i++) {  // n ranges of the chunks, as even as they divide
          const int64_t lo = c0 + chunks * i / n, hi = c0 + chunks * (i + 1) / n;
          set.tasks.push_back({j, first + s, positions, g, head, heads, lo, hi, unit});
        }
      }
      first += S;
      continue;
    }
    const int64_t per_task = heads_per_task(S, KV, group, part, std::max(1, threads));
    const int64_t tile = per_task == 1 ? 1 : std::max<int64_t>(1, kTileRows / per_task);  // positions a task
    const int64_t n_tiles = (S + tile - 1) / tile, tasks_per_group = (group + per_task - 1) / per_task;
    for (int64_t task = 0; task < n_tiles * KV * tasks_per_group; task++) {
      const int64_t s = task / (KV * tasks_per_group) * tile, g = task / tasks_per_group % KV;
      const int64_t head = g * group + task % tasks_per_group * per_task;
      set.tasks.push_back({j, first + s, std::min(tile, S - s), g, head, std::min(per_task, (g + 1) * group - head)});
    }
    first += S;
  }
  return set;
}

// a block's output row y [D] as it joins the residual: plus its bias, through its sandwich norm where there is one (Gemma,
// OLMo 2), times the residual scale (Granite); false: y joins as it is (the projection may add into x itself)
inline bool post_row(const Model& m, float* y, const float* norm, int64_t D, const float* bias = nullptr) {
  if (!norm && !bias && m.residual_scale == 1.f) return false;
  if (bias)  // the projection's bias (gpt-oss's attention output)
    for (int64_t i = 0; i < D; i++) y[i] += bias[i];
  if (norm) rms_norm_scaled(y, norm, D, m.eps);
  if (m.residual_scale != 1.f)
    for (int64_t i = 0; i < D; i++) y[i] *= m.residual_scale;
  return true;
}

// gpt-oss's SwiGLU (llama.cpp's swiglu_oai, its alpha and limit): gate clamped above at 7, up to [-7, 7],
// (up + 1) * gate * sigmoid(1.702 gate), in place of gate
inline void swiglu_oai_row(float* row, int64_t F) {
  constexpr float kAlpha = 1.702f, kLimit = 7.f;
  const float* up = row + F;
  for (int64_t i = 0; i < F; i++) {
    const float g = std::min(row[i], kLimit), u = std::min(std::max(up[i], -kLimit), kLimit);
    row[i] = g / (1.f + std::exp(-kAlpha * g)) * (u + 1.f);
  }
}

// act(gate) * up of a row [2F] (gate, then up), in place of gate
inline void act_row(const Model& m, float* row, int64_t F) {
  if (m.act == ACT_SWIGLU_OAI)
    swiglu_oai_row(row, F);
  else if (m.act == ACT_GELU_TANH)
    gelu_tanh_mul_row(row, F);
  else
    silu_mul_row(row, F);
}

// The rows of n_segs sequences (tokens: every segment's in turn), each with its own cache and position:
// which segment and position each row has, the rows with logits, the buffers the stages share, the
// residual stream x with the tokens' embeddings, the attention tasks
struct Step {
  const Model& m;
  const Segment* segs;
  int64_t n_segs;
  std::vector<int64_t> row_seg, row_pos, picked;  // per row: its segment and position; the rows with logits
  int64_t S = 0, L = 0, longest = 0;              // rows, rows with logits, the most positions a row sees
  int64_t D, H, KV, hd, F, n_qkv, widest;
  Scratch sc;
  std::vector<AttentionSet> sets;  // the attention of each window the layers have
  std::vector<int64_t> set_of;     // per layer: its set
  std::vector<float> partials;     // split units' chunks (AttentionSet::partials floats at most)
  size_t scratch_per_thread;       // attention's: a thread's share of sc.scores

  Step(const Model& model, const Segment* segments, int64_t n, const int64_t* tokens, int threads)
      : m(model), segs(segments), n_segs(n), D(m.hidden), H(m.heads), KV(m.kv_heads), hd(m.head_dim), F(m.ffn) {
    n_qkv = (H + 2 * KV) * hd;
    widest = std::max({D, F, H * hd});
    for (int64_t j = 0; j < n_segs; j++) {
      for (int64_t r = 0; r < segs[j].rows; r++) {
        if (r >= segs[j].rows - segs[j].logit_rows) picked.push_back(static_cast<int64_t>(row_seg.size()));
        row_seg.push_back(j);
        row_pos.push_back(segs[j].pos + r);
      }
      longest = std::max(longest, segs[j].pos + segs[j].rows);
    }
    S = static_cast<int64_t>(row_seg.size()), L = static_cast<int64_t>(picked.size());
    sc.x.resize(S * D);
    sc.h.resize(S * widest);
    sc.qkv.resize(S * n_qkv);
    sc.att.resize(S * H * hd);
    sc.gu.resize(S * 2 * F);
    sc.post.resize(S * D);
    sc.size_activations(S, widest);
    for (int64_t l = 0; l < m.n_layers; l++) {
      const int64_t window = m.layers[l].window;
      auto found = std::find_if(sets.begin(), sets.end(), [&](const AttentionSet& a) { return a.window == window; });
      if (found == sets.end()) {
        sets.push_back(attention_tasks(segs, n_segs, KV, H / KV, hd, threads, window));
        found = sets.end() - 1;
      }
      set_of.push_back(found - sets.begin());
    }
    int64_t most = 0;
    for (const AttentionSet& a : sets) most = std::max(most, a.partials);
    partials.resize(most);
    scratch_per_thread = static_cast<size_t>(kTileRows) * (3 * hd + longest + 49);
    sc.scores.resize(static_cast<size_t>(threads) * scratch_per_thread);
    for (int64_t s = 0; s < S; s++) {
      if (m.embed)
        std::memcpy(&sc.x[s * D], m.embed + tokens[s] * D, D * sizeof(float));
      else
        dequantize_row(*m.embed_rows, tokens[s], m.embed_scale, &sc.x[s * D]);
    }
  }

  // row s's bias, q/k norms and rope (adjacent pairs) on its qkv row (in place, at `row`), by one thread
  void rope_qkv(const Layer& layer, int64_t s, float* row) const {
    if (layer.qkv_bias)
      for (int64_t i = 0; i < n_qkv; i++) row[i] += layer.qkv_bias[i];
    if (layer.q_norm && m.qk_norm_whole) {
      rms_norm_scaled(row, layer.q_norm, H * hd, m.eps);
      rms_norm_scaled(row + H * hd, layer.k_norm, KV * hd, m.eps);
    } else if (layer.q_norm) {
      for (int64_t h = 0; h < H + KV; h++) rms_norm_scaled(row + h * hd, h < H ? layer.q_norm : layer.k_norm, hd, m.eps);
    }
    if (layer.rope) rope_row(row, layer.rope + row_pos[s] * hd, H + KV, hd / 2);  // rope [hd/2, 2] of this position
  }

  // row s's key and value (of its roped qkv `row`) into its segment's cache of layer l
  template <typename T>
  void store_kv(int64_t l, int64_t s, const float* row) const {
    const Cache& c = *segs[row_seg[s]].cache;
    T* kl = static_cast<T*>(c.k[l]);  // [KV, capacity/16, hd, 16]
    T* vl = static_cast<T*>(c.v[l]);  // [KV, capacity, hd]
    const int64_t cap = c.capacity[l], at = row_pos[s] - c.base[l];
    for (int64_t g = 0; g < KV; g++) {
      store_key(kl + g * span<T>(cap, hd), at, row + (H + g) * hd, hd);
      store_value(vl + span<T>(g * cap + at, hd), row + (H + KV + g) * hd, hd);
    }
  }

  // the attention set of layer l
  const AttentionSet& set(int64_t l) const { return sets[set_of[l]]; }

  // the most items a stage of attention has: a set's tasks or its units
  int64_t attention_items() const {
    int64_t most = 0;
    for (const AttentionSet& a : sets)
      most = std::max({most, static_cast<int64_t>(a.tasks.size()), static_cast<int64_t>(a.units.size())});
    return most;
  }

  // floats a split task's chunks take in the partials
  int64_t part_floats(const Task& t) const { return (t.c_hi - t.c_lo) * t.positions * t.heads * slot_floats(hd); }

  // where task t's chunks go in the partials
  int64_t part_offset(const AttentionSet& a, const Task& t) const {
    const Unit& u = a.units[t.unit];
    return u.off + (t.c_lo - u.c0) * t.positions * t.heads * slot_floats(hd);
  }

  // attention task i of layer l: its q rows (at q, stride n_qkv, from the task's first row) over the cache,
  // outputs at out (row stride ldo), or, a split unit's task, its chunks' partials at out (part_floats);
  // scratch: a thread's share of sc.scores
  template <typename T>
  void attend_task(int64_t l, int64_t i, const float* q, float* scratch, float* out, int64_t ldo) const {
    const Task& t = set(l).tasks[i];
    const Layer& layer = m.layers[l];
    const Cache& c = *segs[t.seg].cache;
    const int64_t cap = c.capacity[l], base = c.base[l];
    const T* kl = static_cast<const T*>(c.k[l]) + t.g * span<T>(cap, hd);
    const T* vl = static_cast<const T*>(c.v[l]) + t.g * span<T>(cap, hd);
    if (t.unit < 0) {
      attend(q + t.head * hd, n_qkv, t.positions, t.heads, kl, vl, base, row_pos[t.s] + 1, hd, layer.window,
             m.attn_scale, m.attn_softcap, scratch, out, ldo, layer.sinks ? layer.sinks + t.head : nullptr);
      return;
    }
    const int64_t rows = t.positions * t.heads;
    attend_chunks<T>(q + t.head * hd, n_qkv, t.positions, t.heads, kl, vl, base, row_pos[t.s] + 1, hd, layer.window,
                     m.attn_scale, m.attn_softcap, scratch, t.c_lo, t.c_hi,
                     [&](int64_t k, int64_t r, float top, float sum, const float* o) {
                       float* slot = out + ((k - t.c_lo) * rows + r) * slot_floats(hd);
                       slot[0] = top, slot[1] = sum;
                       std::memcpy(slot + 2, o, hd * sizeof(float));
                     });
  }

  // split unit u of layer l: its chunks' partials folded in order, each row's output at out + p * ldo + h * hd
  void fold_unit(int64_t l, int64_t u, float* acc, float* out, int64_t ldo) const {
    const Unit& unit = set(l).units[u];
    const float* sinks = m.layers[l].sinks ? m.layers[l].sinks + unit.head : nullptr;
    const int64_t rows = unit.positions * unit.heads;
    g_split_units.fetch_add(1, std::memory_order_relaxed);
    for (int64_t r = 0; r < rows; r++) {
      Fold f{-INFINITY, 0.f, acc};
      for (int64_t k = 0; k < unit.chunks; k++) {
        const float* slot = &partials[unit.off + (k * rows + r) * slot_floats(hd)];
        fold_chunk(f, slot[0], slot[1], slot + 2, hd);
      }
      finish_fold(f, sinks ? sinks + r % unit.heads : nullptr, hd, out + r / unit.heads * ldo + r % unit.heads * hd);
    }
  }
};

}  // namespace
