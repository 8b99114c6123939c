// Test helpers for the real device ports: a tiny random model written once per test run, a
// real actor system with a scoped actor to send requests, and step builders.
#pragma once

#include "kernels/generate.hpp"
#include "kernels/model.hpp"
#include "kernels/model_init.hpp"
#include "kernels/safetensors.hpp"
#include "ports/cpu_device.hpp"
#include "runtime/ports/device.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <map>
#include <string>
#include <vector>

namespace troupe::test {

/// A directory of tiny random models, removed when the test binary exits.
class model_dirs {
public:
  /// The tiny preset written with `seed` (once per run).
  static const std::filesystem::path& tiny(std::uint64_t seed = 11) {
    static model_dirs dirs;
    auto i = dirs.written_.find(seed);
    if (i != dirs.written_.end())
      return i->second;
    auto dir = dirs.root_ / ("tiny-" + std::to_string(seed));
    auto ok = kernels::write_random_model(dir, "tiny", seed);
    REQUIRE_MESSAGE(ok.ok(), ok.error());
    return dirs.written_.emplace(seed, dir).first->second;
  }

  /// The tiny preset with its LM head and its drafts' Markov head all zero: every logit of the
  /// model and of its drafts is 0, so greedy draws id 0 and every draft (id 0) is accepted,
  /// while a seeded draw is uniform over the vocabulary at its position (written once per run).
  static const std::filesystem::path& tiny_uniform() {
    static const std::filesystem::path dir = [] {
      auto d = tiny(11).parent_path() / "tiny-uniform";
      auto ok = kernels::write_random_model(d, "tiny", 11);
      REQUIRE_MESSAGE(ok.ok(), ok.error());
      const auto file = d / "model.safetensors";
      std::string bytes;
      {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
      }
      auto header = kernels::parse_safetensors_header(
        std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), file.string());
      REQUIRE_MESSAGE(header.ok(), header.error());
      int zeroed = 0;
      for (const auto& t : header->tensors) {
        if (t.name != "head.weight" && !t.name.ends_with("markov_head.head.weight"))
          continue;
        std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(header->data_start + t.begin),
                  bytes.begin() + static_cast<std::ptrdiff_t>(header->data_start + t.end), '\0');
        ++zeroed;
      }
      REQUIRE(zeroed == 2);
      std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
      return d;
    }();
    return dir;
  }

  ~model_dirs() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

private:
  model_dirs()
    : root_(std::filesystem::temp_directory_path()
            / ("troupe-test-ports-" + std::to_string(::getpid()))) {}
  std::filesystem::path root_;
  std::map<std::uint64_t, std::filesystem::path> written_;
};

/// The tiny model loaded as `troupe generate` loads it (its Engram map the identity).
inline kernels::model load_tiny(kernels::model_options options = {}, std::uint64_t seed = 11) {
  auto m = kernels::model::load(model_dirs::tiny(seed), options);
  REQUIRE_MESSAGE(m.ok(), m.error());
  auto map = kernels::load_engram_token_map(*m, "identity");
  REQUIRE_MESSAGE(map.ok(), map.error());
  REQUIRE(m->set_engram_token_map(std::move(*map)).ok());
  return std::move(*m);
}

/// Parameters of a CPU device on the tiny model.
inline ports::cpu_device_params tiny_params(std::uint64_t seed = 11) {
  ports::cpu_device_params p;
  p.model_dir = model_dirs::tiny(seed);
  p.engram_map = "identity";
  return p;
}

/// A deterministic prompt of `n` ids in [3, vocab).
inline std::vector<std::int32_t> prompt(std::size_t n, std::uint32_t seed,
                                        std::int32_t vocab = 256) {
  std::vector<std::int32_t> t(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<std::int32_t>(3 + (x >> 8) % static_cast<std::uint32_t>(vocab - 3));
  }
  return t;
}

/// One sequence's share of a step: `tokens` at `position`, sampling greedily when `sample`.
inline runtime::step_sequence seq(std::uint64_t id, std::uint64_t position,
                                  std::vector<std::int32_t> tokens, bool sample = true,
                                  runtime::sampling params = {.temperature = 0.0}) {
  runtime::step_sequence s;
  s.sequence = id;
  s.position = position;
  s.count = static_cast<std::uint32_t>(tokens.size());
  s.tokens = std::move(tokens);
  s.sample = sample;
  s.params = params;
  return s;
}

