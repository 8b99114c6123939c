// bench_recipe: the recipe's speed beside its peers measured in the same run (docs/benchmarks.md).
//   tokenizer MB/s on the parity corpus, one thread, cold and warm piece cache, trusted and plain
//     mode; peer: HF tokenizers' Rust core on one thread (one encode_batch call over the corpus),
//     and deepseek_recipe's Tokenizer.encode;
//   request -> prompt -> ids per request (the accepted Chat Completions goldens); peer:
//     deepseek_recipe's ChatCompletionRequest.convert + DeepseekV4Encoding.encode;
//   a ~1M-token prompt end to end on 1 and 2 threads; peer: deepseek_recipe on the same body;
//   the stream parser, ns per token over a long reasoning + content + tool-call output; peer:
//     deepseek_recipe's StreamProcessor (one id per push, and all ids in one push).
// Usage: bench_recipe [--peer PYTHON] [--tokens N]   (PYTHON: tools/.venv-recipe/bin/python)
#include "recipe/chat_completions.hpp"
#include "recipe/parallel.hpp"
#include "recipe/prompt.hpp"
#include "recipe/stream_parser.hpp"
#include "recipe/tokenizer.hpp"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace troupe::recipe;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string k_root = TROUPE_SOURCE_DIR;
const std::string k_tok = k_root + "/recipe/data/deepseek-v4/tokenizer.json.gz";

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    std::cerr << "cannot open " << path << "\n";
    std::exit(1);
  }
  std::string out;
  std::array<char, 1 << 16> buf{};
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0)
    out.append(buf.data(), static_cast<std::size_t>(n));
  gzclose(f);
  return out;
}

