// The CPU model's prefill and decode throughput on a random V4.1-shaped model of about 100M
// parameters (`troupe model init --preset small`, kernels/model_init.hpp), beside its peer
// measured in the same run: the GEMM floor, i.e. OpenBLAS sgemm over exactly the weight
// matrices the same tokens pass through (active experts only), with the same thread count.
// The ratio model / floor is what everything that is not a dense GEMM costs (attention,
// indexer, mHC, routing, norms, quantisers).
//
//   build/bench/bench_model [--model DIR] [--prompt 1024] [--decode 32] [--threads 2]
//   build/bench/bench_model --replay 4096 [--model DIR] [--threads 2]
//
// --replay N times, on one N-token prompt, the exact prefill against its two bounded peers in
// the same run: bounded replay (restore the prompt's full Block KV blocks, recompute the last
// sliding-window tokens) and the encoder-decoder prefill (decoder layers on the last window
// only); with each one's GEMM FLOPs and next-token divergence from the exact logits.
//
// With DSpark draft layers in the model (the small preset has one stage), the draft call's
// time per decode step is printed beside the target's decode step.
//
//   build/bench/bench_model --ep 2 [--prompt 256] [--decode 16] [--threads 2]
//
// --ep N times an expert-parallel group of N ranks (kernels/ep_group_backend.hpp, each rank with
// threads / N threads, so all use the same threads in all), as threads of this process and as
// one process per rank (kernels/ep_process.hpp: ranks 1.. forked, a socket each), against their
// peer in the same run, the one model they split: a prefill of --prompt tokens and --decode
// steps of a batch of 8, batch-invariant as served, five rounds alternating, min and median,
// with the load average. Their logits are compared too (bitwise equal is the EP group's contract).
//
// --model runs on an existing model directory (e.g. the one tools/model_bench_reference.py
// times the `transformers` reference on) instead of writing the small preset.
#include <cblas.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu_ops.hpp"
#include "kernels/ep_group_backend.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model.hpp"
#include "kernels/model_config.hpp"
#include "kernels/model_init.hpp"

using namespace troupe::kernels;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The (out, in) shapes of the matrices one token passes through in layer l.
void layer_gemms(const text_config& c, std::int64_t l,
                 std::vector<std::pair<std::int64_t, std::int64_t>>& out) {
  const std::int64_t D = c.hidden_size, hc = c.hc_mult, mix = (2 + hc) * hc;
  {
    out.push_back({mix, hc * D});
    out.push_back({mix, hc * D});
    out.push_back({c.q_lora_rank, D});
    out.push_back({c.num_attention_heads * c.head_dim, c.q_lora_rank});
    out.push_back({c.head_dim, D});
    for (std::int64_t g = 0; g < c.o_groups; ++g)
      out.push_back({c.o_lora_rank, c.num_attention_heads * c.head_dim / c.o_groups});
    out.push_back({D, c.o_groups * c.o_lora_rank});
    if (c.is_kv_source(l)) {
      out.push_back({c.head_dim, D});
      if (c.compress_ratios[std::size_t(l)] > 1) out.push_back({c.head_dim, D});
    }
    if (c.is_index_source(l)) {
      out.push_back({c.index_n_heads * c.index_head_dim, c.q_lora_rank});
      out.push_back({c.index_n_heads, D});
    }
    if (c.engram_index(l) >= 0)
      out.push_back(
          {D * (hc + 1), (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim});
    out.push_back({c.n_routed_experts, D});
    for (std::int64_t e = 0; e <= c.num_experts_per_tok; ++e) {  // routed + shared
      out.push_back({c.moe_intermediate_size, D});
      out.push_back({c.moe_intermediate_size, D});
      out.push_back({D, c.moe_intermediate_size});
    }
  }
}

// The (out, in) shapes of the matrices one token passes through.
std::vector<std::pair<std::int64_t, std::int64_t>> active_gemms(const text_config& c) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) layer_gemms(c, l, out);
  out.push_back({c.vocab_size, c.hidden_size});
  return out;
}

// GEMM FLOPs per token of layers [first, last).
double layer_flops(const text_config& c, std::int64_t first, std::int64_t last) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
  for (std::int64_t l = first; l < last; ++l) layer_gemms(c, l, shapes);
  double f = 0;
  for (auto [o, i] : shapes) f += 2.0 * double(o) * double(i);
  return f;
}

