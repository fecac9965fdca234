// A driver for the decode kernel without Python (tests/test_kernel_neon.py builds it with decode.cpp for
// aarch64 and runs it under qemu-user): it rebuilds a model's structs from a case file written by the
// test (tests/neon_case.py) over the lean file's bytes, runs a fixed script of calls and writes every
// logit row it got.
//
//   harness CASE LEAN OUT
//
// CASE: little-endian int64 words: "CHATNEON", the version, then the model (Model's fields in order, each
// Matrix's with its parts, each Layer's; a float as its bits, a pointer as an offset into LEAN or -1 for
// null; a layer's rope -2: the identity, cos 1 and sin 0 at every position, -1: none; after a layer's vectors 0,
// or the count of its router and experts' matrices and those, then gpt-oss's four vectors), then the script's numbers:
// cache kind, capacity, the threads of single steps and of the rest, and three id lists (a count, the
// ids): the prompt P, the draft D, another prompt O.
// OUT: float32 rows of V logits, in order:
//   P + D rows  each id of P then D alone, in turn, on one cache (one thread)
//   1 row       P's prefill on a fresh cache, its last row
//   D rows      D checked in one call after that prefill (a draft)
//   O + P + D   one batched call: O on a fresh cache beside P + D on another, every row's logits
// Or CASE starts "CHATPROJ", the version, one Matrix over LEAN (any blob of its arrays), the rows S, the
// threads and S x k floats (as bits, a word each): OUT is chatcli_project's y, S x n floats.
// Exit status 0, or 1 with a line on stderr.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "decode.cpp"

namespace {

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "harness: %s\n", why.c_str());
  std::exit(1);
}

std::vector<uint8_t> read_file(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) fail(std::string("cannot open ") + path);
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (std::fread(bytes.data(), 1, bytes.size(), f) != bytes.size()) fail(std::string("short read of ") + path);
  std::fclose(f);
  return bytes;
}

struct Reader {
  std::vector<int64_t> words;
  size_t at = 0;
  const uint8_t* blob = nullptr;  // the lean file's bytes, 64-byte aligned
  int64_t blob_size = 0;
  std::deque<std::vector<Matrix>> part_arrays;  // the parts' storage (a moved vector keeps its buffer)

  int64_t peek() const {
    if (at >= words.size()) fail("the case ends early");
    return words[at];
  }
  int64_t next() {
    const int64_t word = peek();
    at++;
    return word;
  }
  float real() {
    const int64_t bits = next();
    const uint32_t u = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  template <typename T>
  T* pointer() {
    const int64_t offset = next();
    if (offset == -1) return nullptr;
    if (offset < 0 || offset >= blob_size) fail("a pointer outside the lean file");
    return reinterpret_cast<T*>(const_cast<uint8_t*>(blob + offset));
  }
  Matrix matrix() {
    Matrix m{};
    m.kind = static_cast<int32_t>(next());
    m.n = next();
    m.k = next();
    m.kp = next();
    m.w = pointer<const void>();
    m.scale = pointer<const float>();
    m.wsum = pointer<const int32_t>();
    m.d = pointer<const uint16_t>();
    m.mins = pointer<const uint16_t>();
    m.norm = pointer<const float>();
    m.sc = pointer<const uint8_t>();
    m.sm = pointer<const uint8_t>();
    m.hi = pointer<const uint8_t>();
    m.n_parts = next();
    m.parts = nullptr;
    if (m.n_parts > 0) {
      std::vector<Matrix> parts;
      for (int64_t i = 0; i < m.n_parts; i++) parts.push_back(matrix());
      part_arrays.push_back(std::move(parts));
      m.parts = part_arrays.back().data();
    }
    return m;
  }
  std::vector<int64_t> ids() {
    const int64_t count = next();
    std::vector<int64_t> out;
    for (int64_t i = 0; i < count; i++) out.push_back(next());
    return out;
  }
};

void write_floats(const std::vector<float>& out, const char* path) {
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size() || std::fclose(f) != 0)
    fail(std::string("cannot write ") + path);
}

// a CHATPROJ case: one projection of S rows
int project(Reader& in, const char* out_path) {
  const Matrix m = in.matrix();
  const int64_t rows = in.next();
  const int32_t threads = static_cast<int32_t>(in.next());
  std::vector<float> x(static_cast<size_t>(rows * m.k)), y(static_cast<size_t>(rows * m.n));
  for (float& v : x) v = in.real();
  if (in.at != in.words.size()) fail("words left over in the case");
  const int status = chatcli_project(&m, x.data(), rows, y.data(), threads);
  if (status) fail("chatcli_project returned " + std::to_string(status));
  write_floats(y, out_path);
  return 0;
}

// a KV cache of `layers` layers, every one holding positions 0..capacity-1
struct OwnCache {
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<void*> kp, vp;
  std::vector<int64_t> capacity, base;
  Cache view{};

  OwnCache(const Model& m, int32_t kind, int64_t cap) {
    const size_t elements = static_cast<size_t>(m.kv_heads * cap * m.head_dim);
    const size_t bytes = kind == CACHE_Q8 ? elements / 16 * 17 : elements * (kind == CACHE_BF16 || kind == CACHE_F16 ? 2 : 4);
    for (int64_t l = 0; l < m.n_layers; l++) {
      k.emplace_back(bytes + 64);
      v.emplace_back(bytes + 64);
      kp.push_back(k.back().data());
      vp.push_back(v.back().data());
      capacity.push_back(cap);
      base.push_back(0);
    }
    view = Cache{kind, kp.data(), vp.data(), capacity.data(), base.data()};
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) fail("usage: harness CASE LEAN OUT");
  Reader in;
  const std::vector<uint8_t> raw = read_file(argv[1]);
  in.words.resize(raw.size() / 8);
  std::memcpy(in.words.data(), raw.data(), in.words.size() * 8);
  std::vector<uint8_t> lean = read_file(argv[2]);
  const size_t lean_size = lean.size();
  void* aligned = std::aligned_alloc(64, (lean_size + 63) / 64 * 64);
  if (!aligned) fail("out of memory");
  std::memcpy(aligned, lean.data(), lean_size);
  in.blob = static_cast<const uint8_t*>(aligned);
  in.blob_size = static_cast<int64_t>(lean_size);

