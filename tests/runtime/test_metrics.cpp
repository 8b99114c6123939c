// The metrics registry: exact Prometheus text exposition, escaping, name validation.
#include "runtime/metrics.hpp"

#include <doctest/doctest.h>

#include <caf/message.hpp>

#include <cmath>
#include <limits>
#include <thread>

using namespace troupe::runtime;

namespace {

template <class T>
T* must(caf::expected<T*> x) {
  REQUIRE(x);
  return *x;
}

bool fails_with(const caf::error& err, metrics_errc code) {
  return err && err.category() == metrics_error_category
         && err.code() == static_cast<std::uint8_t>(code);
}

} // namespace

TEST_CASE("a counter is exposed with its help and type lines") {
  registry reg;
  auto* requests = must(reg.add_counter("troupe_requests_total", "Requests admitted."));
  must(requests->with({}))->inc();
  must(requests->with({}))->inc(2);
  CHECK(reg.expose()
        == "# HELP troupe_requests_total Requests admitted.\n"
           "# TYPE troupe_requests_total counter\n"
           "troupe_requests_total 3\n");
}

TEST_CASE("a family without labels is exposed at 0 before its first update") {
  registry reg;
  must(reg.add_gauge("troupe_queue_depth", "Requests waiting."));
  CHECK(reg.expose()
        == "# HELP troupe_queue_depth Requests waiting.\n"
           "# TYPE troupe_queue_depth gauge\n"
           "troupe_queue_depth 0\n");
}

TEST_CASE("a gauge goes up and down and prints fractions exactly") {
  registry reg;
  auto* g = must(must(reg.add_gauge("kv_fill_ratio", "Fraction of KV blocks in use."))->with({}));
  g->set(10);
  g->inc(0.5);
  g->dec(10.25);
  CHECK(g->value() == 0.25);
  CHECK(reg.expose()
        == "# HELP kv_fill_ratio Fraction of KV blocks in use.\n"
           "# TYPE kv_fill_ratio gauge\n"
           "kv_fill_ratio 0.25\n");
}

TEST_CASE("a counter refuses to go down") {
  counter c;
  CHECK_FALSE(c.inc(-1));
  CHECK_FALSE(c.inc(std::numeric_limits<double>::quiet_NaN()));
  CHECK(c.value() == 0);
}

TEST_CASE("families are ordered by name and children by label values") {
  registry reg;
  auto* tokens = must(reg.add_counter("troupe_tokens_total", "Tokens generated.",
                                      {"model", "traffic_class"}));
  must(tokens->with({"v4", "chatbot"}))->inc(7);
  must(tokens->with({"v41", "agent"}))->inc(1);
  must(tokens->with({"v4", "agent"}))->inc(1000000);
  auto* active = must(reg.add_gauge("troupe_active_requests", "Requests in flight.", {"pool"}));
  must(active->with({"prefill"}))->set(-2);
  must(reg.add_gauge("troupe_unused", "A labelled family without children.", {"x"}));
  CHECK(reg.expose()
        == "# HELP troupe_active_requests Requests in flight.\n"
           "# TYPE troupe_active_requests gauge\n"
           "troupe_active_requests{pool=\"prefill\"} -2\n"
           "# HELP troupe_tokens_total Tokens generated.\n"
           "# TYPE troupe_tokens_total counter\n"
           "troupe_tokens_total{model=\"v4\",traffic_class=\"agent\"} 1000000\n"
           "troupe_tokens_total{model=\"v4\",traffic_class=\"chatbot\"} 7\n"
           "troupe_tokens_total{model=\"v41\",traffic_class=\"agent\"} 1\n");
}

TEST_CASE("the same label values return the same child") {
  registry reg;
  auto* f = must(reg.add_counter("c", "h", {"a"}));
  CHECK(must(f->with({"x"})) == must(f->with({"x"})));
  CHECK(must(f->with({"x"})) != must(f->with({"y"})));
}

