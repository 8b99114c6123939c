#include "cluster/recipe_cli.hpp"

#include "recipe/recipe.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::cli {

// The default tokenizer: $TROUPE_TOKENIZER, then <prefix>/share/troupe/tokenizers beside an
// installed binary, then the source tree.
std::string default_tokenizer() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("TROUPE_TOKENIZER"); env && *env) return env;
  const fs::path rel = fs::path("deepseek-v4") / "tokenizer.json.gz";
  std::error_code ec;
  const fs::path exe = fs::canonical(fs::path("/proc/self/exe"), ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / TROUPE_INSTALL_TOKENIZERS_RELDIR / rel;
    if (fs::is_regular_file(installed, ec)) return installed.string();
  }
  return (fs::path(TROUPE_TOKENIZERS_DIR) / rel).string();
}

namespace {

namespace fs = std::filesystem;
using namespace troupe::recipe;

struct common_args {
  std::string tokenizer;  // empty: $TROUPE_TOKENIZER, the installed one, the source tree's
};

std::optional<codec> load(const common_args& a) {
  const std::string path = a.tokenizer.empty() ? default_tokenizer() : a.tokenizer;
  auto r = codec::load(path);
  if (auto* e = std::get_if<load_error>(&r)) {
    std::cerr << "error: " << e->message << "\n";
    return std::nullopt;
  }
  return std::get<codec>(std::move(r));
}

// The contents of `path` ("-" = stdin), or an error on stderr.
std::optional<std::string> read_input(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "error: cannot read " << path << "\n";
    return std::nullopt;
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A JSON array of token ids; errors name what is wrong.
std::optional<std::vector<token_id>> parse_ids(const std::string& text, const codec& c,
                                               const std::string& where) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    std::cerr << "error: " << where << ": expected a JSON array of token ids\n";
    return std::nullopt;
  }
  std::vector<token_id> ids;
  for (std::size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_unsigned() || j[i].get<std::uint64_t>() >= c.tokenizer().vocab_size()) {
      std::cerr << "error: " << where << "[" << i << "]: " << j[i].dump()
                << " is not a token id (0.." << c.tokenizer().vocab_size() - 1 << ")\n";
      return std::nullopt;
    }
    ids.push_back(j[i].get<token_id>());
  }
  return ids;
}

std::string ids_json(const std::vector<token_id>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::optional<protocol> parse_protocol(const std::string& name) {
  auto p = protocol_from_name(name);
  if (!p) std::cerr << "error: unknown protocol " << name << " (known: chat, responses, messages)\n";
  return p;
}

}  // namespace

