// The scripted generation service of the entrypoint tests (see fake_service.hpp).
#include "fake_service.hpp"

#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>

namespace troupe::test {

using namespace troupe::actors;

std::size_t fake_log::request_count() const {
  std::lock_guard g{mtx};
  return requests.size();
}

std::size_t fake_log::cancel_count() const {
  std::lock_guard g{mtx};
  return cancels;
}

std::size_t fake_log::active_count() const {
  std::lock_guard g{mtx};
  return active;
}

std::optional<generation_request> fake_log::last_request() const {
  std::lock_guard g{mtx};
  if (requests.empty())
    return std::nullopt;
  return requests.back();
}

namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;

struct request_state {
  generation_request req;
  fake_script script;
  std::shared_ptr<fake_log> log;
  std::size_t pos = 0;
  std::uint32_t sent = 0;
  bool done = false;
  static inline const char* name = "fake_request";
};

using request_actor = caf::stateful_actor<request_state>;

void end(request_actor* self, finish_reason reason, std::string error = {}) {
  auto& st = self->state;
  if (st.done)
    return;
  st.done = true;
  generation_end e;
  e.id = st.req.id;
  e.reason = reason;
  e.error = std::move(error);
  e.prompt_tokens = static_cast<std::uint32_t>(st.req.prompt.size());
  e.completion_tokens = st.sent;
  self->send(st.req.sink, std::move(e));
  {
    std::lock_guard g{st.log->mtx};
    ++st.log->ends;
    st.log->reasons.push_back(reason);
  }
  self->quit();
}

void tick(request_actor* self) {
  auto& st = self->state;
  if (st.done)
    return;
  generation_tokens t;
  t.id = st.req.id;
  bool stop = false;
  while (t.tokens.size() < st.script.per_message) {
    if (st.sent >= st.req.max_tokens || st.pos >= st.script.tokens.size())
      break;
    if (st.script.fail_after && st.sent >= *st.script.fail_after)
      break;
    if (st.script.exit_after && st.sent >= *st.script.exit_after)
      break;
    const std::int32_t token = st.script.tokens[st.pos++];
    t.tokens.push_back(token);
    if (st.req.sampling.top_logprobs >= 0)
      t.logprobs.push_back({st.req.id, token, -0.5f, {}});
    ++st.sent;
    const auto& ids = st.req.stop_ids;
    if (std::find(ids.begin(), ids.end(), token) != ids.end()) {
      stop = true;
      break;
    }
  }
  if (!t.tokens.empty())
    self->send(st.req.sink, std::move(t));
  if (stop || st.pos >= st.script.tokens.size()) {
    end(self, finish_reason::stop);
    return;
  }
  if (st.sent >= st.req.max_tokens) {
    end(self, finish_reason::length);
    return;
  }
  if (st.script.fail_after && st.sent >= *st.script.fail_after) {
    end(self, finish_reason::error, "scripted failure");
    return;
  }
  if (st.script.exit_after && st.sent >= *st.script.exit_after) {
    st.done = true;
    self->quit();  // no generation_end
    return;
  }
  self->delayed_send(self, st.script.delay, tick_atom::value);
}

caf::behavior fake_request(request_actor* self, generation_request req, fake_script script,
                           std::shared_ptr<fake_log> log) {
  self->state.req = std::move(req);
  self->state.script = std::move(script);
  self->state.log = std::move(log);
  self->attach_functor([log = self->state.log] {
    std::lock_guard g{log->mtx};
    --log->active;
  });
  self->delayed_send(self, self->state.script.delay, tick_atom::value);
  return {
    [self](tick_atom) { tick(self); },
    [self](cancel_atom) {
      auto& st = self->state;
      {
        std::lock_guard g{st.log->mtx};
        ++st.log->cancels;
      }
      if (!st.script.ignore_cancel)
        end(self, finish_reason::cancelled);
    },
  };
}

} // namespace

generation_service spawn_fake_service(caf::actor_system& sys, script_chooser choose,
                                      std::shared_ptr<fake_log> log) {
  return sys.spawn([choose = std::move(choose), log = std::move(log)](
                     generation_service::pointer self) -> generation_service::behavior_type {
    return {
      [self, choose, log](generation_request& req) -> caf::result<caf::actor> {
        fake_script script = choose(req);
        {
          std::lock_guard g{log->mtx};
          log->requests.push_back(req);
          if (!script.refuse)
            ++log->active;
        }
        if (script.refuse)
          return caf::make_error(caf::sec::runtime_error, "scripted refusal");
        return self->spawn(fake_request, std::move(req), std::move(script), log);
      },
    };
  });
}

std::vector<std::int32_t> text_tokens(const recipe::codec& c, std::string_view text) {
  std::vector<std::int32_t> out;
  for (const auto id : c.tokenize(text, recipe::encode_mode::raw))
    out.push_back(static_cast<std::int32_t>(id));
  for (const auto id : c.stop_ids())
    out.push_back(static_cast<std::int32_t>(id));
  return out;
}

std::vector<std::int32_t> reasoning_tokens(const recipe::codec& c, std::string_view reasoning,
                                           std::string_view answer) {
  std::vector<std::int32_t> out;
  for (const auto id : c.tokenize(reasoning, recipe::encode_mode::raw))
    out.push_back(static_cast<std::int32_t>(id));
  out.push_back(static_cast<std::int32_t>(*c.tokenizer().token_to_id("</think>")));
  for (const auto id : text_tokens(c, answer))
    out.push_back(id);
  return out;
}

std::vector<std::int32_t> tool_call_tokens(const recipe::codec& c, std::string_view preface,
                                           std::string_view city) {
  std::string dsml(preface);
  dsml += "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
          "<｜DSML｜parameter name=\"city\" string=\"true\">";
  dsml += city;
  dsml += "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3"
          "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  std::vector<std::int32_t> out;
  for (const auto id : c.tokenize(dsml, recipe::encode_mode::trusted))
    out.push_back(static_cast<std::int32_t>(id));
  for (const auto id : c.stop_ids())
    out.push_back(static_cast<std::int32_t>(id));
  return out;
}

const recipe::codec& shipped_codec() {
  static const recipe::codec codec = [] {
    recipe::codec_options o;
    o.chat.default_thinking = false;
    auto loaded = recipe::codec::load(
      std::string(TROUPE_SOURCE_DIR) + "/recipe/data/deepseek-v4/tokenizer.json.gz", o);
    if (auto* e = std::get_if<recipe::load_error>(&loaded)) {
      std::cerr << "cannot load the tokenizer: " << e->message << "\n";
      std::abort();
    }
    return std::move(std::get<recipe::codec>(loaded));
  }();
  return codec;
}

} // namespace troupe::test
