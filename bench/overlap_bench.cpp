// bench_overlap: the decode engine on the CPU device with and without overlapped scheduling
// (issue 15 §3). The same actors `troupe serve` runs — a decode engine stepping a CPU device,
// as an instance's engine steps its leader rank's device, on the small preset (or --model
// DIR) — decode `--sequences` greedy requests of `--tokens` tokens each, interleaved: off,
// on, off, on, ... for `--rounds` rounds. Each run records the device's timeline (every step's
// start and end on the device's clock, through decode_engine_params::on_step) and reports:
//   - decode tokens per second over the run (first step's start to last step's end);
//   - the device's idle time before each step built while the batch had work (the gap the
//     scheduler leaves: a result travelling back, the next step built and travelling out),
//     mean / p50 / p99, and its share of the device's time;
// min and median over the rounds, with the load average. The floor is a gap of zero: a device
// that never waits. The first steps of one run of each mode are printed as a timeline. With
// `--spec fixedK|dspark` the engine speculates (the device proposes and verifies drafts; DSpark
// costs steps by the profile the device measures at start-up), both ways.
//
//   build/bench/bench_overlap [--model DIR] [--sequences 1,8] [--tokens 64] [--rounds 5]
//                             [--threads 2] [--context 32] [--spec off|fixedK|dspark]
#include "actors/engine/decode_engine.hpp"
#include "actors/type_ids.hpp"
#include "kernels/model_init.hpp"
#include "ports/cpu_device.hpp"
#include "runtime/world.hpp"

#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace troupe;