void add_recipe_commands(CLI::App& app, int& rc) {
  auto common = std::make_shared<common_args>();
  auto add_tokenizer = [common](CLI::App* cmd) {
    cmd->add_option("--tokenizer", common->tokenizer,
                    "tokenizer.json(.gz) (default: $TROUPE_TOKENIZER, else the shipped DeepSeek-V4 file)");
  };

  // troupe tokenize
  struct tokenize_args {
    std::string file, text;
    bool trusted = false, raw = false;
  };
  auto ta = std::make_shared<tokenize_args>();
  auto* tokenize = app.add_subcommand(
      "tokenize",
      "print the token ids of a text as a JSON array. Default mode (HF's split_special_tokens): the "
      "added tokens marked special (<｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, ...) stay text, but the "
      "53 not marked special (<｜User｜>, <｜Assistant｜>, <think>, </think>, ｜DSML｜, the tool and FIM "
      "markers, ...) are still matched as tokens; --trusted matches every added token (HF's default "
      "encode); --raw matches none, every string is text (how the prompt encoder tokenizes conversation "
      "text)");
  auto* file_opt = tokenize->add_option("--file", ta->file, "read the text from a file (- = stdin)");
  auto* text_opt = tokenize->add_option("--text", ta->text, "the text");
  file_opt->excludes(text_opt);
  auto* trusted = tokenize->add_flag("--trusted", ta->trusted, "match every added token, special or not (HF's default encode)");
  tokenize->add_flag("--raw", ta->raw, "match no added token: every string is text (the prompt encoder's mode for conversation text)")->excludes(trusted);
  add_tokenizer(tokenize);
  tokenize->callback([ta, common, text_opt, &rc] {
    auto c = load(*common);
    if (!c) return void(rc = 1);
    std::string text = ta->text;
    if (text_opt->count() == 0) {
      auto in = read_input(ta->file.empty() ? "-" : ta->file);
      if (!in) return void(rc = 1);
      text = std::move(*in);
    }
    const auto mode = ta->trusted ? encode_mode::trusted : ta->raw ? encode_mode::raw : encode_mode::plain;
    std::cout << ids_json(c->tokenize(text, mode)) << "\n";
    rc = 0;
  });

  // troupe detokenize
  struct detokenize_args {
    std::string ids;
    bool skip_special = false;
  };
  auto da = std::make_shared<detokenize_args>();
  auto* detokenize = app.add_subcommand(
      "detokenize", "print the text of token ids (a JSON array from --ids or stdin)");
  auto* ids_opt = detokenize->add_option("--ids", da->ids, "the ids as a JSON array");
  detokenize->add_flag("--skip-special", da->skip_special, "leave special tokens out");
  add_tokenizer(detokenize);
  detokenize->callback([da, common, ids_opt, &rc] {
    auto c = load(*common);
    if (!c) return void(rc = 1);
    std::string text = da->ids;
    if (ids_opt->count() == 0) {
      auto in = read_input("-");
      if (!in) return void(rc = 1);
      text = std::move(*in);
    }
    auto ids = parse_ids(text, *c, ids_opt->count() ? "--ids" : "stdin");
    if (!ids) return void(rc = 1);
    std::cout << c->detokenize(*ids, da->skip_special);
    rc = 0;
  });

  // troupe encode
  struct encode_args {
    std::string protocol = "chat", request;
  };
  auto ea = std::make_shared<encode_args>();
  auto* encode = app.add_subcommand(
      "encode", "encode an API request: prints {\"prompt\": text, \"ids\": [...]} as one JSON line");
  encode->add_option("--protocol", ea->protocol, "chat (Chat Completions) | responses (OpenAI Responses) | messages (Anthropic Messages)");
  encode->add_option("REQUEST", ea->request, "the request body, JSON (- = stdin)")->required();
  add_tokenizer(encode);
  encode->callback([ea, common, &rc] {
    const auto p = parse_protocol(ea->protocol);
    if (!p) return void(rc = 1);
    auto body = read_input(ea->request);
    if (!body) return void(rc = 1);
    auto c = load(*common);
    if (!c) return void(rc = 1);
    auto r = c->encode(*p, *body);
    if (auto* e = std::get_if<api_error>(&r)) {
      std::cerr << "error: " << e->status << " " << error_json(*p, *e) << "\n";
      return void(rc = 1);
    }
    const auto& req = std::get<encoded_request>(r);
    nlohmann::ordered_json out;
    out["prompt"] = req.prompt.text;
    out["ids"] = req.prompt.ids;
    std::cout << out.dump() << "\n";
    rc = 0;
  });

  // troupe parse-stream
  struct parse_args {
    std::string protocol = "chat", request, finish = "stop", id, model = "troupe";
    bool neutral = false, thinking = false, tools = false;
    std::int64_t created = 0;
  };
  auto pa = std::make_shared<parse_args>();
  auto* parse = app.add_subcommand(
      "parse-stream", "read generated token ids (a JSON array on stdin) and print the protocol's "
                      "stream events as JSON lines");
  parse->add_option("--protocol", pa->protocol,
                    "chat (chat.completion.chunk objects) | responses (Responses events) | messages (Messages events)");
  auto* req_opt = parse->add_option(
      "--request", pa->request,
      "the request the ids answer (sets thinking, tools, tool_choice, prefix, stop, include_usage, model)");
  auto* thinking_opt = parse->add_flag("--thinking", pa->thinking, "without --request: thinking mode");
  auto* tools_opt = parse->add_flag("--tools", pa->tools, "without --request: parse DSML tool calls");
  thinking_opt->excludes(req_opt);
  tools_opt->excludes(req_opt);
  parse->add_option("--finish", pa->finish, "why the backend stopped: stop | length | content_filter")
      ->check(CLI::IsMember({"stop", "length", "content_filter"}));
  parse->add_option("--id", pa->id, "the response id (default chatcmpl-troupe, resp_troupe or msg_troupe)");
  parse->add_option("--created", pa->created, "the created time in the chunks (default 0)");
  parse->add_flag("--neutral", pa->neutral, "print troupe's protocol-neutral events instead");
  add_tokenizer(parse);
  parse->callback([pa, common, req_opt, &rc] {
    const auto p = parse_protocol(pa->protocol);
    if (!p) return void(rc = 1);
    auto c = load(*common);
    if (!c) return void(rc = 1);
    encoded_request req;
    req.protocol = *p;
    req.stream.start = pa->thinking ? stream_start::reasoning : stream_start::content;
    req.stream.parse_tool_calls = pa->tools;
    req.params.model = pa->model;
    if (req_opt->count()) {
      auto body = read_input(pa->request);
      if (!body) return void(rc = 1);
      auto r = c->encode(*p, *body);
      if (auto* e = std::get_if<api_error>(&r)) {
        std::cerr << "error: --request: " << e->status << " " << error_json(*p, *e) << "\n";
        return void(rc = 1);
      }
      req = std::get<encoded_request>(std::move(r));
    }
    auto in = read_input("-");
    if (!in) return void(rc = 1);
    auto ids = parse_ids(*in, *c, "stdin");
    if (!ids) return void(rc = 1);
    stream_parser parser = c->create_stream_parser(req);
    event_stream_options eo;
    eo.id = !pa->id.empty() ? pa->id
          : *p == protocol::responses ? "resp_troupe"
          : *p == protocol::messages  ? "msg_troupe"
                                      : "chatcmpl-troupe";
    eo.created = pa->created;
    stream_renderer render(req, eo);
    auto print = [&](const std::vector<stream_event>& events) {
      if (pa->neutral) {
        for (const auto& e : events) {
          nlohmann::ordered_json j;
          using k = stream_event::kind;
          switch (e.type) {
            case k::text: j = {{"type", "text"}, {"text", e.text}}; break;
            case k::reasoning: j = {{"type", "reasoning"}, {"text", e.text}}; break;
            case k::tool_call: j = {{"type", "tool_call"}, {"index", e.index}, {"name", e.text}}; break;
            case k::arguments: j = {{"type", "arguments"}, {"index", e.index}, {"text", e.text}}; break;
            case k::finish: j = {{"type", "finish"}, {"reason", to_string(e.finish)}}; break;
            case k::usage:
              j = {{"type", "usage"}, {"prompt_tokens", e.usage.prompt_tokens},
                   {"completion_tokens", e.usage.completion_tokens}};
              if (e.usage.reasoning_tokens) j["reasoning_tokens"] = *e.usage.reasoning_tokens;
              break;
          }
          std::cout << j.dump() << "\n";
        }
        return;
      }
      std::vector<std::string> chunks;
      render.render(events, chunks);
      for (const auto& s : chunks) std::cout << s << "\n";
    };
    if (!pa->neutral) {
      std::vector<std::string> first;
      render.start(first);
      for (const auto& s : first) std::cout << s << "\n";
    }
    for (const token_id id : *ids) {
      std::vector<stream_event> events;
      parser.push(id, events);
      print(events);
    }
    std::vector<stream_event> events;
    parser.finish(pa->finish == "length" ? backend_finish::length
                  : pa->finish == "content_filter" ? backend_finish::content_filter : backend_finish::stop,
                  events);
    print(events);
    rc = 0;
  });
}

}  // namespace troupe::cli