TEST_CASE("a histogram is exposed with cumulative buckets, +Inf, sum and count") {
  registry reg;
  auto* f = must(reg.add_histogram("troupe_step_seconds", "Duration of one decode step.",
                                   {0.005, 0.25, 0.5, 1}, {"pool"}));
  auto* h = must(f->with({"decode"}));
  h->observe(0.0009765625);  // 2^-10: the sum stays exact
  h->observe(0.25);
  h->observe(0.5);
  h->observe(3);
  CHECK(reg.expose()
        == "# HELP troupe_step_seconds Duration of one decode step.\n"
           "# TYPE troupe_step_seconds histogram\n"
           "troupe_step_seconds_bucket{pool=\"decode\",le=\"0.005\"} 1\n"
           "troupe_step_seconds_bucket{pool=\"decode\",le=\"0.25\"} 2\n"
           "troupe_step_seconds_bucket{pool=\"decode\",le=\"0.5\"} 3\n"
           "troupe_step_seconds_bucket{pool=\"decode\",le=\"1\"} 3\n"
           "troupe_step_seconds_bucket{pool=\"decode\",le=\"+Inf\"} 4\n"
           "troupe_step_seconds_sum{pool=\"decode\"} 3.7509765625\n"
           "troupe_step_seconds_count{pool=\"decode\"} 4\n");
}

TEST_CASE("a histogram without labels has only le on its buckets") {
  registry reg;
  auto* h = must(must(reg.add_histogram("batch_size", "", {1, 8, 64, INFINITY}))->with({}));
  h->observe(8);
  CHECK(reg.expose()
        == "# TYPE batch_size histogram\n"
           "batch_size_bucket{le=\"1\"} 0\n"
           "batch_size_bucket{le=\"8\"} 1\n"
           "batch_size_bucket{le=\"64\"} 1\n"
           "batch_size_bucket{le=\"+Inf\"} 1\n"
           "batch_size_sum 8\n"
           "batch_size_count 1\n");
}

TEST_CASE("an observation on a bucket bound lands in that bucket") {
  histogram h{{0.1, 0.2, 0.4}};
  h.observe(0.2);
  auto snap = h.read();
  CHECK(snap.cumulative == std::vector<std::uint64_t>{0, 1, 1, 1});
  h.observe(0.4);
  h.observe(0.1);
  CHECK(h.read().cumulative == std::vector<std::uint64_t>{1, 2, 3, 3});
}

TEST_CASE("label values escape backslash, double quote and newline; help escapes backslash "
          "and newline") {
  registry reg;
  auto* f = must(reg.add_counter("paths_total", "Paths \"seen\"\nby C:\\ drive.", {"path"}));
  must(f->with({"C:\\dir\\\"q\"\nend"}))->inc();
  CHECK(reg.expose()
        == "# HELP paths_total Paths \"seen\"\\nby C:\\\\ drive.\n"
           "# TYPE paths_total counter\n"
           "paths_total{path=\"C:\\\\dir\\\\\\\"q\\\"\\nend\"} 1\n");
}

