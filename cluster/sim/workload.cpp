// Synthetic workloads: prompts as segment lists, chained block keys, chat and agent sessions.
#include "cluster/sim/workload.hpp"

#include "actors/kv/block_writer.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <utility>

namespace troupe::cluster::sim {

namespace {

constexpr std::uint64_t chain_seed = 0x636861696e2d6b76ULL; // "chain-kv"

// A run of tokens with one identity (a system prompt, a user message, an answer, a tool
// result). Two prompts that share a segment id share its tokens.
struct segment {
  std::uint64_t id = 0;
  std::uint64_t tokens = 0;
};

// A prompt as the concatenation of its segments.
class prompt {
public:
  void append(std::uint64_t id, std::uint64_t tokens) {
    if (tokens == 0)
      return;
    segments_.push_back({id, tokens});
    tokens_ += tokens;
  }

  void clear() {
    segments_.clear();
    tokens_ = 0;
  }

  std::uint64_t tokens() const noexcept { return tokens_; }

  // The 128-token block keys: key_i = XXH3(key_{i-1}, pieces of block i), where a piece is
  // (segment id, first token, end token) of the part of a segment inside the block. So a
  // key depends on the block's content and everything before it, and a partial last block's
  // key differs from the full block it later becomes.
  void keys(std::vector<std::uint64_t>& out) const {
    out.clear();
    out.reserve(blocks_for(tokens_, block_tokens));
    std::vector<std::uint64_t> buf;
    std::uint64_t prev = 0;
    std::size_t seg = 0;
    std::uint64_t offset = 0; // tokens of segments_[seg] already placed in earlier blocks
    for (std::uint64_t start = 0; start < tokens_; start += block_tokens) {
      buf.assign(1, prev);
      std::uint64_t room = std::min<std::uint64_t>(block_tokens, tokens_ - start);
      while (room > 0) {
        auto take = std::min(room, segments_[seg].tokens - offset);
        buf.insert(buf.end(), {segments_[seg].id, offset, offset + take});
        offset += take;
        room -= take;
        if (offset == segments_[seg].tokens) {
          ++seg;
          offset = 0;
        }
      }
      prev = XXH3_64bits_withSeed(buf.data(), buf.size() * sizeof(std::uint64_t), chain_seed);
      out.push_back(prev);
    }
  }

private:
  std::vector<segment> segments_;
  std::uint64_t tokens_ = 0;
};

std::uint64_t draw(runtime::rng& r, const length_distribution& d) {
  // Box-Muller; 1 - uniform() lies in (0, 1], so the logarithm is finite.
  double u1 = 1.0 - r.uniform();
  double u2 = r.uniform();
  double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  double v = std::round(d.median * std::exp(d.sigma * z));
  if (!(v >= static_cast<double>(d.min)))
    return d.min;
  if (v >= static_cast<double>(d.max))
    return d.max;
  return static_cast<std::uint64_t>(v);
}

// Zipf choice among n items: item k has weight 1 / (k + 1)^skew.
class zipf {
public:
  zipf(std::uint32_t n, double skew) {
    double sum = 0;
    for (std::uint32_t k = 0; k < n; ++k) {
      sum += 1.0 / std::pow(k + 1.0, skew);
      cumulative_.push_back(sum);
    }
  }

  std::uint32_t operator()(runtime::rng& r) const {
    double x = r.uniform() * cumulative_.back();
    auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), x);
    return static_cast<std::uint32_t>(
      std::min<std::ptrdiff_t>(it - cumulative_.begin(),
                               static_cast<std::ptrdiff_t>(cumulative_.size()) - 1));
  }

private:
  std::vector<double> cumulative_;
};

// The number of requests in a session: 1 + a geometric count with the given mean (≥ 1).
std::uint64_t session_length(runtime::rng& r, double mean) {
  double carry_on = (mean - 1.0) / mean;
  std::uint64_t n = 1;
  while (r.chance(carry_on))
    ++n;
  return n;
}

runtime::duration seconds(double s) {
  return runtime::from_seconds(s);
}

std::string check_length(const char* name, const length_distribution& d) {
  if (!(d.median > 0) || !std::isfinite(d.median) || !(d.sigma >= 0) || !std::isfinite(d.sigma)
      || d.min < 1 || d.min > d.max)
    return std::string{name}
           + ": needs median > 0, sigma ≥ 0 and 1 ≤ min ≤ max (finite numbers)";
  return {};
}

