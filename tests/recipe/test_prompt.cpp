// The DeepSeek-V4 prompt encoder: exact prompt text and ids against deepseek_recipe 0.2.0's
// goldens (tools/prompt_golden.py), and the safety rule: no control-token id outside the
// encoder's own positions, whatever the conversation text spells.
#include "recipe/prompt.hpp"
#include "recipe/tokenizer.hpp"

#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace troupe::recipe;
using json = nlohmann::ordered_json;  // keeps the key order of tool parameters

namespace {
const tokenizer& v4() {
  static const tokenizer t =
      tokenizer::from_file(std::string(TROUPE_SOURCE_DIR) + "/recipe/data/deepseek-v4/tokenizer.json.gz");
  return t;
}

std::vector<json> golden() {
  const std::string path = std::string(TROUPE_SOURCE_DIR) + "/tests/recipe/golden/prompts.v4.jsonl.gz";
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string all;
  std::array<char, 1 << 16> buf{};
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) all.append(buf.data(), n);
  gzclose(f);
  std::vector<json> out;
  std::istringstream in(all);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

conversation from_json(const json& j) {
  conversation c;
  c.thinking = j.at("thinking").get<bool>();
  const auto tc = j.at("tool_choice").get<std::string>();
  c.tool_choice = tc == "none" ? tool_choice::none : tc == "required" ? tool_choice::required : tool_choice::automatic;
  if (!j.at("reasoning_effort").is_null()) {
    const auto e = j.at("reasoning_effort").get<std::string>();
    c.effort = e == "low" ? reasoning_effort::low : e == "xhigh" ? reasoning_effort::xhigh
             : e == "max" ? reasoning_effort::max : reasoning_effort::high;
  }
  for (const auto& t : j.at("tools")) {
    tool_definition d;
    d.name = t.at("name").get<std::string>();
    if (t.contains("description") && !t["description"].is_null()) d.description = t["description"].get<std::string>();
    if (t.contains("parameters")) d.parameters_json = t["parameters"].dump();
    c.tools.push_back(std::move(d));
  }
  for (const auto& m : j.at("messages")) {
    message msg;
    const auto r = m.at("role").get<std::string>();
    msg.role = r == "system" ? role::system : r == "user" ? role::user : r == "tool" ? role::tool : role::assistant;
    msg.content = m.at("content").get<std::string>();
    if (m.contains("reasoning")) msg.reasoning = m["reasoning"].get<std::string>();
    if (m.contains("prefix")) msg.prefix = m["prefix"].get<bool>();
    if (m.contains("tool_calls"))
      for (const auto& call : m["tool_calls"])
        msg.tool_calls.push_back({call.at("id").get<std::string>(), call.at("name").get<std::string>(),
                                  call.at("arguments").get<std::string>()});
    c.messages.push_back(std::move(msg));
  }
  return c;
}

// Added tokens of the V4 file: ids 0-2 (BOS, EOS, pad) and 128000 and up.
bool is_control(token_id id) { return id < 3 || id >= 128000; }

void check_safe(const encoded_prompt& p) {
  const std::set<std::size_t> own(p.control.begin(), p.control.end());
  for (std::size_t i = 0; i < p.ids.size(); ++i) {
    INFO("position " << i << " id " << p.ids[i]);
    CHECK(is_control(p.ids[i]) == own.contains(i));
  }
  CHECK(v4().decode(p.ids) == p.text);
}
}  // namespace

TEST_CASE("prompt: DeepSeek-V4 goldens from deepseek_recipe (text and ids exact)") {
  const auto records = golden();
  REQUIRE(records.size() >= 30);
  std::size_t same = 0;
  for (const auto& rec : records) {
    const auto c = from_json(rec.at("conversation"));
    const auto p = encode_prompt(c, v4());
    const auto want_ids = rec.at("ids").get<std::vector<token_id>>();
    INFO(rec.at("name").get<std::string>());
    CHECK(p.text == rec.at("prompt").get<std::string>());
    CHECK(p.ids == want_ids);
    check_safe(p);
    same += p.text == rec.at("prompt").get<std::string>() && p.ids == want_ids;
  }
  MESSAGE(same << " / " << records.size() << " golden prompts identical");
}