TEST_CASE("special and large values are formatted as the exposition format expects") {
  CHECK(format_metric_value(0) == "0");
  CHECK(format_metric_value(-3) == "-3");
  CHECK(format_metric_value(1e15) == "1000000000000000");
  CHECK(format_metric_value(1e300) == "1e+300");
  CHECK(format_metric_value(0.1) == "0.1");
  CHECK(format_metric_value(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(format_metric_value(INFINITY) == "+Inf");
  CHECK(format_metric_value(-INFINITY) == "-Inf");
}

TEST_CASE("invalid metric names are rejected") {
  registry reg;
  for (auto name : {"", "1abc", "a-b", "a b", "é", "name{x}"})
    CHECK_MESSAGE(fails_with(reg.add_counter(name, "h").error(),
                             metrics_errc::invalid_metric_name),
                  name);
  CHECK(reg.add_counter("a:b_c1", "h"));
  CHECK(reg.add_counter(":x", "h"));
  CHECK(reg.add_counter("_y", "h"));
  auto err = reg.add_gauge("bad-name", "h").error();
  REQUIRE(err.context().match_elements<std::string>());
  CHECK(err.context().get_as<std::string>(0).find("bad-name") != std::string::npos);
}

TEST_CASE("invalid, reserved and duplicate label names are rejected") {
  registry reg;
  for (auto label : {"", "__name", "a:b", "0x", "a-b"})
    CHECK_MESSAGE(fails_with(reg.add_counter("c", "h", {label}).error(),
                             metrics_errc::invalid_label_name),
                  label);
  CHECK(fails_with(reg.add_histogram("h", "h", {1}, {"le"}).error(),
                   metrics_errc::invalid_label_name));
  CHECK(reg.add_counter("le_ok", "h", {"le", "_x"}));
  CHECK(fails_with(reg.add_counter("d", "h", {"a", "b", "a"}).error(),
                   metrics_errc::duplicate_label_name));
}

TEST_CASE("bucket bounds must be finite and strictly increasing") {
  registry reg;
  CHECK(fails_with(reg.add_histogram("a", "h", {1, 1}).error(), metrics_errc::invalid_buckets));
  CHECK(fails_with(reg.add_histogram("b", "h", {2, 1}).error(), metrics_errc::invalid_buckets));
  CHECK(fails_with(reg.add_histogram("c", "h", {NAN}).error(), metrics_errc::invalid_buckets));
  CHECK(fails_with(reg.add_histogram("d", "h", {-INFINITY, 1}).error(),
                   metrics_errc::invalid_buckets));
  CHECK(reg.add_histogram("e", "h", {}));
}

TEST_CASE("registering a name again returns the family, or an error when it differs") {
  registry reg;
  auto* f = must(reg.add_counter("c_total", "h", {"a"}));
  CHECK(must(reg.add_counter("c_total", "h", {"a"})) == f);
  CHECK(fails_with(reg.add_gauge("c_total", "h", {"a"}).error(),
                   metrics_errc::conflicting_registration));
  CHECK(fails_with(reg.add_counter("c_total", "other", {"a"}).error(),
                   metrics_errc::conflicting_registration));
  CHECK(fails_with(reg.add_counter("c_total", "h", {"b"}).error(),
                   metrics_errc::conflicting_registration));
}

TEST_CASE("label values of the wrong arity are rejected") {
  registry reg;
  auto* f = must(reg.add_counter("c_total", "h", {"a", "b"}));
  CHECK(fails_with(f->with({"x"}).error(), metrics_errc::label_arity));
  CHECK(fails_with(f->with({}).error(), metrics_errc::label_arity));
}

TEST_CASE("concurrent updates are all counted") {
  registry reg;
  auto* c = must(must(reg.add_counter("c_total", "h"))->with({}));
  auto* h = must(must(reg.add_histogram("h", "h", {0.5}))->with({}));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->inc();
        h->observe(i % 2);
        static_cast<void>(reg.expose().size());
      }
    });
  for (auto& t : threads)
    t.join();
  CHECK(c->value() == 40000);
  auto snap = h->read();
  CHECK(snap.count == 40000);
  CHECK(snap.cumulative == std::vector<std::uint64_t>{20000, 40000});
  CHECK(snap.sum == 20000);
}

TEST_CASE("a registry's samples mirrored into another sum over sources and survive restarts") {
  registry a, b, control;
  auto tokens = [](registry& r, const char* device) {
    return counter_child(&r, "tokens_total", "Tokens.", {"device"}, {device});
  };
  auto held = [](registry& r) { return gauge_child(&r, "held", "Held.", {}, {}); };
  must(must(a.add_histogram("latency", "", {1}))->with({}))->observe(0.5);
  tokens(a, "decode/0")->inc(10);
  tokens(b, "decode/1")->inc(4);
  held(a)->set(3);
  held(b)->set(2);
  // The control has a gauge of its own under a name a source also uses: left alone.
  gauge_child(&control, "own", "Own.", {}, {})->set(7);
  gauge_child(&a, "own", "Own.", {}, {})->set(100);

  auto samples = a.samples();
  REQUIRE(samples.size() == 3);  // held, own, tokens_total: the histogram is left out
  CHECK(samples[0].name == "held");
  CHECK(samples[0].gauge);
  CHECK(samples[2].labels == std::vector<std::vector<std::string>>{{"decode/0"}});
  CHECK(samples[2].values == std::vector<double>{10});

  metrics_mirror mirror{&control};
  mirror.apply("a", a.samples());
  mirror.apply("b", b.samples());
  tokens(a, "decode/0")->inc(5);
  mirror.apply("a", a.samples());  // grew by 5
  auto text = control.expose();
  CHECK(text.find("tokens_total{device=\"decode/0\"} 15\n") != std::string::npos);
  CHECK(text.find("tokens_total{device=\"decode/1\"} 4\n") != std::string::npos);
  CHECK(text.find("held 5\n") != std::string::npos);  // 3 + 2
  CHECK(text.find("own 7\n") != std::string::npos);
  CHECK(text.find("latency") == std::string::npos);

  // Source a restarts (a fresh registry, counters from 0) as source "a2": counters go on, its
  // old gauges no longer count.
  mirror.forget("a");
  registry a2;
  tokens(a2, "decode/0")->inc(2);
  held(a2)->set(1);
  mirror.apply("a2", a2.samples());
  text = control.expose();
  CHECK(text.find("tokens_total{device=\"decode/0\"} 17\n") != std::string::npos);
  CHECK(text.find("held 3\n") != std::string::npos);  // 2 + 1
}