std::string check_common(double rate, runtime::duration duration, std::uint32_t prompts,
                         double skew, double decode_speed) {
  if (!(rate > 0) || !std::isfinite(rate))
    return "rate must be a positive number of requests per second";
  if (duration <= runtime::duration::zero())
    return "duration must be positive";
  if (prompts == 0)
    return "system_prompts must be at least 1";
  if (!(skew >= 0) || !std::isfinite(skew))
    return "system_prompt_skew must be ≥ 0";
  if (!(decode_speed > 0) || !std::isfinite(decode_speed))
    return "decode_tokens_per_second must be positive";
  return {};
}

std::string first_error(std::initializer_list<std::string> errors) {
  for (const auto& e : errors)
    if (!e.empty())
      return e;
  return {};
}

bool probability(double p) {
  return p >= 0 && p <= 1;
}

std::string check(const chat_params& p) {
  auto e = first_error(
    {check_common(p.rate, p.duration, p.system_prompts, p.system_prompt_skew,
                  p.decode_tokens_per_second),
     check_length("system_prompt_tokens", p.system_prompt_tokens),
     check_length("one_off_tokens", p.one_off_tokens),
     check_length("user_tokens", p.user_tokens),
     check_length("output_tokens", p.output_tokens)});
  if (!e.empty())
    return e;
  if (!probability(p.one_off_share) || !probability(p.one_off_system_prompt)
      || !probability(p.image_chance))
    return "one_off_share, one_off_system_prompt and image_chance must lie in [0, 1]";
  if (!(p.mean_turns >= 1) || !std::isfinite(p.mean_turns))
    return "mean_turns must be at least 1";
  if (p.think_time < runtime::duration::zero())
    return "think_time must not be negative";
  if (p.image_chance > 0 && (p.max_images == 0 || p.image_tokens == 0))
    return "images need max_images ≥ 1 and image_tokens ≥ 1";
  if (p.max_context == 0)
    return "max_context must be positive";
  return {};
}

std::string check(const agent_params& p) {
  auto e = first_error(
    {check_common(p.rate, p.duration, p.system_prompts, p.system_prompt_skew,
                  p.decode_tokens_per_second),
     check_length("system_prompt_tokens", p.system_prompt_tokens),
     check_length("task_tokens", p.task_tokens), check_length("call_tokens", p.call_tokens),
     check_length("result_tokens", p.result_tokens),
     check_length("summary_tokens", p.summary_tokens)});
  if (!e.empty())
    return e;
  if (!(p.mean_steps >= 1) || !std::isfinite(p.mean_steps))
    return "mean_steps must be at least 1";
  if (p.tool_time < runtime::duration::zero())
    return "tool_time must not be negative";
  if (p.max_context == 0)
    return "max_context must be positive";
  return {};
}

// A request drawn by a session, before sessions are renumbered. `session` is provisional
// (unique within one generator call, ordered by session start).
struct pending {
  request_record record;
  std::uint64_t turn = 0;
  /// The prompt begins with the session's previous request's prompt and output.
  bool continues = false;
};

// Runs `session(index, start, rng, out)` for Poisson session starts from -warm_up to the end
// of the run; keeps the requests arriving in [0, duration).
template <class Session>
std::vector<pending> run_sessions(const runtime::rng& random, double session_rate,
                                  runtime::duration warm_up, runtime::duration duration,
                                  std::uint64_t session_base, Session&& session) {
  std::vector<pending> out;
  auto arrivals = random.split("session-starts");
  auto start = -warm_up;
  for (std::uint64_t i = 0;; ++i) {
    start += seconds(arrivals.exponential(session_rate));
    if (start >= duration)
      break;
    auto r = random.split("session", i);
    session(session_base + i, start, r, out);
  }
  std::erase_if(out, [&](const pending& p) {
    return p.record.arrival < runtime::duration::zero() || p.record.arrival >= duration;
  });
  return out;
}

