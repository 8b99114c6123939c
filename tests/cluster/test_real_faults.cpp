// Tests of cluster/launch/real_faults: a simulator fault plan turned into actions on the
// processes of a launched cluster.
#include "cluster/launch/real_faults.hpp"

#include "runtime/random.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::cluster;

namespace {

const std::filesystem::path source_dir{TROUPE_SOURCE_DIR};

const topology& local3() {
  static const topology t = [] {
    auto r = load_topology(source_dir / "examples" / "topologies" / "local-cpu-3.toml");
    REQUIRE(r.ok());
    return *r.value;
  }();
  return t;
}

/// `plan_text` on local-cpu-3, a cluster with a store process or (`store`false) without a
/// block store, on this host or (`hosts`) on the hosts of a hosts file.
real_fault_plan translate(const std::string& plan_text, bool store = true, bool hosts = false) {
  auto plan = sim::parse_fault_plan(plan_text, "plan.toml", local3());
  REQUIRE_MESSAGE(plan.ok(), (plan.errors.empty() ? "" : plan.errors.front().to_string()));
  auto timeline = sim::expand(*plan.value, runtime::rng{1}.split("faults"), 1h);
  return plan_real_faults(timeline, local3(), store, hosts);
}

runtime::duration secs(double s) {
  return std::chrono::duration_cast<runtime::duration>(std::chrono::duration<double>(s));
}

} // namespace

TEST_CASE("a gpu failure kills its instance's process and holds it down for the duration") {
  auto r = translate("[[fault]]\nat = \"5s\"\nkind = \"fail\"\ngpu = \"decode/1/0\"\n"
                     "duration = \"20s\"\n");
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].kind == process_action_kind::kill);
  CHECK(r.actions[0].process == "decode/1");
  CHECK(r.actions[0].at == secs(5));
  CHECK(r.actions[1].kind == process_action_kind::release);
  CHECK(r.actions[1].at == secs(25));
  CHECK(r.not_executed.empty());
}

TEST_CASE("a gpu failure without a duration lasts until its recover") {
  auto r = translate("[[fault]]\nat = \"5s\"\nkind = \"fail\"\ngpu = \"decode/0/0\"\n"
                     "[[fault]]\nat = \"40s\"\nkind = \"recover\"\ngpu = \"decode/0/0\"\n");
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].kind == process_action_kind::kill);
  CHECK(r.actions[1].kind == process_action_kind::release);
  CHECK(r.actions[1].at == secs(40));
  CHECK(r.actions[1].fault == 1);
}

TEST_CASE("a gpu of an instance of several fails and recovers as that gpu: its instance re-forms "
          "without it") {
  auto r = load_topology(source_dir / "examples" / "topologies" / "local-cpu-ep.toml");
  REQUIRE(r.ok());
  auto plan = sim::parse_fault_plan(
    "[[fault]]\nat = \"5s\"\nkind = \"fail\"\ngpu = \"decode/0/3\"\nduration = \"20s\"\n"
    "[[fault]]\nat = \"6s\"\nkind = \"fail\"\ngpu = \"prefill/0/1\"\n"
    "[[fault]]\nat = \"9s\"\nkind = \"recover\"\ngpu = \"prefill/0/1\"\n",
    "plan.toml", *r.value);
  REQUIRE(plan.ok());
  auto out = plan_real_faults(sim::expand(*plan.value, runtime::rng{1}.split("faults"), 1h),
                              *r.value, true, false);
  REQUIRE(out.actions.size() == 4);
  auto check = [&](std::size_t i, double at, process_action_kind kind, const char* process,
                   std::uint32_t gpu, std::uint32_t configured) {
    CAPTURE(i);
    CHECK(out.actions[i].at == secs(at));
    CHECK(out.actions[i].kind == kind);
    CHECK(out.actions[i].process == process);
    CHECK(out.actions[i].gpu == gpu);
    CHECK(out.actions[i].configured == configured);
  };
  check(0, 5, process_action_kind::fail_gpu, "decode/0", 3, 4);
  check(1, 6, process_action_kind::fail_gpu, "prefill/0", 1, 2);
  check(2, 9, process_action_kind::heal_gpu, "prefill/0", 1, 2);
  check(3, 25, process_action_kind::heal_gpu, "decode/0", 3, 4);
}