// Seconds for sgemm over every active matrix with `rows` token rows, `calls` times.
double gemm_floor(const text_config& c, std::int64_t rows, int calls) {
  auto shapes = active_gemms(c);
  std::vector<std::vector<float>> weights;
  std::int64_t widest = 0;
  for (auto [o, i] : shapes) {
    weights.emplace_back(std::size_t(o * i), 0.01f);
    widest = std::max({widest, o, i});
  }
  std::vector<float> x(std::size_t(rows * widest), 0.5f), y(std::size_t(rows * widest));
  auto t0 = clock_type::now();
  for (int k = 0; k < calls; ++k)
    for (std::size_t m = 0; m < shapes.size(); ++m)
      linear(x.data(), rows, shapes[m].second, weights[m].data(), shapes[m].first, y.data());
  return seconds_since(t0);
}

// --replay: the exact prefill of one `prompt`-token sequence against bounded replay and the
// encoder-decoder prefill, in the same run.
int replay_bench(const model& m, std::int64_t prompt) {
  const auto& c = m.text();
  const std::int64_t R = c.sliding_window, V = c.vocab_size;
  std::vector<std::int64_t> p(static_cast<std::size_t>(prompt));
  std::uint32_t seed = 7;
  for (auto& v : p) v = std::int64_t((seed = seed * 1664525u + 1013904223u) >> 8) % V;
  auto last = [&](const std::vector<float>& logits) {
    return std::vector<float>(logits.end() - V, logits.end());
  };
  auto divergence = [](const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, double(std::fabs(a[i] - b[i])));
      scale = std::max(scale, double(std::fabs(b[i])));
    }
    return diff / scale;
  };
  auto exact = m.new_sequence();
  sequence_input in{&exact, p};
  auto t0 = clock_type::now();
  auto full = m.forward(std::span(&in, 1));
  const double t_exact = seconds_since(t0);
  if (!full) return std::fprintf(stderr, "%s\n", full.error().c_str()), 1;
  const auto ref = last(*full);

  std::vector<std::string> blocks;
  for (std::int64_t b = 0; b < full_blocks(exact); ++b)
    blocks.push_back(*serialize_block(exact, b));
  auto replayed = m.new_sequence();
  t0 = clock_type::now();
  for (std::size_t b = 0; b < blocks.size(); ++b)
    if (auto r = restore_block(replayed, std::int64_t(b), blocks[b]); !r)
      return std::fprintf(stderr, "%s\n", r.error().c_str()), 1;
  auto rep = m.replay(replayed, p);
  const double t_replay = seconds_since(t0);
  if (!rep) return std::fprintf(stderr, "%s\n", rep.error().c_str()), 1;
  // (The replay's start is aligned down to every compress ratio: at most a few tokens more.)
  const std::int64_t recomputed = std::min(prompt, R);

  auto ed = m.new_sequence();
  t0 = clock_type::now();
  auto edl = m.prefill_encoder_decoder(ed, p);
  const double t_ed = seconds_since(t0);
  if (!edl) return std::fprintf(stderr, "%s\n", edl.error().c_str()), 1;

  std::int64_t decoder_begin = 0;
  while (c.compress_ratios[std::size_t(decoder_begin)] != 1) ++decoder_begin;
  const double head = 2.0 * double(V) * double(c.hidden_size);
  const double all = layer_flops(c, 0, c.num_hidden_layers) + head;
  const double enc = layer_flops(c, 0, decoder_begin);
  const double publish = 2.0 * double(c.head_dim) * double(c.hidden_size);  // its compressor
  const double f_exact = double(prompt) * all;
  const double f_replay = double(recomputed) * (all - head) + head;  // the LM head once
  const double tail = double(std::min(prompt, R));
  const double f_ed = double(prompt) * (enc + publish) + tail * (all - enc);
  std::printf("prompt %lld tokens (%zu full Block KV blocks of %zu bytes), window %lld\n",
              (long long)prompt, blocks.size(), blocks.empty() ? 0 : blocks[0].size(),
              (long long)R);
  std::printf(
      "exact prefill:          %8.3f s  %8.1f GFLOP (GEMMs; %.1f of them the LM head over every "
      "position, as forward returns every position's logits)\n",
      t_exact, f_exact / 1e9, double(prompt) * head / 1e9);
  std::printf(
      "bounded replay:         %8.3f s  %8.1f GFLOP  (%lld tokens recomputed) time %.1f%% of "
      "exact, FLOPs %.1f%%; next-token divergence %.3g\n",
      t_replay, f_replay / 1e9, (long long)recomputed, 100 * t_replay / t_exact,
      100 * f_replay / f_exact, divergence(*rep, ref));
  std::printf(
      "encoder-decoder prefill: %7.3f s  %8.1f GFLOP  (decoder from layer %lld on the last %lld) "
      "time %.1f%% of exact, FLOPs %.1f%%; next-token divergence %.3g\n",
      t_ed, f_ed / 1e9, (long long)decoder_begin, (long long)tail, 100 * t_ed / t_exact,
      100 * f_ed / f_exact, divergence(last(*edl), ref));
  return 0;
}

}  // namespace

