// Encoding and decoding of the wire schemas (see convert.hpp).
#include "schemas/convert.hpp"

#include "schemas/kv_block.capnp.h"
#include "schemas/request.capnp.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <string_view>

namespace troupe::schemas {

namespace {

schema_error invalid(std::string message) {
  return {schema_errc::invalid, std::move(message)};
}

capnp::Text::Reader as_text(const std::string& s) {
  return capnp::Text::Reader(s.c_str(), s.size());
}

std::vector<std::uint32_t> to_vector(capnp::List<std::uint32_t>::Reader in) {
  std::vector<std::uint32_t> out(in.size());
  for (unsigned i = 0; i < in.size(); ++i)
    out[i] = in[i];
  return out;
}

std::vector<std::byte> to_bytes(capnp::MessageBuilder& builder) {
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

// -- writing ----------------------------------------------------------------------------------

void write(wire::KvBlock::Builder out, const kv_block_descriptor& x) {
  out.setHash(x.hash);
  out.setParentHash(x.parent_hash);
  out.setTokenCount(x.token_count);
  out.setByteSize(x.byte_size);
  out.setChecksum(x.checksum);
  out.setTrafficClass(static_cast<wire::TrafficClass>(x.traffic));
  out.setExpiryNs(x.expiry_ns);
  out.setModelTag(x.model_tag);
}

void write(wire::RequestEnvelope::Builder out, const request_envelope& x) {
  out.setRequestId(x.request_id);
  out.setApi(static_cast<wire::ApiProtocol>(x.api));
  out.setTrafficClass(static_cast<wire::TrafficClass>(x.traffic));
  out.setModel(as_text(x.model));
  auto tokens = out.initPromptTokens(static_cast<unsigned>(x.prompt_tokens.size()));
  for (unsigned i = 0; i < x.prompt_tokens.size(); ++i)
    tokens.set(i, x.prompt_tokens[i]);
  auto images = out.initImages(static_cast<unsigned>(x.images.size()));
  for (unsigned i = 0; i < x.images.size(); ++i) {
    auto image = images[i];
    image.setId(as_text(x.images[i].id));
    image.setByteSize(x.images[i].byte_size);
    image.setContentHash(x.images[i].content_hash);
  }
  auto sampling = out.initSampling();
  const auto& s = x.sampling;
  sampling.setMaxTokens(s.max_tokens);
  sampling.setTemperature(s.temperature);
  sampling.setTopP(s.top_p);
  if (s.seed)
    sampling.getSeed().setFixed(*s.seed);
  else
    sampling.getSeed().setRandom();
  sampling.setN(s.n);
  auto stops = sampling.initStopTokenIds(static_cast<unsigned>(s.stop_token_ids.size()));
  for (unsigned i = 0; i < s.stop_token_ids.size(); ++i)
    stops.set(i, s.stop_token_ids[i]);
  out.setDeadlineNs(x.deadline_ns);
  out.setArrivalNs(x.arrival_ns);
  out.setPriority(x.priority);
  out.setStream(x.stream);
}

// -- reading (eager: every field is touched inside read_message's try block) ------------------

std::optional<schema_error> read_traffic(wire::TrafficClass in, traffic_class& out) {
  auto raw = static_cast<std::uint16_t>(in);
  if (raw > static_cast<std::uint16_t>(traffic_class::batch))
    return invalid("unknown traffic class " + std::to_string(raw));
  out = static_cast<traffic_class>(raw);
  return std::nullopt;
}

std::optional<schema_error> read(wire::KvBlock::Reader in, kv_block_descriptor& out) {
  out.hash = in.getHash();
  out.parent_hash = in.getParentHash();
  out.token_count = in.getTokenCount();
  out.byte_size = in.getByteSize();
  out.checksum = in.getChecksum();
  out.expiry_ns = in.getExpiryNs();
  out.model_tag = in.getModelTag();
  return read_traffic(in.getTrafficClass(), out.traffic);
}

std::optional<schema_error> read(wire::KvBlockChain::Reader in, kv_block_chain& out) {
  auto blocks = in.getBlocks();
  out.blocks.resize(blocks.size());
  for (unsigned i = 0; i < blocks.size(); ++i)
    if (auto err = read(blocks[i], out.blocks[i]))
      return err;
  return std::nullopt;
}

std::optional<schema_error> read(wire::RequestEnvelope::Reader in, request_envelope& out) {
  out.request_id = in.getRequestId();
  auto api = static_cast<std::uint16_t>(in.getApi());
  if (api > static_cast<std::uint16_t>(api_protocol::messages))
    return invalid("unknown api protocol " + std::to_string(api));
  out.api = static_cast<api_protocol>(api);
  if (auto err = read_traffic(in.getTrafficClass(), out.traffic))
    return err;
  auto model = in.getModel();
  out.model.assign(model.begin(), model.size());
  out.prompt_tokens = to_vector(in.getPromptTokens());
  auto images = in.getImages();
  out.images.resize(images.size());
  for (unsigned i = 0; i < images.size(); ++i) {
    auto image = images[i];
    auto id = image.getId();
    out.images[i].id.assign(id.begin(), id.size());
    out.images[i].byte_size = image.getByteSize();
    out.images[i].content_hash = image.getContentHash();
  }
  auto sampling = in.getSampling();
  auto& s = out.sampling;
  s.max_tokens = sampling.getMaxTokens();
  s.temperature = sampling.getTemperature();
  s.top_p = sampling.getTopP();
  auto seed = sampling.getSeed();
  switch (seed.which()) {
    case wire::SamplingParams::Seed::RANDOM:
      s.seed.reset();
      break;
    case wire::SamplingParams::Seed::FIXED:
      s.seed = seed.getFixed();
      break;
    default:
      return invalid("unknown seed kind");
  }
  s.n = sampling.getN();
  s.stop_token_ids = to_vector(sampling.getStopTokenIds());
  out.deadline_ns = in.getDeadlineNs();
  out.arrival_ns = in.getArrivalNs();
  out.priority = in.getPriority();
  out.stream = in.getStream();
  return std::nullopt;
}

template <class Wire, class T>
decoded<T> read_message(std::span<const std::byte> bytes) {
  constexpr auto word_size = sizeof(capnp::word);
  if (bytes.empty())
    return schema_error{schema_errc::truncated, "empty message"};
  if (bytes.size() % word_size != 0)
    return schema_error{schema_errc::truncated,
                        "message of " + std::to_string(bytes.size())
                          + " bytes is not a whole number of 8-byte words"};
  // Copy: the input need not be word-aligned, and the reader must not outlive it anyway.
  auto words = kj::heapArray<capnp::word>(bytes.size() / word_size);
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  T value;
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr());
    if (reader.getEnd() != words.end())
      return schema_error{schema_errc::malformed, "trailing bytes after the message"};
    if (auto err = read(reader.getRoot<Wire>(), value))
      return std::move(*err);
  } catch (const kj::Exception& e) {
    std::string_view what{e.getDescription().cStr()};
    auto code = what.find("ends prematurely") != std::string_view::npos ? schema_errc::truncated
                                                                        : schema_errc::malformed;
    return schema_error{code, std::string{what}};
  } catch (const std::exception& e) {
    return schema_error{schema_errc::malformed, e.what()};
  } catch (...) {
    return schema_error{schema_errc::malformed, "unknown error while reading the message"};
  }
  if (auto err = validate(value))
    return std::move(*err);
  return value;
}

} // namespace