// Sorts by (arrival, provisional session, turn) and numbers sessions by first arrival. A
// request that continues its session's previous one names the blocks that one's decode filled
// as the decode instance keys them: the simulation numbers requests 1, 2, ... in this order, so
// the previous request is `decode_content_key(its position + 1, i)` for sequence block i, from
// the block its prompt's end falls in up to its last full block (its last partial block is
// not persisted); the blocks before are the previous prompt's, as renamed in turn. So the
// next turn hits what decode persisted, as a real conversation's next turn hits the previous
// answer's KV.
std::vector<request_record> finish(std::vector<pending> ps) {
  std::sort(ps.begin(), ps.end(), [](const pending& a, const pending& b) {
    if (a.record.arrival != b.record.arrival)
      return a.record.arrival < b.record.arrival;
    if (a.record.session != b.record.session)
      return a.record.session < b.record.session;
    return a.turn < b.turn;
  });
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::size_t> at; // (session, turn) -> index
  for (std::size_t k = 0; k < ps.size(); ++k)
    at.emplace(std::pair{ps[k].record.session, ps[k].turn}, k);
  for (auto& p : ps) {
    if (!p.continues || p.turn == 0)
      continue;
    auto prev = at.find({p.record.session, p.turn - 1});
    if (prev == at.end())
      continue; // it arrived before the run began
    const auto& before = ps[prev->second].record; // earlier in this order: renamed already
    const auto first = before.input_tokens / block_tokens;
    std::copy_n(before.blocks.begin(),
                std::min<std::uint64_t>({first, before.blocks.size(), p.record.blocks.size()}),
                p.record.blocks.begin());
    const auto end = std::min<std::uint64_t>((before.input_tokens + before.output_tokens)
                                               / block_tokens,
                                             p.record.blocks.size());
    for (auto i = first; i < end; ++i)
      p.record.blocks[i] = actors::decode_content_key(prev->second + 1, i);
  }
  std::map<std::uint64_t, std::uint64_t> numbers;
  std::vector<request_record> out;
  out.reserve(ps.size());
  for (auto& p : ps) {
    auto [it, fresh] = numbers.try_emplace(p.record.session, numbers.size());
    p.record.session = it->second;
    out.push_back(std::move(p.record));
  }
  return out;
}

