// What `troupe serve` checks before it starts (cluster/serve_setup.hpp): the topology's device
// and its engine (cluster/device_engines.hpp), and the options that depend on it.
#include "cluster/device_engines.hpp"
#include "cluster/real_graph.hpp"
#include "cluster/serve_setup.hpp"
#include "kernels/model_init.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

using namespace troupe;
using namespace troupe::cluster;
namespace fs = std::filesystem;

namespace {

// A scratch directory with the small preset's config.json (all load_serve_inputs reads of a
// model) and topology files.
struct setup_dir {
  fs::path root =
    fs::temp_directory_path() / ("troupe-test-serve-setup-" + std::to_string(::getpid()));
  setup_dir() {
    fs::create_directories(root / "model");
    auto config = kernels::preset_config_json("small");
    REQUIRE(config);
    std::ofstream(root / "model" / "config.json") << *config;
  }
  ~setup_dir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }

  // A topology on `hardware` (and `device`, when given) whose pools have `gpus` GPUs per
  // instance.
  std::string topology(const std::string& hardware, const std::string& device = {},
                       int gpus = 1) const {
    std::ostringstream t;
    t << "[cluster]\nname = \"t\"\nmodel = \"deepseek-v4.1-flash\"\nhardware = \"" << hardware
      << "\"\n";
    if (!device.empty())
      t << "device = \"" << device << "\"\n";
    t << "[storage]\nbackend = \"sim\"\ncapacity = \"1GiB\"\n";
    for (const char* role : {"prefill", "decode"})
      t << "[[pool]]\nname = \"" << role << "\"\nrole = \"" << role
        << "\"\ninstances = 1\ngpus_per_instance = " << gpus << "\n";
    const auto path = root / (hardware + "-" + device + "-" + std::to_string(gpus) + ".toml");
    std::ofstream(path) << t.str();
    return path.string();
  }

  serve_options options(const std::string& topology) const {
    serve_options o;
    o.topology = topology;
    o.model = (root / "model").string();
    o.engram_map = "identity";
    o.tokenizer = TROUPE_SOURCE_DIR "/recipe/data/deepseek-v4/tokenizer.json.gz";
    return o;
  }
};

// load_serve_inputs' error output, empty when it succeeded.
std::string refusal(const serve_options& o, bool devices_here = true) {
  std::ostringstream err;
  auto in = load_serve_inputs(o, "troupe serve", err, devices_here);
  CHECK(in.has_value() == err.str().empty());
  return err.str();
}

bool says(const std::string& err, const std::string& what) {
  INFO(err);
  return err.find(what) != std::string::npos;
}

// Registers a stand-in "cuda" engine for one test.
struct fake_cuda {
  std::string unusable;
  std::vector<device_limits> opened;  // what each device's opener was asked for
  explicit fake_cuda(std::uint64_t default_context) {
    device_engine e;
    e.unusable = [this] { return unusable; };
    e.opener = [this](const device_limits& limits) {
      opened.push_back(limits);
      return kernels::backend_opener{};
    };
    e.default_context = default_context;
    add_device_engine("cuda", std::move(e));
  }
  ~fake_cuda() { remove_device_engine("cuda"); }
  // Registers it again, rolling back and drafting or not.
  void speculative(bool yes) {
    auto e = *find_device_engine("cuda");
    e.speculative = yes;
    add_device_engine("cuda", std::move(e));
  }
};

} // namespace

TEST_CASE("a topology's device: cpu for hardware cpu, cuda for NVIDIA parts, none for Ascend") {
  setup_dir d;
  auto device_of = [](const std::string& path) {
    auto t = load_topology(path);
    REQUIRE(t.value);
    return t.value->cluster.device;
  };
  CHECK(device_of(d.topology("cpu")) == "cpu");
  CHECK(device_of(d.topology("H200")) == "cuda");
  CHECK(device_of(d.topology("B200")) == "cuda");
  CHECK(device_of(d.topology("H800", "cpu")) == "cpu");
  CHECK(device_of(d.topology("Ascend950")).empty());
  auto bad = load_topology(d.topology("cpu", "cuda"));
  REQUIRE_FALSE(bad.value);
  REQUIRE(bad.errors.size() == 1);
  CHECK(says(bad.errors[0].to_string(),
             "cluster.device: device \"cuda\" needs NVIDIA hardware, not cpu"));
  CHECK(says(load_topology(d.topology("H100", "tpu")).errors.at(0).to_string(),
             "unknown device 'tpu'"));
}

TEST_CASE("troupe serve refuses a device it has no engine for, and says why") {
  setup_dir d;
  CHECK(says(refusal(d.options(d.topology("Ascend950"))),
             "hardware 'Ascend950' has no device backend (the topology is for the simulator); "
             "add device = \"cpu\""));
  REQUIRE(find_device_engine("cuda") == nullptr);  // the test binary registers none
  CHECK(says(refusal(d.options(d.topology("H100"))),
             "device \"cuda\": this troupe was built without the CUDA engine"));
  // device = "cpu" serves a GPU topology on the CPU backend.
  CHECK(refusal(d.options(d.topology("H100", "cpu"))).empty());
}