/// A step of the given sequences (its totals filled in).
inline runtime::device_step step(std::vector<runtime::step_sequence> batch,
                                 std::uint64_t id = 1) {
  runtime::device_step s;
  s.id = id;
  s.phase = runtime::step_phase::decode;
  for (const auto& b : batch) {
    s.tokens += b.count;
    s.context_tokens += b.position + b.count;
  }
  s.sequences = static_cast<std::uint32_t>(batch.size());
  s.batch = std::move(batch);
  return s;
}

/// An actor system config that renders device errors by name.
struct device_config {
  caf::actor_system_config cfg;
  device_config() {
    cfg.add_error_category(runtime::device_error_category,
                           [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
                             auto text = "device: "
                                         + to_string(static_cast<runtime::device_errc>(code));
                             if (ctx.match_elements<std::string>())
                               text += " (" + ctx.get_as<std::string>(0) + ")";
                             return text;
                           });
  }
};

/// A real actor system with a scoped actor that asks ports and waits for the answers.
struct device_fixture : device_config {
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  device_fixture() = default;

  /// The reply to `msg`, or the error (a minute at most).
  template <class T, class Msg>
  caf::expected<T> ask(const runtime::device_port& dev, Msg msg) {
    caf::expected<T> out{caf::error{}};
    self->request(dev, std::chrono::seconds(60), std::move(msg))
      .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  caf::expected<runtime::device_result> run(const runtime::device_port& dev,
                                            runtime::device_step s) {
    return ask<runtime::device_result>(dev, std::move(s));
  }

  /// The one token a step sampled.
  runtime::sampled_token sampled(const runtime::device_port& dev, runtime::device_step s) {
    auto r = run(dev, std::move(s));
    REQUIRE_MESSAGE(r, sys.render(r.error()));
    REQUIRE(r->sampled.size() == 1);
    return r->sampled[0];
  }

  /// The token of a step whose batch sampled exactly one.
  std::int32_t token(const runtime::device_port& dev, runtime::device_step s) {
    return sampled(dev, std::move(s)).token;
  }

  /// Prefills `prompt` as sequence `id` in one step, then decodes greedily: `n` tokens. With
  /// `logprobs`, also each token's logprob (which shows a difference in the logits' last bits).
  std::vector<std::int32_t> greedy(const runtime::device_port& dev, std::uint64_t id,
                                   const std::vector<std::int32_t>& prompt, std::size_t n,
                                   std::vector<float>* logprobs = nullptr) {
    const runtime::sampling params{.temperature = 0.0, .top_logprobs = logprobs ? 0 : -1};
    std::vector<std::int32_t> out;
    auto next = [&](runtime::device_step s) {
      auto t = sampled(dev, std::move(s));
      out.push_back(t.token);
      if (logprobs)
        logprobs->push_back(t.logprob);
    };
    next(step({seq(id, 0, prompt, true, params)}));
    while (out.size() < n)
      next(step({seq(id, prompt.size() + out.size() - 1, {out.back()}, true, params)}));
    return out;
  }

  /// Continues sequence `id` (holding `position` tokens, `last` its last sampled token not yet
  /// run) greedily for `n` tokens.
  std::vector<std::int32_t> continue_greedy(const runtime::device_port& dev, std::uint64_t id,
                                            std::uint64_t position, std::int32_t last,
                                            std::size_t n,
                                            std::vector<float>* logprobs = nullptr) {
    const runtime::sampling params{.temperature = 0.0, .top_logprobs = logprobs ? 0 : -1};
    std::vector<std::int32_t> out;
    for (std::size_t i = 0; i < n; ++i) {
      auto t = sampled(dev, step({seq(id, position++, {last}, true, params)}));
      last = t.token;
      out.push_back(last);
      if (logprobs)
        logprobs->push_back(t.logprob);
    }
    return out;
  }

  /// A CPU device, stopped with the fixture.
  runtime::device_port cpu(ports::cpu_device_params p) {
    return keep(ports::spawn_cpu_device(sys, std::move(p)));
  }

  /// Stops `dev` with the fixture.
  runtime::device_port keep(runtime::device_port dev) {
    devices.push_back(dev);
    return dev;
  }

  std::vector<runtime::device_port> devices;

  ~device_fixture() {
    for (auto& d : devices)
      self->send_exit(d, caf::exit_reason::user_shutdown);
  }
};

} // namespace troupe::test