namespace {

struct step_record {
  runtime::time_point started;
  runtime::time_point finished;
  runtime::duration stalled;
};

struct run_figures {
  double tokens_per_s = 0;
  double gap_mean_us = 0;
  double gap_p50_us = 0;
  double gap_p99_us = 0;
  double idle_share = 0;
  std::size_t steps = 0;
  std::vector<step_record> timeline;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

/// Decodes `sequences` requests of `tokens` tokens on `device` through a fresh decode engine.
run_figures run_once(caf::actor_system& sys, const runtime::device_port& device, bool overlap,
                     const actors::speculation_setting& spec,
                     const std::shared_ptr<ports::step_profile>& profile,
                     std::uint32_t sequences, std::uint64_t tokens, std::uint64_t context,
                     std::uint64_t& next_id) {
  auto log = std::make_shared<std::vector<step_record>>();
  auto mutex = std::make_shared<std::mutex>();
  actors::decode_engine_params p;
  p.max_batch = sequences;
  p.overlap = overlap;
  p.spec = spec.spec;
  p.fixed_drafts = spec.fixed_drafts;
  if (spec.spec == actors::speculation::dspark)
    p.step_cost = [profile](const runtime::device_step& s) {
      return runtime::from_seconds(profile->seconds(s.tokens));
    };
  p.on_step = [log, mutex](runtime::time_point s, runtime::time_point f, runtime::duration st) {
    std::lock_guard lock{*mutex};
    log->push_back({s, f, st});
  };
  caf::scoped_actor self{sys};
  // (As an instance does: the engine steps the device directly.)
  auto engine = actors::spawn_decode_engine(self.ptr(), p, device, runtime::link_port{}, {});
  for (std::uint32_t i = 0; i < sequences; ++i) {
    actors::decode_job job;
    job.request = next_id++;
    job.context_tokens = context;
    job.output_tokens = tokens;
    for (std::uint64_t t = 0; t < context; ++t)
      job.context.push_back(static_cast<std::int32_t>(3 + (job.request * 131 + t * 17) % 200));
    job.next = 5;
    job.sampling.temperature = 0.0;
    self->send(engine, std::move(job));
  }
  for (std::uint32_t i = 0; i < sequences; ++i)
    self->receive([](actors::decode_done&) {},
                  [](caf::error& e) { std::fprintf(stderr, "job failed: %s\n", to_string(e).c_str()); });
  self->send_exit(engine, caf::exit_reason::user_shutdown);
  std::lock_guard lock{*mutex};
  run_figures out;
  out.timeline = *log;
  out.steps = log->size();
  if (log->empty())
    return out;
  std::vector<double> gaps;
  double busy = 0, idle = 0;
  for (std::size_t i = 0; i < log->size(); ++i) {
    const auto& r = (*log)[i];
    busy += runtime::to_seconds(r.finished - r.started);
    if (i > 0) {  // every step after the first had work waiting: its gap is the scheduler's
      const double g = runtime::to_seconds(r.stalled);
      gaps.push_back(g * 1e6);
      idle += g;
    }
  }
  const double wall = runtime::to_seconds(log->back().finished - log->front().started);
  out.tokens_per_s = static_cast<double>(sequences) * static_cast<double>(tokens) / wall;
  double sum = 0;
  for (double g : gaps)
    sum += g;
  out.gap_mean_us = gaps.empty() ? 0 : sum / static_cast<double>(gaps.size());
  out.gap_p50_us = percentile(gaps, 0.5);
  out.gap_p99_us = percentile(gaps, 0.99);
  out.idle_share = idle / (busy + idle);
  return out;
}

void print_timeline(const char* mode, const run_figures& f, std::size_t steps) {
  if (f.timeline.empty())
    return;
  const auto origin = f.timeline.front().started;
  std::printf("  timeline, overlap %s (ms from the first step's start):\n", mode);
  for (std::size_t i = 0; i < std::min(steps, f.timeline.size()); ++i) {
    const auto& r = f.timeline[i];
    std::printf("    step %2zu  %8.3f .. %8.3f  idle before %7.1f us\n", i + 1,
                runtime::to_seconds(r.started - origin) * 1e3,
                runtime::to_seconds(r.finished - origin) * 1e3,
                runtime::to_seconds(r.stalled) * 1e6);
  }
}

std::vector<std::uint32_t> parse_list(const std::string& text) {
  std::vector<std::uint32_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    out.push_back(static_cast<std::uint32_t>(std::stoul(item)));
  return out;
}

} // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  std::vector<std::uint32_t> batch_sizes{1, 8};
  std::uint64_t tokens = 64, context = 32;
  int rounds = 5;
  std::size_t threads = 2;
  std::string spec_name = "off";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      model_dir = argv[i + 1];
    else if (a == "--sequences")
      batch_sizes = parse_list(argv[i + 1]);
    else if (a == "--tokens")
      tokens = std::stoull(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::atoi(argv[i + 1]);
    else if (a == "--threads")
      threads = std::stoul(argv[i + 1]);
    else if (a == "--context")
      context = std::stoull(argv[i + 1]);
    else if (a == "--spec")
      spec_name = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const auto spec = actors::parse_speculation(spec_name);
  if (!spec) {
    std::fprintf(stderr, "--spec %s: expected off, fixed1 .. fixed5 or dspark\n",
                 spec_name.c_str());
    return 2;
  }
  const bool generated = model_dir.empty();
  const auto dir = generated ? std::filesystem::temp_directory_path()
                                 / ("troupe-bench-overlap-" + std::to_string(::getpid()))
                             : std::filesystem::path(model_dir);
  if (generated) {
    auto written = kernels::write_random_model(dir, "small", 1);
    if (!written) {
      std::fprintf(stderr, "%s\n", written.error().c_str());
      return 1;
    }
  }
  {
    runtime::world w{runtime::world_options{runtime::world_mode::real, 0, 2, false,
                                            actors::register_actor_types}};
    ports::cpu_device_params d;
    d.model_dir = dir;
    d.threads = threads;
    d.batch_invariant = true;
    d.engram_map = "identity";
    d.name = "decode";
    auto profile = std::make_shared<ports::step_profile>();
    if (spec->spec == actors::speculation::dspark)
      d.profile = profile;
    auto device = ports::spawn_cpu_device(w.system(), std::move(d));
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    std::printf("bench_overlap: %s, device threads %zu, context %llu, %llu tokens per request, "
                "speculation %s, %d rounds; load average %.2f\n",
                generated ? "small preset (seed 1)" : model_dir.c_str(), threads,
                static_cast<unsigned long long>(context), static_cast<unsigned long long>(tokens),
                spec_name.c_str(), rounds, load[0]);
    std::uint64_t next_id = 1;
    // A warm-up run (the model's first touches of its weights).
    (void) run_once(w.system(), device, false, *spec, profile, 1, 8, context, next_id);
    for (auto n : batch_sizes) {
      std::vector<run_figures> runs[2];
      for (int r = 0; r < rounds; ++r)
        for (int mode = 0; mode < 2; ++mode)
          runs[mode].push_back(
            run_once(w.system(), device, mode == 1, *spec, profile, n, tokens, context, next_id));
      std::printf("%u sequence%s:\n", n, n == 1 ? "" : "s");
      for (int mode = 0; mode < 2; ++mode) {
        std::vector<double> tps, mean, p50, p99, share;
        for (const auto& f : runs[mode]) {
          tps.push_back(f.tokens_per_s);
          mean.push_back(f.gap_mean_us);
          p50.push_back(f.gap_p50_us);
          p99.push_back(f.gap_p99_us);
          share.push_back(f.idle_share * 100);
        }
        std::printf("  overlap %-3s  tokens/s %7.1f / %7.1f   idle before a step (us): mean %7.1f "
                    "/ %7.1f, p50 %7.1f, p99 %7.1f   device idle %5.2f%% / %5.2f%%   (min|max / "
                    "median; %zu steps)\n",
                    mode ? "on" : "off", *std::max_element(tps.begin(), tps.end()), median(tps),
                    *std::min_element(mean.begin(), mean.end()), median(mean), median(p50),
                    median(p99), *std::min_element(share.begin(), share.end()), median(share),
                    runs[mode].front().steps);
      }
      print_timeline("off", runs[0].back(), 6);
      print_timeline("on", runs[1].back(), 6);
    }
    getloadavg(load, 3);
    std::printf("load average after: %.2f\n", load[0]);
  }
  if (generated)
    std::filesystem::remove_all(dir);
  return 0;
}