TEST_CASE("troupe serve runs a CPU pool's instances of several ranks as EP groups: at most a "
          "rank per routed expert, ep_size equal to the ranks, no --eplb") {
  setup_dir d;
  CHECK(refusal(d.options(d.topology("cpu", "", 4))).empty());
  CHECK(says(refusal(d.options(d.topology("cpu", "", 64))),
             "pool 'prefill' has gpus_per_instance = 64; the model has 16 routed experts, at "
             "least one per rank of an instance's EP group"));
  auto eplb = d.options(d.topology("cpu", "", 2));
  eplb.eplb_ranks = 4;
  CHECK(says(refusal(eplb), "--eplb 4: pool 'prefill' runs its instances as EP groups of 2 "
                            "ranks, which keep the placement they start with"));
  auto t = load_topology(d.topology("cpu", "", 4));
  REQUIRE(t.value);
  t.value->pools[1].ep_size = 2;
  CHECK(says(check_real_topology(*t.value), "pool 'decode' has ep_size = 2 and "
                                            "gpus_per_instance = 4; the CPU backend runs an "
                                            "instance's ranks as one EP group (make them equal)"));
}

TEST_CASE("troupe serve on a cuda engine: the machine's GPU, the options it cannot run, the "
          "context it allocates for") {
  setup_dir d;
  fake_cuda cuda(16384);
  const auto topo = d.topology("H200");
  auto o = d.options(topo);

  cuda.unusable = "no CUDA device: cudaErrorNoDevice";
  CHECK(says(refusal(o), "device \"cuda\": no CUDA device: cudaErrorNoDevice (device = \"cpu\" "
                         "runs the CPU backend)"));
  // A launcher or a control process runs no device: it need not have a GPU.
  CHECK(refusal(o, false).empty());
  cuda.unusable.clear();

  CHECK(says(refusal(d.options(d.topology("H200", "", 8))),
             "pool 'prefill' has gpus_per_instance = 8; the CUDA backend runs one GPU per "
             "instance so far"));
  auto spec = o;
  spec.spec = "fixed2";
  CHECK(says(refusal(spec), "--spec fixed2: the engine of device \"cuda\" does not run "
                            "speculative decoding"));
  cuda.speculative(true);  // then the model's draft layers are what --spec needs
  CHECK(says(refusal(spec), "model.safetensors"));
  auto huge = o;
  huge.max_context = 2'000'000;
  CHECK(says(refusal(huge), "--max-context 2000000: expected 2 .. 1048576 tokens"));

  // The context: the engine's default under the model's, else --max-context; the devices'
  // backend is made for it and for a decode batch.
  std::ostringstream err;
  auto in = load_serve_inputs(o, "troupe serve", err);
  REQUIRE_MESSAGE(in, err.str());
  CHECK(in->max_context == 16384);
  o.max_context = 3000;
  o.max_batch = 12;
  o.prefill_chunk = 2000;  // up to 16 prompts share a prefill step
  in = load_serve_inputs(o, "troupe serve", err);
  REQUIRE_MESSAGE(in, err.str());
  CHECK(in->max_context == 3000);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  runtime::registry metrics;
  auto gp = make_real_graph_params(sys, o, *in, metrics, nullptr, "troupe serve", err);
  REQUIRE_MESSAGE(gp, err.str());
  CHECK(gp->max_context == 3000);
  CHECK(cuda.opened.empty());
  // Each device spawned asks the engine for its backend, with its place: the prefill
  // instances first, then the decode ones.
  for (auto [role, instance] : {std::pair{pool_role::decode, 0u}, std::pair{pool_role::prefill, 0u},
                                std::pair{pool_role::decode, 2u}})
    caf::anon_send_exit(gp->device(sys, role, instance, 1), caf::exit_reason::user_shutdown);
  REQUIRE(cuda.opened.size() == 3);
  CHECK(cuda.opened[0].index == 1);
  CHECK(cuda.opened[1].index == 0);
  CHECK(cuda.opened[2].index == 3);
  CHECK(cuda.opened[0].max_sequences == 12);  // a decode batch
  CHECK(cuda.opened[1].max_sequences == 16);  // a prefill step's prompts
  for (const auto& l : cuda.opened)
    CHECK(l.max_context == 3000);

  // On the CPU backend the context is the model's.
  auto cpu = d.options(d.topology("cpu"));
  in = load_serve_inputs(cpu, "troupe serve", err);
  REQUIRE_MESSAGE(in, err.str());
  CHECK(in->max_context == 1048576);
}