TEST_CASE("an instance failure is restarted at once, as its supervisor would") {
  auto r = translate("[[fault]]\nat = \"3s\"\nkind = \"fail\"\ninstance = \"prefill/0\"\n");
  REQUIRE(r.actions.size() == 2);
  CHECK(r.actions[0].kind == process_action_kind::kill);
  CHECK(r.actions[1].kind == process_action_kind::release);
  CHECK(r.actions[1].at == r.actions[0].at);
  CHECK(r.actions[0].process == "prefill/0");
}

TEST_CASE("a pool target covers every instance process of the pool") {
  auto r = translate("[[fault]]\nat = \"1s\"\nkind = \"partition\"\npool = \"decode\"\n"
                     "duration = \"2s\"\n");
  REQUIRE(r.actions.size() == 4);
  CHECK(r.actions[0].kind == process_action_kind::stop);
  CHECK(r.actions[1].kind == process_action_kind::stop);
  CHECK(r.actions[0].process == "decode/0");
  CHECK(r.actions[1].process == "decode/1");
  CHECK(r.actions[2].kind == process_action_kind::resume);
  CHECK(r.actions[2].at == secs(3));
}

TEST_CASE("a link partition on hosts cuts each pair of its ends' processes for its duration") {
  const std::string plan = "[[fault]]\nat = \"4s\"\nkind = \"partition\"\n"
                           "link = [\"prefill/0\", \"decode\"]\nduration = \"3s\"\n";
  auto r = translate(plan, true, true);
  CHECK(r.not_executed.empty());
  REQUIRE(r.actions.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(r.actions[i].kind == process_action_kind::cut);
    CHECK(r.actions[i].at == secs(4));
    CHECK(r.actions[i].length == secs(3));
    CHECK(r.actions[i].process == "prefill/0");
    CHECK(r.actions[i].peer == "decode/" + std::to_string(i));
  }
  // On one host the processes share its loopback: not executed, and said why.
  auto local = translate(plan);
  CHECK(local.actions.empty());
  REQUIRE(local.not_executed.size() == 1);
  CHECK(local.not_executed[0].find("link prefill/0 <-> decode") != std::string::npos);
  CHECK(local.not_executed[0].find("--hosts") != std::string::npos);
}

TEST_CASE("a link slowdown on hosts slows each pair of its ends' processes by its factor") {
  const std::string plan = "[[fault]]\nat = \"6s\"\nkind = \"slow\"\n"
                           "link = [\"decode/1\", \"prefill\"]\nfactor = 50\n"
                           "duration = \"4s\"\n";
  auto r = translate(plan, true, true);
  CHECK(r.not_executed.empty());
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].kind == process_action_kind::slow);
  CHECK(r.actions[0].at == secs(6));
  CHECK(r.actions[0].length == secs(4));
  CHECK(r.actions[0].factor == 50);
  CHECK(r.actions[0].process == "decode/1");
  CHECK(r.actions[0].peer == "prefill/0");
  CHECK(to_string(r.actions[0].kind) == "slow");
  // No process is stopped for it (that is an instance's slowdown).
  auto local = translate(plan);
  CHECK(local.actions.empty());
  REQUIRE(local.not_executed.size() == 1);
  CHECK(local.not_executed[0].find("a link slowdown needs hosts of their own (--hosts)")
        != std::string::npos);
}

TEST_CASE("a slowdown is a stop / resume duty cycle that stops 1 - 1/factor of the time") {
  auto r = translate("[[fault]]\nat = \"10s\"\nkind = \"slow\"\ninstance = \"decode/0\"\n"
                     "factor = 4\nduration = \"1s\"\n");
  // Five 200 ms periods, each stopped for 150 ms.
  REQUIRE(r.actions.size() == 10);
  runtime::duration stopped{0};
  for (std::size_t i = 0; i < r.actions.size(); i += 2) {
    CHECK(r.actions[i].kind == process_action_kind::stop);
    CHECK(r.actions[i + 1].kind == process_action_kind::resume);
    stopped += r.actions[i + 1].at - r.actions[i].at;
  }
  CHECK(runtime::to_seconds(stopped) == doctest::Approx(0.75).epsilon(1e-6));
  CHECK(r.actions.back().at <= secs(11));
}

TEST_CASE("a decode drain is a SIGTERM to its process") {
  auto r = translate("[[fault]]\nat = \"7s\"\nkind = \"drain\"\ninstance = \"decode/1\"\n");
  REQUIRE(r.actions.size() == 1);
  CHECK(r.actions[0].kind == process_action_kind::term);
  CHECK(r.actions[0].process == "decode/1");
}