// Warm-up before 0: long enough that sessions still running at 0 are in steady state (a
// session lasting 20 times the mean span is vanishingly rare), at most a day.
runtime::duration warm_up_for(double mean_requests, double mean_gap_seconds) {
  return seconds(std::min(86'400.0, 20.0 * mean_requests * mean_gap_seconds + 60.0));
}

std::vector<pending> chat_requests(const chat_params& p, const runtime::rng& random,
                                   std::uint64_t session_base) {
  double multi = 1.0 - p.one_off_share;
  double mean_requests = p.one_off_share + multi * p.mean_turns;
  double mean_gap = runtime::to_seconds(p.think_time)
                    + p.output_tokens.median / p.decode_tokens_per_second;
  zipf pick_system{p.system_prompts, p.system_prompt_skew};
  std::vector<std::uint64_t> system_ids;
  std::vector<std::uint64_t> system_lengths;
  for (std::uint32_t k = 0; k < p.system_prompts; ++k) {
    auto r = random.split("system-prompt", k);
    system_ids.push_back(r.key());
    system_lengths.push_back(draw(r, p.system_prompt_tokens));
  }
  auto session = [&](std::uint64_t id, runtime::duration start, runtime::rng& r,
                     std::vector<pending>& out) {
    auto emit = [&](runtime::duration at, std::uint64_t turn, const prompt& pr,
                    std::uint64_t output, std::uint32_t images, bool continues) {
      pending q;
      q.continues = continues;
      q.record.arrival = at;
      q.record.input_tokens = pr.tokens();
      q.record.output_tokens = output;
      q.record.traffic = traffic_class::chatbot;
      q.record.session = id;
      q.record.images = images;
      q.turn = turn;
      if (at >= runtime::duration::zero()) // keys only for requests that are kept
        pr.keys(q.record.blocks);
      out.push_back(std::move(q));
    };
    prompt pr;
    if (r.chance(p.one_off_share)) {
      if (r.chance(p.one_off_system_prompt)) {
        auto k = pick_system(r);
        pr.append(system_ids[k], system_lengths[k]);
      }
      pr.append(r(), draw(r, p.one_off_tokens));
      emit(start, 0, pr, draw(r, p.output_tokens), 0, false);
      return;
    }
    auto k = pick_system(r);
    auto turns = session_length(r, p.mean_turns);
    auto at = start;
    for (std::uint64_t t = 0; t < turns && at < p.duration; ++t) {
      std::uint32_t images = 0;
      if (p.image_chance > 0 && r.chance(p.image_chance))
        images = static_cast<std::uint32_t>(r.between(1, p.max_images));
      auto user = draw(r, p.user_tokens);
      if (pr.tokens() + images * p.image_tokens + user > p.max_context)
        pr.clear();
      const bool continues = pr.tokens() > 0;
      if (pr.tokens() == 0)
        pr.append(system_ids[k], system_lengths[k]);
      for (std::uint32_t i = 0; i < images; ++i)
        pr.append(r(), p.image_tokens);
      pr.append(r(), user);
      auto output = draw(r, p.output_tokens);
      emit(at, t, pr, output, images, continues);
      pr.append(r(), output);
      at += seconds(static_cast<double>(output) / p.decode_tokens_per_second
                    + r.exponential(1.0 / std::max(1e-9, runtime::to_seconds(p.think_time))));
    }
  };
  return run_sessions(random, p.rate / mean_requests, warm_up_for(mean_requests, mean_gap),
                      p.duration, session_base, session);
}

std::vector<pending> agent_requests(const agent_params& p, const runtime::rng& random,
                                    std::uint64_t session_base) {
  double mean_gap = runtime::to_seconds(p.tool_time)
                    + p.call_tokens.median / p.decode_tokens_per_second;
  zipf pick_system{p.system_prompts, p.system_prompt_skew};
  std::vector<std::uint64_t> system_ids;
  std::vector<std::uint64_t> system_lengths;
  for (std::uint32_t k = 0; k < p.system_prompts; ++k) {
    auto r = random.split("system-prompt", k);
    system_ids.push_back(r.key());
    system_lengths.push_back(draw(r, p.system_prompt_tokens));
  }
  auto session = [&](std::uint64_t id, runtime::duration start, runtime::rng& r,
                     std::vector<pending>& out) {
    auto k = pick_system(r);
    auto task_id = r();
    auto task = draw(r, p.task_tokens);
    auto steps = session_length(r, p.mean_steps);
    prompt pr;
    auto restart = [&](std::uint64_t summary) {
      pr.clear();
      pr.append(system_ids[k], system_lengths[k]);
      pr.append(task_id, task);
      if (summary > 0)
        pr.append(r(), summary);
    };
    restart(0);
    bool continues = false;
    auto at = start;
    for (std::uint64_t s = 0; s < steps && at < p.duration; ++s) {
      auto call = draw(r, p.call_tokens);
      pending q;
      q.continues = continues;
      q.record.arrival = at;
      q.record.input_tokens = pr.tokens();
      q.record.output_tokens = call;
      q.record.traffic = traffic_class::agent;
      q.record.session = id;
      q.turn = s;
      if (at >= runtime::duration::zero())
        pr.keys(q.record.blocks);
      out.push_back(std::move(q));
      auto result = draw(r, p.result_tokens);
      continues = pr.tokens() + call + result <= p.max_context;
      if (!continues) {
        restart(draw(r, p.summary_tokens));
      } else {
        pr.append(r(), call);
        pr.append(r(), result);
      }
      at += seconds(static_cast<double>(call) / p.decode_tokens_per_second
                    + r.exponential(1.0 / std::max(1e-9, runtime::to_seconds(p.tool_time))));
    }
  };
  return run_sessions(random, p.rate / p.mean_steps, warm_up_for(p.mean_steps, mean_gap),
                      p.duration, session_base, session);
}

// Provisional session ids of agent sessions in a mixed workload start here.
constexpr std::uint64_t agent_session_base = std::uint64_t{1} << 62;

} // namespace

workload generate_chat(const chat_params& params, const runtime::rng& random) {
  workload w;
  w.error = check(params);
  if (w.ok())
    w.records = finish(chat_requests(params, random, 0));
  return w;
}

workload generate_agent(const agent_params& params, const runtime::rng& random) {
  workload w;
  w.error = check(params);
  if (w.ok())
    w.records = finish(agent_requests(params, random, 0));
  return w;
}

workload generate_mixed(const mixed_params& params, const runtime::rng& random) {
  workload w;
  if (!(params.agent_share >= 0 && params.agent_share <= 1)) {
    w.error = "agent_share must lie in [0, 1]";
    return w;
  }
  auto chat = params.chat;
  auto agent = params.agent;
  chat.rate = params.rate * (1.0 - params.agent_share);
  agent.rate = params.rate * params.agent_share;
  chat.duration = agent.duration = params.duration;
  // A share of 0 or 1 leaves one side without traffic; check it with a placeholder rate.
  if (params.agent_share == 1.0)
    chat.rate = 1.0;
  if (params.agent_share == 0.0)
    agent.rate = 1.0;
  if (auto e = check(chat); !e.empty()) {
    w.error = "chat: " + e;
    return w;
  }
  if (auto e = check(agent); !e.empty()) {
    w.error = "agent: " + e;
    return w;
  }
  std::vector<pending> all;
  if (params.agent_share < 1.0)
    all = chat_requests(chat, random.split("chat"), 0);
  if (params.agent_share > 0.0) {
    auto more = agent_requests(agent, random.split("agent"), agent_session_base);
    all.insert(all.end(), std::make_move_iterator(more.begin()),
               std::make_move_iterator(more.end()));
  }
  w.records = finish(std::move(all));
  return w;
}

} // namespace troupe::cluster::sim