// -- validation -------------------------------------------------------------------------------

std::optional<schema_error> validate(const request_envelope& x) {
  if (x.model.empty())
    return invalid("request " + std::to_string(x.request_id) + ": empty model name");
  for (const auto& image : x.images)
    if (image.id.empty())
      return invalid("request " + std::to_string(x.request_id) + ": image without an id");
  const auto& s = x.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f)
    return invalid("request " + std::to_string(x.request_id) + ": temperature "
                   + std::to_string(s.temperature) + " is not a finite value >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return invalid("request " + std::to_string(x.request_id) + ": top_p "
                   + std::to_string(s.top_p) + " is not in (0, 1]");
  if (s.n == 0)
    return invalid("request " + std::to_string(x.request_id) + ": n is 0");
  if (x.deadline_ns != 0 && x.deadline_ns < x.arrival_ns)
    return invalid("request " + std::to_string(x.request_id) + ": deadline before arrival");
  return std::nullopt;
}

std::optional<schema_error> validate(const kv_block_descriptor& x) {
  if (x.hash == 0)
    return invalid("kv block with hash 0 (reserved for 'no parent')");
  if (x.parent_hash == x.hash)
    return invalid("kv block " + std::to_string(x.hash) + " is its own parent");
  if (x.token_count == 0 || x.token_count > max_block_tokens)
    return invalid("kv block " + std::to_string(x.hash) + " holds "
                   + std::to_string(x.token_count) + " tokens, not 1.."
                   + std::to_string(max_block_tokens));
  return std::nullopt;
}

std::optional<schema_error> validate(const kv_block_chain& x) {
  for (std::size_t i = 0; i < x.blocks.size(); ++i) {
    const auto& block = x.blocks[i];
    if (auto err = validate(block))
      return invalid("block " + std::to_string(i) + " of chain: " + err->message);
    if (i == 0)
      continue;
    const auto& prev = x.blocks[i - 1];
    if (block.parent_hash != prev.hash)
      return invalid("block " + std::to_string(i) + " of chain does not follow block "
                     + std::to_string(i - 1));
    if (block.model_tag != prev.model_tag)
      return invalid("block " + std::to_string(i) + " of chain has another model tag");
    if (prev.token_count != max_block_tokens)
      return invalid("block " + std::to_string(i - 1) + " of chain is partial but not last");
  }
  return std::nullopt;
}

// -- encoding and decoding --------------------------------------------------------------------

std::vector<std::byte> encode(const request_envelope& x) {
  capnp::MallocMessageBuilder builder;
  write(builder.initRoot<wire::RequestEnvelope>(), x);
  return to_bytes(builder);
}

std::vector<std::byte> encode(const kv_block_descriptor& x) {
  capnp::MallocMessageBuilder builder;
  write(builder.initRoot<wire::KvBlock>(), x);
  return to_bytes(builder);
}

std::vector<std::byte> encode(const kv_block_chain& x) {
  capnp::MallocMessageBuilder builder;
  auto blocks = builder.initRoot<wire::KvBlockChain>().initBlocks(
    static_cast<unsigned>(x.blocks.size()));
  for (unsigned i = 0; i < x.blocks.size(); ++i)
    write(blocks[i], x.blocks[i]);
  return to_bytes(builder);
}

template <>
decoded<request_envelope> decode<request_envelope>(std::span<const std::byte> bytes) {
  return read_message<wire::RequestEnvelope, request_envelope>(bytes);
}

template <>
decoded<kv_block_descriptor> decode<kv_block_descriptor>(std::span<const std::byte> bytes) {
  return read_message<wire::KvBlock, kv_block_descriptor>(bytes);
}

template <>
decoded<kv_block_chain> decode<kv_block_chain>(std::span<const std::byte> bytes) {
  return read_message<wire::KvBlockChain, kv_block_chain>(bytes);
}

std::uint64_t payload_checksum(std::span<const std::byte> payload) noexcept {
  return XXH64(payload.data(), payload.size(), 0);
}

} // namespace troupe::schemas