// The EP group against the one model, in alternating rounds (see the header).
int ep_bench(const std::filesystem::path& dir, int threads, int ranks, std::int64_t prompt,
             std::int64_t decode) {
  const auto identity = [](model& m) -> result<bool> {
    std::vector<std::int64_t> map(std::size_t(m.text().vocab_size));
    for (std::size_t i = 0; i < map.size(); ++i)
      map[i] = std::int64_t(i) % m.text().engram_compressed_vocab_size;
    return m.set_engram_token_map(map);
  };
  auto cfg = load_model_config(dir);
  if (!cfg) return std::fprintf(stderr, "%s\n", cfg.error().c_str()), 1;
  auto placement = place_experts(std::int32_t(cfg->text.n_routed_experts), ranks);
  if (!placement) return std::fprintf(stderr, "%s\n", placement.error().c_str()), 1;
  const model_options rank_options{.threads = std::max(1, threads / ranks), .batch_invariant = true};
  // The group's ranks 1.. as processes of their own (forked before this one loads anything),
  // a socket each to this process, which holds rank 0 (kernels/ep_process.hpp).
  std::vector<ep_peer> peers;
  std::vector<pid_t> children;
  for (std::int32_t r = 1; r < ranks; ++r) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 1;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(sv[0]);
      ::_exit(serve_ep_peer(sv[1], dir, rank_options, *placement, {r}, identity) ? 0 : 1);
    }
    ::close(sv[1]);
    peers.push_back({sv[0], {r}});
    children.push_back(pid);
  }
  auto whole = model::load(dir, {.threads = threads, .batch_invariant = true});
  if (!whole || !identity(*whole)) return std::fprintf(stderr, "cannot load %s\n", dir.c_str()), 1;
  const auto& c = whole->text();
  auto group = open_ep_group(dir, rank_options, *placement, identity);
  if (!group) return std::fprintf(stderr, "%s\n", group.error().c_str()), 1;
  auto spread = open_ep_group(dir, rank_options, *placement, identity, {}, std::move(peers));
  if (!spread) return std::fprintf(stderr, "%s\n", spread.error().c_str()), 1;
  cpu_backend one(std::move(*whole));
  constexpr std::int64_t batch = 8;
  // One round on `b`: the prefill's and the decode's seconds, and every logit it produced.
  auto round = [&](model_backend& b, std::vector<float>& logits) -> std::pair<double, double> {
    logits.clear();
    std::vector<sequence_id> ids;
    std::vector<std::vector<std::int64_t>> prompts;
    for (std::int64_t s = 0; s < batch; ++s) {
      ids.push_back(b.open_sequence());
      std::vector<std::int64_t> t(std::size_t(prompt / batch));
      std::uint32_t x = 7 + std::uint32_t(s);
      for (auto& v : t) v = std::int64_t((x = x * 1664525u + 1013904223u) >> 8) % c.vocab_size;
      prompts.push_back(std::move(t));
    }
    std::vector<step_input> in;
    for (std::int64_t s = 0; s < batch; ++s) in.push_back({ids[std::size_t(s)], prompts[std::size_t(s)]});
    const std::vector<std::int64_t> last(batch, 1);
    auto t0 = clock_type::now();
    auto r = b.step_tail(in, last, nullptr);
    const double pre = seconds_since(t0);
    if (!r) return {-1, -1};
    logits.insert(logits.end(), r->begin(), r->end());
    std::vector<std::vector<std::int64_t>> next(batch, std::vector<std::int64_t>(1));
    t0 = clock_type::now();
    for (std::int64_t step = 0; step < decode; ++step) {
      for (std::int64_t s = 0; s < batch; ++s) {
        const float* row = r->data() + s * c.vocab_size;
        next[std::size_t(s)][0] = std::max_element(row, row + c.vocab_size) - row;
        in[std::size_t(s)].tokens = next[std::size_t(s)];
      }
      r = b.step_tail(in, last, nullptr);
      if (!r) return {-1, -1};
      logits.insert(logits.end(), r->begin(), r->end());
    }
    const double dec = seconds_since(t0);
    for (auto id : ids) (void)b.close_sequence(id);
    return {pre, dec};
  };
  model_backend* contenders[] = {&one, group->get(), spread->get()};
  const char* names[] = {"one model", "EP threads", "EP procs"};
  std::vector<double> pre[3], dec[3];
  std::vector<float> logits[3];
  bool equal = true;
  for (int k = 0; k < 5; ++k)
    for (int w = 0; w < 3; ++w) {
      auto [p, d] = round(*contenders[w], logits[w]);
      if (p < 0) return std::fprintf(stderr, "a step failed\n"), 1;
      pre[w].push_back(p);
      dec[w].push_back(d);
      if (w > 0) equal = equal && logits[0] == logits[w];
    }
  spread->reset();  // its peers see their sockets close and exit
  for (auto pid : children) ::waitpid(pid, nullptr, 0);
  auto min_med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return std::pair{v.front(), v[v.size() / 2]};
  };
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  std::printf("EP group of %d ranks (%d threads each) as threads of one process and as one "
              "process per rank vs one model (%d threads), batch-invariant, 5 rounds, load "
              "average %.2f; logits %s\n",
              ranks, std::max(1, threads / ranks), threads, load,
              equal ? "bitwise equal" : "DIFFER");
  for (int w = 0; w < 3; ++w) {
    auto [pmin, pmed] = min_med(pre[w]);
    auto [dmin, dmed] = min_med(dec[w]);
    std::printf("  %-10s prefill %lld tokens: %.1f / %.1f ms (min / median); decode %lld steps of "
                "%lld: %.2f / %.2f ms per step\n",
                names[w], (long long)prompt, 1e3 * pmin, 1e3 * pmed,
                (long long)decode, (long long)batch, 1e3 * dmin / double(decode),
                1e3 * dmed / double(decode));
  }
  return equal ? 0 : 1;
}