  const int64_t magic = in.next();
  if (in.next() != 3) fail("a case file of another version");
  if (magic == 0x4a4f525054414843LL) return project(in, argv[3]);  // "CHATPROJ"
  if (magic != 0x4e4f454e54414843LL) fail("not a case file");      // "CHATNEON"
  Model m{};
  m.n_layers = in.next();
  m.hidden = in.next();
  m.heads = in.next();
  m.kv_heads = in.next();
  m.head_dim = in.next();
  m.ffn = in.next();
  m.vocab = in.next();
  m.eps = in.real();
  m.attn_scale = in.real();
  m.attn_softcap = in.real();
  m.act = static_cast<int32_t>(in.next());
  m.embed = in.pointer<const float>();
  std::vector<Layer> layers;
  std::deque<std::vector<Matrix>> mixtures;  // each mixture of experts' router, then its experts (moe.h)
  std::vector<bool> flat(static_cast<size_t>(m.n_layers), false);  // the layers whose rope is the identity
  for (int64_t l = 0; l < m.n_layers; l++) {
    Layer layer{};
    layer.qkv = in.matrix();
    layer.out = in.matrix();
    layer.gate_up = in.matrix();
    layer.down = in.matrix();
    if (in.peek() == -2) {  // the identity (set below, once the capacity is read)
      in.next();
      flat[static_cast<size_t>(l)] = true;
    } else {
      layer.rope = in.pointer<const float>();  // null: a layer that rotates nothing
    }
    layer.window = in.next();
    layer.qkv_bias = in.pointer<const float>();
    layer.q_norm = in.pointer<const float>();
    layer.k_norm = in.pointer<const float>();
    layer.post_attn_norm = in.pointer<const float>();
    layer.post_ffn_norm = in.pointer<const float>();
    if (const int64_t count = in.next(); count > 0) {
      std::vector<Matrix> matrices;
      for (int64_t i = 0; i < count; i++) matrices.push_back(in.matrix());
      mixtures.push_back(std::move(matrices));
      layer.router = &mixtures.back()[0];
      layer.experts = &mixtures.back()[1];
    }
    layer.out_bias = in.pointer<const float>();  // gpt-oss's (null: none)
    layer.router_bias = in.pointer<const float>();
    layer.experts_bias = in.pointer<const float>();
    layer.sinks = in.pointer<const float>();
    layers.push_back(layer);
  }
  m.layers = layers.data();
  m.head = in.matrix();
  Matrix embed_rows{};
  if (in.next()) {
    embed_rows = in.matrix();
    m.embed_rows = &embed_rows;
  }
  m.embed_scale = in.real();
  m.experts = in.next();
  m.experts_used = in.next();
  m.expert_ffn = in.next();
  m.norm_topk = static_cast<int32_t>(in.next());
  m.pre_norm = static_cast<int32_t>(in.next());
  m.qk_norm_whole = static_cast<int32_t>(in.next());
  m.residual_scale = in.real();
  const int32_t kind = static_cast<int32_t>(in.next());
  const int64_t capacity = in.next();
  const int32_t step_threads = static_cast<int32_t>(in.next()), threads = static_cast<int32_t>(in.next());
  const std::vector<int64_t> prompt = in.ids(), draft = in.ids(), other = in.ids();
  if (in.at != in.words.size()) fail("words left over in the case");
  std::vector<float> identity(static_cast<size_t>(capacity * m.head_dim));
  for (size_t i = 0; i < identity.size(); i += 2) identity[i] = 1.f;  // cos 1, sin 0 at every position
  for (size_t l = 0; l < layers.size(); l++)
    if (flat[l]) layers[l].rope = identity.data();

  const int64_t V = m.vocab, P = static_cast<int64_t>(prompt.size()), D = static_cast<int64_t>(draft.size());
  const int64_t O = static_cast<int64_t>(other.size());
  std::vector<int64_t> sequence(prompt);
  sequence.insert(sequence.end(), draft.begin(), draft.end());
  const int64_t N = P + D;
  std::vector<float> out(static_cast<size_t>((N + 1 + D + O + N) * V));
  float* at = out.data();
  auto check = [](int status, const char* what) {
    if (status) fail(std::string(what) + " returned " + std::to_string(status));
  };

  OwnCache steps(m, kind, capacity);
  for (int64_t i = 0; i < N; i++, at += V)
    check(chatcli_decode(&m, &steps.view, &sequence[i], 1, i, at, 1, step_threads), "a single step");
  OwnCache prefill(m, kind, capacity);
  check(chatcli_decode(&m, &prefill.view, prompt.data(), P, 0, at, 1, threads), "the prefill");
  at += V;
  check(chatcli_decode(&m, &prefill.view, draft.data(), D, P, at, D, threads), "the draft");
  at += D * V;
  OwnCache beside(m, kind, capacity), again(m, kind, capacity);
  const Segment segments[2] = {{&beside.view, 0, O, O}, {&again.view, 0, N, N}};
  std::vector<int64_t> tokens(other);
  tokens.insert(tokens.end(), sequence.begin(), sequence.end());
  check(chatcli_decode_batch(&m, segments, 2, tokens.data(), at, threads), "the batch");

  write_floats(out, argv[3]);
  std::free(aligned);
  return 0;
}
