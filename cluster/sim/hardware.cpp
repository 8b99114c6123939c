// Hardware profiles: built-in figures (sources in docs/perf-model.md) and JSON overrides.
#include "cluster/sim/hardware.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <utility>

namespace troupe::cluster::sim {

namespace {

constexpr double tera = 1e12;
constexpr double giga = 1e9;
constexpr double micro = 1e-6;

// Efficiency factors measured on Hopper by DeepSeek's open kernels (docs/perf-model.md):
// DeepGEMM FP8 GEMMs, FlashMLA, DeepEP normal and low-latency kernels.
void hopper_efficiencies(hardware_profile& h) {
  h.gemm_efficiency = 0.75;
  h.attention_efficiency = 0.66;
  h.memory_efficiency = 0.85;
  h.scale_up_efficiency = 0.78;
  h.scale_out_efficiency = 0.80;
  h.comm_sm_fraction = 24.0 / 132.0;
  h.host_to_device_bytes_per_s = 50 * giga; // PCIe Gen5 x16, effective
  h.ssd_read_iops = 1.5e6;                  // a node's NVMe random-read rate / 8 GPUs
}

hardware_profile hopper(std::string name, double hbm_rate, double hbm_size, double nvlink) {
  hardware_profile h;
  h.name = std::move(name);
  h.bf16_flops = 989.4 * tera;
  h.fp8_flops = 1978.9 * tera;
  h.hbm_bytes_per_s = hbm_rate;
  h.hbm_bytes = hbm_size;
  h.scale_up_bytes_per_s = nvlink;
  h.scale_up_latency_s = 10 * micro;
  h.scale_up_domain = 8;
  h.scale_out_bytes_per_s = 50 * giga; // one ConnectX-7 400 Gb/s NIC per GPU
  h.scale_out_latency_s = 25 * micro;
  h.gpus_per_node = 8;
  hopper_efficiencies(h);
  return h;
}

std::vector<hardware_profile> builtin_profiles() {
  std::vector<hardware_profile> out;
  // H800 SXM5: H100 compute and HBM3, NVLink cut to 400 GB/s bidirectional.
  out.push_back(hopper("H800", 3.35 * tera, 80 * giga, 200 * giga));
  // H100 SXM5: NVLink 4, 900 GB/s bidirectional.
  out.push_back(hopper("H100", 3.35 * tera, 80 * giga, 450 * giga));
  // H200 SXM: H100 compute, 141 GB HBM3e at 4.8 TB/s.
  out.push_back(hopper("H200", 4.8 * tera, 141 * giga, 450 * giga));

  // B200 (HGX): 2.25 / 4.5 / 9 PFLOP/s dense bf16 / fp8 / fp4, 8 TB/s, NVLink 5.
  hardware_profile b;
  b.name = "B200";
  b.bf16_flops = 2250 * tera;
  b.fp8_flops = 4500 * tera;
  b.fp4_flops = 9000 * tera;
  b.hbm_bytes_per_s = 8 * tera;
  b.hbm_bytes = 180 * giga;
  b.scale_up_bytes_per_s = 900 * giga;
  b.scale_up_latency_s = 10 * micro;
  b.scale_up_domain = 8;
  b.scale_out_bytes_per_s = 50 * giga;
  b.scale_out_latency_s = 25 * micro;
  b.gpus_per_node = 8;
  hopper_efficiencies(b);
  b.gemm_efficiency = 0.70;      // younger kernels; FlashMLA on B200 reaches less of peak
  b.attention_efficiency = 0.64; // FlashMLA sparse prefill 1450 of 2250 TFLOP/s
  b.scale_up_efficiency = 0.80;  // DeepEP V2: 726 GB/s logical over NVLink 5
  b.comm_sm_fraction = 24.0 / 148.0;
  out.push_back(b);

  // Ascend 950 (950DT as announced): 1 PFLOP/s FP8, 2 PFLOP/s FP4, 144 GB at 4 TB/s, 2 TB/s
  // interconnect in a SuperPoD scale-up domain. bf16 and all efficiencies are assumptions.
  hardware_profile a;
  a.name = "Ascend950";
  a.bf16_flops = 500 * tera;
  a.fp8_flops = 1000 * tera;
  a.fp4_flops = 2000 * tera;
  a.hbm_bytes_per_s = 4 * tera;
  a.hbm_bytes = 144 * giga;
  a.scale_up_bytes_per_s = 1000 * giga;
  a.scale_up_latency_s = 10 * micro;
  a.scale_up_domain = 8192;
  a.scale_out_bytes_per_s = 50 * giga;
  a.scale_out_latency_s = 25 * micro;
  a.gpus_per_node = 8;
  hopper_efficiencies(a);
  out.push_back(a);
  return out;
}

const std::vector<hardware_profile>& builtins() {
  static const std::vector<hardware_profile> profiles = builtin_profiles();
  return profiles;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string known_list() {
  std::string out;
  for (auto n : known_hardware_profiles()) {
    if (!out.empty())
      out += ", ";
    out += n;
  }
  return out;
}

struct double_field {
  const char* name;
  double hardware_profile::*member;
};

const std::vector<double_field>& double_fields() {
  static const std::vector<double_field> fields{
    {"bf16_flops", &hardware_profile::bf16_flops},
    {"fp8_flops", &hardware_profile::fp8_flops},
    {"fp4_flops", &hardware_profile::fp4_flops},
    {"hbm_bytes_per_s", &hardware_profile::hbm_bytes_per_s},
    {"hbm_bytes", &hardware_profile::hbm_bytes},
    {"scale_up_bytes_per_s", &hardware_profile::scale_up_bytes_per_s},
    {"scale_up_latency_s", &hardware_profile::scale_up_latency_s},
    {"scale_out_bytes_per_s", &hardware_profile::scale_out_bytes_per_s},
    {"scale_out_latency_s", &hardware_profile::scale_out_latency_s},
    {"gemm_efficiency", &hardware_profile::gemm_efficiency},
    {"attention_efficiency", &hardware_profile::attention_efficiency},
    {"memory_efficiency", &hardware_profile::memory_efficiency},
    {"scale_up_efficiency", &hardware_profile::scale_up_efficiency},
    {"scale_out_efficiency", &hardware_profile::scale_out_efficiency},
    {"comm_sm_fraction", &hardware_profile::comm_sm_fraction},
    {"host_to_device_bytes_per_s", &hardware_profile::host_to_device_bytes_per_s},
    {"ssd_read_iops", &hardware_profile::ssd_read_iops},
  };
  return fields;
}

// The fields that must be positive for the model to divide by them.
bool must_be_positive(std::string_view field) {
  return field != "fp4_flops" && field != "comm_sm_fraction" && field != "scale_up_latency_s"
         && field != "scale_out_latency_s";
}

} // namespace

const std::vector<std::string_view>& known_hardware_profiles() {
  static const std::vector<std::string_view> names{"H800", "H100", "H200", "B200", "Ascend950"};
  return names;
}

result<hardware_profile> hardware_by_name(std::string_view name) {
  auto key = lower(name);
  if (key == "cpu")
    return result<hardware_profile>::failure(
      "hardware 'cpu' has no performance model: the CPU backend is exact and runs for real; "
      "use one of " + known_list() + " (or a profile .json file) to simulate");
  for (const auto& p : builtins())
    if (lower(p.name) == key)
      return p;
  return result<hardware_profile>::failure("unknown hardware '" + std::string(name)
                                           + "' (known: " + known_list()
                                           + ", or a profile .json file)");
}

result<hardware_profile> hardware_from_json(const nlohmann::json& j) {
  using r = result<hardware_profile>;
  if (!j.is_object())
    return r::failure("hardware profile: expected a JSON object");
  hardware_profile h;
  bool based = false;
  if (auto it = j.find("base"); it != j.end()) {
    if (!it->is_string())
      return r::failure("hardware profile: 'base' must be a string naming a built-in profile");
    auto base = hardware_by_name(it->get<std::string>());
    if (!base)
      return r::failure("hardware profile: base: " + base.error());
    h = *base;
    based = true;
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "base")
      continue;
    if (key == "name") {
      if (!value.is_string())
        return r::failure("hardware profile: 'name' must be a string");
      h.name = value.get<std::string>();
      continue;
    }
    if (key == "scale_up_domain" || key == "gpus_per_node") {
      if (!value.is_number_integer() || value.get<long long>() < 1)
        return r::failure("hardware profile: '" + key + "' must be a positive integer");
      (key == "scale_up_domain" ? h.scale_up_domain : h.gpus_per_node) = value.get<int>();
      continue;
    }
    auto& fields = double_fields();
    auto f = std::find_if(fields.begin(), fields.end(),
                          [&](const double_field& d) { return key == d.name; });
    if (f == fields.end())
      return r::failure("hardware profile: unknown field '" + key + "'");
    if (!value.is_number())
      return r::failure("hardware profile: '" + key + "' must be a number");
    h.*(f->member) = value.get<double>();
  }
  if (h.name.empty())
    h.name = "custom";
  for (const auto& f : double_fields()) {
    double v = h.*(f.member);
    if (v < 0 || (must_be_positive(f.name) && v <= 0))
      return r::failure(std::string("hardware profile: '") + f.name
                        + (based || j.contains(f.name) ? "' must be positive"
                                                       : "' is missing (or give a 'base')"));
  }
  if (h.comm_sm_fraction >= 1)
    return r::failure("hardware profile: 'comm_sm_fraction' must be below 1");
  return h;
}

result<hardware_profile> load_hardware_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in)
    return result<hardware_profile>::failure(file.string() + ": cannot open hardware profile");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded())
    return result<hardware_profile>::failure(file.string() + ": not valid JSON");
  auto h = hardware_from_json(j);
  if (!h)
    return result<hardware_profile>::failure(file.string() + ": " + h.error());
  return h;
}

result<hardware_profile> resolve_hardware(std::string_view name_or_file) {
  if (name_or_file.size() > 5 && lower(name_or_file.substr(name_or_file.size() - 5)) == ".json")
    return load_hardware_file(std::filesystem::path(std::string(name_or_file)));
  return hardware_by_name(name_or_file);
}

} // namespace troupe::cluster::sim