int main(int argc, char** argv) {
  troupe::kernels::reexec_with_blas_kernel_upgrade(argv);  // the kernel troupe runs with
  std::int64_t prompt = 1024, decode = 32;
  int threads = 2;
  std::int64_t replay_prompt = 0;
  int ep_ranks = 0;
  std::string model_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      model_dir = argv[i + 1];
    else if (a == "--prompt")
      prompt = std::atoll(argv[i + 1]);
    else if (a == "--decode")
      decode = std::atoll(argv[i + 1]);
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--replay")
      replay_prompt = std::atoll(argv[i + 1]);
    else if (a == "--ep")
      ep_ranks = std::atoi(argv[i + 1]);
  }
  const bool generated = model_dir.empty();
  const auto dir = generated ? std::filesystem::temp_directory_path() /
                                   ("troupe-bench-model-" + std::to_string(::getpid()))
                             : std::filesystem::path(model_dir);
  if (generated) {
    auto written = write_random_model(dir, "small", 1);
    if (!written) {
      std::fprintf(stderr, "%s\n", written.error().c_str());
      return 1;
    }
  }
  if (ep_ranks > 0) {
    const int rc = ep_bench(dir, threads, ep_ranks, prompt, decode);
    if (generated) std::filesystem::remove_all(dir);
    return rc;
  }
  auto m = model::load(dir, {.threads = threads});
  if (!m) {
    std::fprintf(stderr, "%s\n", m.error().c_str());
    return 1;
  }
  const auto& c = m->text();
  std::vector<std::int64_t> map(std::size_t(c.vocab_size));
  for (std::size_t i = 0; i < map.size(); ++i)
    map[i] = std::int64_t(i) % c.engram_compressed_vocab_size;
  (void)m->set_engram_token_map(map);
  std::printf("model: %s, %d threads, OpenBLAS kernel %s\n",
              generated ? "small preset (seed 1)" : model_dir.c_str(), threads,
              troupe::kernels::blas_kernel_name().c_str());
  if (replay_prompt > 0) {
    const int rc = replay_bench(*m, replay_prompt);
    if (generated) std::filesystem::remove_all(dir);
    return rc;
  }

  auto tokens = [&](std::int64_t n, std::uint32_t seed) {
    std::vector<std::int64_t> t(static_cast<std::size_t>(n));
    for (auto& v : t) v = std::int64_t((seed = seed * 1664525u + 1013904223u) >> 8) % c.vocab_size;
    return t;
  };

  // Prefill: one sequence of `prompt` tokens in one call.
  {
    auto cache = m->new_sequence();
    auto p = tokens(prompt, 1);
    sequence_input in{&cache, p};
    auto t0 = clock_type::now();
    auto r = m->forward(std::span(&in, 1));
    const double s = seconds_since(t0);
    if (!r) return std::fprintf(stderr, "%s\n", r.error().c_str()), 1;
    const double floor = gemm_floor(c, prompt, 1);
    std::printf(
        "prefill %lld tokens: %.0f tokens/s; GEMM floor %.0f tokens/s; model / floor = %.2f\n",
        (long long)prompt, prompt / s, prompt / floor, s / floor);
  }
  // Decode at batch 1 and 8 after a prefill of `prompt` tokens each.
  for (std::int64_t batch : {1, 8}) {
    std::vector<sequence_cache> caches;
    for (std::int64_t b = 0; b < batch; ++b) {
      caches.push_back(m->new_sequence());
      auto p = tokens(prompt, 100 + std::uint32_t(b));
      sequence_input in{&caches.back(), p};
      if (!m->forward(std::span(&in, 1))) return 1;
    }
    std::vector<std::vector<std::int64_t>> next(std::size_t(batch), std::vector<std::int64_t>{5});
    auto t0 = clock_type::now();
    for (std::int64_t step = 0; step < decode; ++step) {
      std::vector<sequence_input> in;
      for (std::int64_t b = 0; b < batch; ++b)
        in.push_back({&caches[std::size_t(b)], next[std::size_t(b)]});
      auto r = m->forward(in);
      if (!r) return std::fprintf(stderr, "%s\n", r.error().c_str()), 1;
      for (std::int64_t b = 0; b < batch; ++b) {  // greedy
        const float* row = r->data() + b * c.vocab_size;
        next[std::size_t(b)][0] = std::max_element(row, row + c.vocab_size) - row;
      }
    }
    const double s = seconds_since(t0);
    const double floor = gemm_floor(c, batch, int(decode));
    std::printf(
        "decode batch %lld (context %lld): %.1f tokens/s; GEMM floor %.1f tokens/s; model / floor "
        "= %.2f\n",
        (long long)batch, (long long)prompt, batch * decode / s, batch * decode / floor, s / floor);
  }
  // DSpark drafting at batch 1 beside its peer in the same run: each decode step of the target
  // (one token, recording the draft features) then one draft call (that step's feature row,
  // a block of dspark_block_size tokens); the ratio is what drafting adds to a step.
  if (m->has_draft()) {
    auto cache = m->new_sequence();
    auto st = m->new_draft_state();
    auto p = tokens(prompt, 200);
    sequence_input in{&cache, p};
    std::vector<float> features;
    auto r = m->forward(std::span(&in, 1), nullptr, &features);
    if (!r) return std::fprintf(stderr, "%s\n", r.error().c_str()), 1;
    std::int64_t next = 5;
    double target_s = 0.0, draft_s = 0.0;
    for (std::int64_t step = 0; step < decode; ++step) {
      draft_input d{&st, features, next};
      auto t1 = clock_type::now();
      auto drafted = m->draft(std::span(&d, 1));
      draft_s += seconds_since(t1);
      if (!drafted) return std::fprintf(stderr, "%s\n", drafted.error().c_str()), 1;
      std::vector<std::int64_t> one{next};
      sequence_input step_in{&cache, one};
      auto t0 = clock_type::now();
      auto lg = m->forward(std::span(&step_in, 1), nullptr, &features);
      target_s += seconds_since(t0);
      if (!lg) return std::fprintf(stderr, "%s\n", lg.error().c_str()), 1;
      next = std::max_element(lg->begin(), lg->end()) - lg->begin();
    }
    std::printf(
        "dspark draft (block %lld, %lld stages, context %lld): %.2f ms per call; target decode "
        "step %.2f ms; draft / step = %.2f\n",
        (long long)c.dspark_block_size, (long long)c.num_nextn_predict_layers, (long long)prompt,
        1e3 * draft_s / double(decode), 1e3 * target_s / double(decode), draft_s / target_s);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("peak RSS %.0f MiB\n", ru.ru_maxrss / 1024.0);
  if (generated) std::filesystem::remove_all(dir);
  return 0;
}