TEST_CASE("faults without a real counterpart are listed as not executed, with the reason") {
  auto r = translate("[[fault]]\nat = \"1s\"\nkind = \"surge\"\nfactor = 2\nduration = \"5s\"\n"
                     "[[fault]]\nat = \"2s\"\nkind = \"store_fail\"\nshard = 0\n",
                     false);
  CHECK(r.actions.empty());
  REQUIRE(r.not_executed.size() == 2);
  CHECK(r.not_executed[0].find("surge") != std::string::npos);
  CHECK(r.not_executed[1].find("store_fail") != std::string::npos);
  CHECK(r.not_executed[1].find("no block store") != std::string::npos);
}

TEST_CASE("a store shard's failure kills the store process, down for its duration or until recovered") {
  auto r = translate("[[fault]]\nat = \"2s\"\nkind = \"store_fail\"\nshard = 3\n"
                     "duration = \"4s\"\n"
                     "[[fault]]\nat = \"10s\"\nkind = \"store_fail\"\nshard = 0\n"
                     "[[fault]]\nat = \"15s\"\nkind = \"recover\"\nshard = 0\n");
  CHECK(r.not_executed.empty());
  REQUIRE(r.actions.size() == 4);
  for (const auto& a : r.actions)
    CHECK(a.process == "store");
  CHECK(r.actions[0].kind == process_action_kind::kill);
  CHECK(r.actions[0].at == secs(2));
  CHECK(r.actions[1].kind == process_action_kind::release);
  CHECK(r.actions[1].at == secs(6));
  CHECK(r.actions[2].kind == process_action_kind::kill);
  CHECK(r.actions[2].at == secs(10));
  CHECK(r.actions[3].kind == process_action_kind::release);
  CHECK(r.actions[3].at == secs(15));
}

TEST_CASE("in a store of several shards, a shard's failure kills that shard's process only") {
  auto topo = local3();
  topo.storage.shards = 2;
  auto plan = sim::parse_fault_plan("[[fault]]\nat = \"2s\"\nkind = \"store_fail\"\nshard = 1\n"
                                    "duration = \"4s\"\n"
                                    "[[fault]]\nat = \"3s\"\nkind = \"store_slow\"\nshard = 0\n"
                                    "factor = 2\nduration = \"200ms\"\n",
                                    "plan.toml", topo);
  REQUIRE(plan.ok());
  auto timeline = sim::expand(*plan.value, runtime::rng{1}.split("faults"), 1h);
  auto r = plan_real_faults(timeline, topo, true);
  REQUIRE(r.actions.size() == 4);
  CHECK(r.actions[0].process == "store/1");
  CHECK(r.actions[0].kind == process_action_kind::kill);
  CHECK(r.actions[1].process == "store/0");
  CHECK(r.actions[1].kind == process_action_kind::stop);
  CHECK(r.actions[2].process == "store/0");
  CHECK(r.actions[3].process == "store/1");
  CHECK(r.actions[3].kind == process_action_kind::release);
  CHECK(store_process_name(0, 1) == "store");
  CHECK(store_process_name(3, 4) == "store/3");
}

TEST_CASE("a slow store shard stops and resumes the store process, as a slow instance") {
  auto r = translate("[[fault]]\nat = \"1s\"\nkind = \"store_slow\"\nshard = 1\nfactor = 4\n"
                     "duration = \"1s\"\n");
  CHECK(r.not_executed.empty());
  REQUIRE(r.actions.size() == 10);  // five 200 ms periods
  runtime::duration stopped{0};
  for (std::size_t i = 0; i < r.actions.size(); i += 2) {
    CHECK(r.actions[i].process == "store");
    CHECK(r.actions[i].kind == process_action_kind::stop);
    CHECK(r.actions[i + 1].kind == process_action_kind::resume);
    stopped += r.actions[i + 1].at - r.actions[i].at;
  }
  CHECK(runtime::to_seconds(stopped) == doctest::Approx(0.75).epsilon(1e-6));
}

TEST_CASE("actions come out in time order across faults") {
  auto r = translate("[[fault]]\nat = \"9s\"\nkind = \"drain\"\ninstance = \"decode/0\"\n"
                     "[[fault]]\nat = \"2s\"\nkind = \"fail\"\ngpu = \"prefill/0/0\"\n"
                     "duration = \"3s\"\n");
  REQUIRE(r.actions.size() == 3);
  CHECK(r.actions[0].at == secs(2));
  CHECK(r.actions[1].at == secs(5));
  CHECK(r.actions[2].at == secs(9));
}