std::vector<json> jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(gunzip(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

int main(int argc, char** argv) {
  std::string peer;
  std::size_t target_tokens = 1'000'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--peer") peer = argv[i + 1];
    else if (a == "--tokens") target_tokens = std::stoul(argv[i + 1]);
  }
  std::vector<std::string> corpus;
  double mb = 0;
  for (const auto& r : jsonl(k_root + "/tests/recipe/golden/corpus.jsonl.gz")) {
    corpus.push_back(r.get<std::string>());
    mb += static_cast<double>(corpus.back().size()) / 1e6;
  }

  // 1. tokenizer MB/s, one thread, a fresh tokenizer (cold piece cache) then the same one again.
  std::array<double, 2> trusted_mb_s{}, plain_mb_s{};
  std::size_t tokens = 0;
  for (const encode_mode mode : {encode_mode::trusted, encode_mode::plain}) {
    const tokenizer tok = tokenizer::from_file(k_tok);
    auto& out = mode == encode_mode::trusted ? trusted_mb_s : plain_mb_s;
    std::vector<token_id> ids;
    for (int pass = 0; pass < 2; ++pass) {
      tokens = 0;
      const double t = now();
      for (const auto& r : corpus) {
        ids.clear();
        tok.encode(r, mode, ids);
        tokens += ids.size();
      }
      out[pass] = mb / (now() - t);
    }
  }

  const tokenizer tok = tokenizer::from_file(k_tok);
  // 2. request -> ids on the accepted Chat Completions goldens (warm).
  std::vector<std::string> bodies;
  for (const auto& r : jsonl(k_root + "/tests/recipe/golden/chat_completions.v4.jsonl.gz")) {
    if (r.contains("error")) continue;
    const std::string b = dump(r.at("request"));
    if (std::holds_alternative<chat_completions_request>(parse_chat_completions(b))) bodies.push_back(b);
  }
  const int rounds = 200;
  std::size_t sink = 0;
  double t = now();
  for (int k = 0; k < rounds; ++k)
    for (const auto& b : bodies) {
      auto r = parse_chat_completions(b);
      sink += encode_prompt(std::get<chat_completions_request>(r).conversation, tok).ids.size();
    }
  const double request_us = (now() - t) / (rounds * static_cast<double>(bodies.size())) * 1e6;

  // 3. a ~1M-token prompt: 8 alternating user / assistant turns of corpus text, chat mode.
  const fs::path work = fs::temp_directory_path() / ("troupe-bench-recipe-" + std::to_string(::getpid()));
  fs::create_directories(work);
  json big = {{"model", "DeepSeek-V4-Pro"}, {"thinking", {{"type", "disabled"}}}};
  big["messages"].push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  {
    const tokenizer sizing = tokenizer::from_file(k_tok);
    std::size_t est = 0, next = 0;
    for (int turn = 0; turn < 8; ++turn) {
      std::string text;
      while (est < target_tokens * (turn + 1) / 8 && next < corpus.size() * 4) {
        const auto& r = corpus[next++ % corpus.size()];
        est += sizing.encode(r, encode_mode::raw).size() + 1;
        text += r + "\n";
      }
      big["messages"].push_back({{"role", turn % 2 ? "assistant" : "user"}, {"content", text}});
    }
  }
  const std::string big_body = dump(big);
  std::ofstream(work / "prompt_1m.json") << big_body;
  auto big_req = parse_chat_completions(big_body);
  const auto& big_conv = std::get<chat_completions_request>(big_req).conversation;
  std::array<double, 2> cold_s{}, warm_s{};
  const std::vector<token_id> sequential = encode_prompt(big_conv, tok).ids;
  for (unsigned threads : {1u, 2u}) {
    const tokenizer fresh = tokenizer::from_file(k_tok);
    thread_pool pool(threads);
    for (int pass = 0; pass < 2; ++pass) {
      t = now();
      const auto ids = encode_prompt(big_conv, fresh, pool).ids;
      (pass == 0 ? cold_s : warm_s)[threads - 1] = now() - t;
      if (ids != sequential) {
        std::cerr << "the pooled prompt differs from the sequential one\n";
        return 1;
      }
    }
  }
  const std::size_t big_tokens = sequential.size();
  // The speedup this machine offers right now: a loop with no shared state split the same way.
  std::array<double, 2> control_s{};
  for (unsigned threads : {1u, 2u}) {
    thread_pool pool(threads);
    std::array<std::uint64_t, 8> acc{};
    t = now();
    pool.parallel_for(acc.size(), [&](std::size_t i) {
      std::uint64_t x = i + 1;
      for (int k = 0; k < 20'000'000; ++k) x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      acc[i] = x;
    });
    control_s[threads - 1] = now() - t;
    sink += acc[0] & 1;
  }

  // 4. the stream parser over a long thinking-mode output with tool calls.
  const json stream_req = {
      {"model", "DeepSeek-V4-Pro"}, {"thinking", {{"type", "enabled"}}},
      {"messages", {{{"role", "user"}, {"content", "hi"}}}},
      {"tools", {{{"type", "function"},
                  {"function", {{"name", "search"}, {"parameters", {{"type", "object"}}}}}}}}};
  std::ofstream(work / "stream_request.json") << dump(stream_req);
  std::vector<token_id> gen;
  {
    auto raw = [&](const std::string& s) {
      const auto ids = tok.encode(s, encode_mode::raw);
      gen.insert(gen.end(), ids.begin(), ids.end());
    };
    auto markup = [&](const std::string& s) {
      const auto ids = tok.encode(s, encode_mode::trusted);
      gen.insert(gen.end(), ids.begin(), ids.end());
    };
    std::size_t r = 0;
    while (gen.size() < 40'000) raw(corpus[r++]);
    markup("</think>");
    while (gen.size() < 80'000) raw(corpus[r++]);
    markup("\n\n<｜DSML｜tool_calls>\n");
    for (int call = 0; call < 3; ++call) {
      markup("<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">");
      const std::size_t until = gen.size() + 6'000;
      while (gen.size() < until) raw(corpus[r++]);
      markup("</｜DSML｜parameter>\n<｜DSML｜parameter name=\"k\" string=\"false\">7</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n");
    }
    markup("</｜DSML｜tool_calls>");
  }
  std::ofstream(work / "stream_ids.json") << json(gen).dump();
  stream_options so;
  so.start = stream_start::reasoning;
  so.parse_tool_calls = true;
  double stream_ns = 1e30;
  std::size_t events = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto p = std::get<stream_parser>(stream_parser::create(tok, so));
    std::vector<stream_event> out;
    t = now();
    for (const token_id id : gen) {
      out.clear();
      p.push(id, out);
      events += out.size();
    }
    p.finish(backend_finish::stop, out);
    stream_ns = std::min(stream_ns, (now() - t) / static_cast<double>(gen.size()) * 1e9);
  }

  std::printf("tokenizer: corpus %.1f MB, %zu tokens, one thread\n", mb, tokens);
  std::printf("  troupe trusted: cold %.2f MB/s, warm %.2f MB/s; plain: cold %.2f MB/s, warm %.2f MB/s\n",
              trusted_mb_s[0], trusted_mb_s[1], plain_mb_s[0], plain_mb_s[1]);
  std::printf("request -> ids: %zu Chat Completions goldens x %d rounds: %.1f us/request\n",
              bodies.size(), rounds, request_us);
  std::printf("1M-token prompt: %zu tokens, %.1f MB body: 1 thread %.3f s cold / %.3f s warm; "
              "2 threads %.3f s cold / %.3f s warm (speedup %.2f cold, %.2f warm)\n",
              big_tokens, static_cast<double>(big_body.size()) / 1e6, cold_s[0], warm_s[0], cold_s[1],
              warm_s[1], cold_s[0] / cold_s[1], warm_s[0] / warm_s[1]);
  std::printf("  peer: a loop with no shared state on the same pool: speedup %.2f on 2 threads "
              "(the parallelism this machine gives now)\n", control_s[0] / control_s[1]);
  std::printf("stream parser: %zu generated tokens (reasoning, content, 3 tool calls): %.1f ns/token\n",
              gen.size(), stream_ns);
  if (sink == 0 || events == 0) return 1;  // keeps the measured work from being optimized out

  if (!peer.empty()) {
    const std::string cmd = "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false " + peer + " " + k_root
                            + "/tools/recipe_bench_peer.py " + work.string();
    FILE* f = ::popen(cmd.c_str(), "r");
    std::string text;
    std::array<char, 4096> buf{};
    while (f && std::fgets(buf.data(), buf.size(), f)) text += buf.data();
    const int rc = f ? ::pclose(f) : -1;
    if (rc != 0 || text.empty()) {
      std::cerr << "peer failed: " << cmd << "\n";
      return 1;
    }
    const json p = json::parse(text);
    const double hf_tc = p["hf_trusted_cold_mb_s"], hf_tw = p["hf_trusted_warm_mb_s"];
    const double hf_pc = p["hf_plain_cold_mb_s"], hf_pw = p["hf_plain_warm_mb_s"];
    std::printf("peer HF tokenizers %s (Rust core, encode_batch, 1 thread): trusted cold %.2f / warm %.2f "
                "MB/s, plain cold %.2f / warm %.2f MB/s\n",
                p["tokenizers"].get<std::string>().c_str(), hf_tc, hf_tw, hf_pc, hf_pw);
    std::printf("  ratio troupe / HF: trusted cold %.2f, warm %.2f; plain cold %.2f, warm %.2f\n",
                trusted_mb_s[0] / hf_tc, trusted_mb_s[1] / hf_tw, plain_mb_s[0] / hf_pc, plain_mb_s[1] / hf_pw);
    std::printf("  HF tokenizers one encode call per record from Python: trusted %.2f MB/s\n",
                p["hf_trusted_per_record_mb_s"].get<double>());
    const double dr_tok = p["dr_tokenizer_encode_mb_s"];
    std::printf("peer deepseek_recipe %s Tokenizer.encode (per record from Python): %.2f MB/s; ratio "
                "(troupe trusted warm) %.2f\n",
                p["deepseek_recipe"].get<std::string>().c_str(), dr_tok, trusted_mb_s[1] / dr_tok);
    const double dr_us = p["dr_request_us"];
    std::printf("peer deepseek_recipe request -> ids (convert + encode, from Python): %.1f us/request; "
                "ratio %.2f\n", dr_us, dr_us / request_us);
    const double dr_1m = p["dr_1m_prompt_s"];
    std::printf("peer deepseek_recipe 1M-token prompt: %.3f s (%zu tokens; ours %zu); ratio vs troupe "
                "1 thread cold %.2f, 2 threads cold %.2f\n",
                dr_1m, p["dr_1m_prompt_tokens"].get<std::size_t>(), big_tokens, dr_1m / cold_s[0],
                dr_1m / cold_s[1]);
    const double each = p["dr_stream_ns_per_token_push_each"], all = p["dr_stream_ns_per_token_push_all"];
    std::printf("peer deepseek_recipe StreamProcessor: %.1f ns/token one id per push (Python), %.1f "
                "ns/token all ids in one push; ratio %.2f / %.2f\n",
                each, all, each / stream_ns, all / stream_ns);
  }
  if (std::getenv("TROUPE_BENCH_KEEP") == nullptr) fs::remove_all(work);
  else std::printf("inputs kept in %s\n", work.string().c_str());
  return 0;
}
