// One client connection of the HTTP entrypoint (see http_session.hpp, docs/api.md).
#include "actors/entrypoint/http_session.hpp"

#include "actors/entrypoint/api_keys.hpp"
#include "runtime/log.hpp"

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <caf/send.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace troupe::actors::http_detail {

namespace {

using clock_type = std::chrono::steady_clock;
using header_list = std::vector<std::pair<std::string, std::string>>;

/// Output a client has not taken yet beyond which it is dropped (it stopped reading).
constexpr std::size_t max_backlog_bytes = 16u << 20;
/// Bytes a watch read may leave in the buffer (pipelined requests) before watching stops.
constexpr std::size_t max_pipelined_bytes = 1u << 20;
/// How long a lingering close drains the client's input.
constexpr std::chrono::milliseconds linger_time{1000};

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool anthropic(const std::optional<recipe::protocol>& p) {
  return p && *p == recipe::protocol::messages;
}

/// The error `type` each API uses for a status.
std::string error_type(const std::optional<recipe::protocol>& p, int status) {
  if (anthropic(p)) {
    switch (status) {
      case 401: return "authentication_error";
      case 403: return "permission_error";
      case 404: return "not_found_error";
      case 408: return "timeout_error";
      case 413: return "request_too_large";
      case 429: return "rate_limit_error";
      case 503: return "overloaded_error";
      default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
  }
  if (status == 429)
    return "rate_limit_error";
  if (status == 401)
    return "authentication_error";
  return status >= 500 ? "server_error" : "invalid_request_error";
}

recipe::api_error make_error(const std::optional<recipe::protocol>& p, int status,
                             std::string message, std::optional<std::string> code = {},
                             std::optional<std::string> param = {}) {
  recipe::api_error e;
  e.status = status;
  e.message = std::move(message);
  e.type = error_type(p, status);
  e.code = std::move(code);
  e.param = std::move(param);
  return e;
}

std::string error_body(const std::optional<recipe::protocol>& p, const recipe::api_error& e) {
  return p ? recipe::error_json(*p, e) : e.to_json();
}

std::string hex(std::size_t n) {
  char buf[24];
  const int len = std::snprintf(buf, sizeof(buf), "%zx", n);
  return std::string(buf, static_cast<std::size_t>(len));
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::string random_suffix(std::uint64_t seed, std::uint64_t n) {
  std::uint64_t a = mix(seed ^ n), b = mix(a + n);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffULL));
  return buf;
}

std::string rfc3339(std::int64_t unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

struct route_info {
  std::string_view path;
  http::verb method;
  std::optional<recipe::protocol> protocol;
};

constexpr route_info routes[] = {
  {"/v1/chat/completions", http::verb::post, recipe::protocol::chat_completions},
  {"/v1/responses", http::verb::post, recipe::protocol::responses},
  {"/v1/messages", http::verb::post, recipe::protocol::messages},
  {"/v1/models", http::verb::get, std::nullopt},
  {"/health", http::verb::get, std::nullopt},
  {"/ready", http::verb::get, std::nullopt},
  {"/metrics", http::verb::get, std::nullopt},
};

std::string_view sv(beast::string_view s) {
  return {s.data(), s.size()};
}

std::string_view path_of(std::string_view target) {
  const auto q = target.find_first_of("?#");
  return q == std::string_view::npos ? target : target.substr(0, q);
}

/// The route of a path whose header is known, for the error shape of a failed read.
std::optional<recipe::protocol> protocol_of(std::string_view target) {
  const auto path = path_of(target);
  for (const auto& r : routes)
    if (r.path == path)
      return r.protocol;
  return std::nullopt;
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size())
    return false;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i]))
        != std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  return true;
}

} // namespace

// -- io_bridge, server_state ------------------------------------------------------------------

void io_bridge::post(const asio::any_io_executor& ex, std::function<void()> f) {
  std::lock_guard guard{mtx_};
  if (open_)
    asio::post(ex, std::move(f));
}

void io_bridge::close() {
  std::lock_guard guard{mtx_};
  open_ = false;
}

std::shared_ptr<void> server_state::admit() {
  {
    std::lock_guard guard{mtx_};
    if (in_flight_ >= params.max_in_flight)
      return nullptr;
    ++in_flight_;
    metrics.in_flight->set(static_cast<double>(in_flight_));
  }
  // A ticket may outlive the server (a sink that still waits for its request's end).
  return std::shared_ptr<void>(new char(0), [self = shared_from_this()](char* p) {
    delete p;
    self->release();
  });
}

void server_state::release() {
  std::lock_guard guard{mtx_};
  if (in_flight_ > 0)
    --in_flight_;
  if (!metrics_detached_)
    metrics.in_flight->set(static_cast<double>(in_flight_));
  idle_.notify_all();
}

void server_state::detach_metrics() {
  std::lock_guard guard{mtx_};
  metrics_detached_ = true;
}

std::size_t server_state::in_flight() const {
  std::lock_guard guard{mtx_};
  return in_flight_;
}

bool server_state::wait_idle(clock_type::time_point deadline) {
  std::unique_lock lock{mtx_};
  return idle_.wait_until(lock, deadline, [this] { return in_flight_ == 0; });
}

void server_state::add_session(const std::shared_ptr<http_session>& s) {
  std::lock_guard guard{mtx_};
  std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
  sessions_.push_back(s);
}

std::vector<std::shared_ptr<http_session>> server_state::live_sessions() {
  std::lock_guard guard{mtx_};
  std::vector<std::shared_ptr<http_session>> out;
  for (const auto& w : sessions_)
    if (auto s = w.lock())
      out.push_back(std::move(s));
  return out;
}

// -- session: lifetime ------------------------------------------------------------------------

http_session::http_session(tcp::socket socket, std::shared_ptr<server_state> server)
  : server_(std::move(server)),
    socket_(std::move(socket)),
    ex_(socket_.get_executor()),
    read_timer_(ex_),
    write_timer_(ex_) {
  ++server_->open_sessions;
  server_->metrics.connections->inc();
}

http_session::~http_session() {
  if (gen_active_ && sink_ && !cancel_sent_)
    caf::anon_send(sink_, cancel_atom::value);
  server_->metrics.connections->dec();
  --server_->open_sessions;
}

template <class F>
void http_session::guarded(F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    runtime::log::get("entrypoint")->error("connection handler failed: {}", e.what());
    try {
      close_now();
    } catch (...) {
    }
  } catch (...) {
    runtime::log::get("entrypoint")->error("connection handler failed");
    try {
      close_now();
    } catch (...) {
    }
  }
}

void http_session::start() {
  guarded([&] { read_request(); });
}

void http_session::server_stopping() {
  guarded([&] {
    stop_requested_ = true;
    keep_alive_ = false;
    const bool waiting = (reading_ && !(parser_ && parser_->got_some())) || next_after_watch_;
    if (waiting && buffer_.size() == 0 && !gen_active_)
      close_now();
    else
      close_after_response_ = true;
  });
}

void http_session::shutdown_cancel() {
  guarded([&] {
    if (!gen_active_)
      return;
    shutdown_cancelled_ = true;
    cancel_generation("shutdown");
  });
}

void http_session::force_close() {
  guarded([&] { close_now(); });
}

void http_session::close_now() {
  if (closed_)
    return;
  closed_ = true;
  read_timer_.cancel();
  write_timer_.cancel();
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  out_.clear();
  out_bytes_ = 0;
  if (gen_active_) {
    if (!cancel_sent_) {
      // The client left before its response was complete (nginx's "499").
      cancel_generation("client_disconnect");
      server_->metrics.count(route_, 499);
    }
    generation_over();
  }
  ticket_.reset();
}

// -- session: reading -------------------------------------------------------------------------

void http_session::arm_read_timer(std::chrono::milliseconds d) {
  timed_out_ = false;
  read_timer_.expires_after(d);
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec)
      return;  // cancelled
    self->guarded([&] {
      if (self->closed_)
        return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
    });
  });
}

void http_session::read_request() {
  if (closed_ || closing_)
    return;
  if (stop_requested_ && buffer_.size() == 0) {
    close_now();
    return;
  }
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(server_->params.max_header_bytes));
  parser_->body_limit(server_->params.max_body_bytes);
  reading_ = true;
  route_ = "other";
  protocol_.reset();
  arm_read_timer(server_->params.read_timeout);
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, std::size_t) {
                            self->guarded([&] { self->on_header(ec); });
                          });
}

void http_session::on_header(beast::error_code ec) {
  if (closed_)
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  auto& req = parser_->get();
  protocol_ = protocol_of(sv(req.target()));
  version_ = req.version();
  // Request smuggling: one Content-Length only (Beast refuses differing ones), and a
  // Transfer-Encoding must end in chunked (else the body length would be guessed).
  if (req.count(http::field::content_length) > 1) {
    reading_ = false;
    read_timer_.cancel();
    send_error(400, make_error(protocol_, 400, "Malformed HTTP request: more than one "
                                               "Content-Length header."),
               true);
    return;
  }
  if (req.count(http::field::transfer_encoding) > 0 && !parser_->chunked()) {
    reading_ = false;
    read_timer_.cancel();
    send_error(400, make_error(protocol_, 400, "Malformed HTTP request: unsupported "
                                               "Transfer-Encoding (only chunked)."),
               true);
    return;
  }
  if (parser_->is_done()) {
    on_body({});
    return;
  }
  const auto expect = sv(req[http::field::expect]);
  if (iequals_prefix(expect, "100-continue"))
    write("HTTP/1.1 100 Continue\r\n\r\n");
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, std::size_t) {
                     self->guarded([&] { self->on_body(ec); });
                   });
}

void http_session::on_body(beast::error_code ec) {
  if (closed_)
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  reading_ = false;
  read_timer_.cancel();
  request_t req = parser_->release();
  handle(req);
}

void http_session::on_read_error(beast::error_code ec) {
  reading_ = false;
  read_timer_.cancel();
  if (closed_)
    return;
  const bool some = parser_ && parser_->got_some();
  if (parser_ && parser_->is_header_done())
    protocol_ = protocol_of(sv(parser_->get().target()));
  if (timed_out_) {
    if (some)
      send_error(408, make_error(protocol_, 408, "The request did not arrive in time.",
                                 "request_timeout"),
                 true);
    else
      close_now();
    return;
  }
  if (ec == http::error::body_limit) {
    send_error(413,
               make_error(protocol_, 413,
                          "Request body too large: the limit is "
                            + std::to_string(server_->params.max_body_bytes) + " bytes.",
                          "request_too_large"),
               true);
    return;
  }
  if (ec == http::error::header_limit) {
    send_error(431,
               make_error(protocol_, 431,
                          "Request header fields too large: the limit is "
                            + std::to_string(server_->params.max_header_bytes) + " bytes."),
               true);
    return;
  }
  if (ec == http::error::end_of_stream || ec == asio::error::eof
      || ec == asio::error::operation_aborted || ec == asio::error::connection_reset
      || ec == asio::error::broken_pipe || ec == http::error::partial_message || !some) {
    close_now();
    return;
  }
  send_error(400, make_error(protocol_, 400, "Malformed HTTP request: " + ec.message() + "."),
             true);
}

// -- session: routes --------------------------------------------------------------------------

bool http_session::authorized(const request_t& req) const {
  const auto& keys = server_->params.api_keys;
  if (keys.empty())
    return true;
  const auto auth = sv(req[http::field::authorization]);
  if (iequals_prefix(auth, "bearer ")) {
    std::string_view key(auth.data() + 7, auth.size() - 7);
    while (!key.empty() && key.front() == ' ')
      key.remove_prefix(1);
    if (api_key_matches(keys, key))
      return true;
  }
  const auto x_api_key = req["x-api-key"];
  return !x_api_key.empty()
         && api_key_matches(keys, std::string_view(x_api_key.data(), x_api_key.size()));
}

void http_session::handle(request_t& req) {
  keep_alive_ = req.keep_alive() && !stop_requested_;
  chunked_ = version_ >= 11;
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = path_of(target);
  const route_info* route = nullptr;
  bool path_known = false;
  std::string model_id;
  for (const auto& r : routes) {
    if (r.path != path)
      continue;
    path_known = true;
    if (r.method == req.method())
      route = &r;
  }
  constexpr std::string_view models_prefix = "/v1/models/";
  if (!path_known && path.starts_with(models_prefix) && path.size() > models_prefix.size()) {
    path_known = true;
    model_id = std::string(path.substr(models_prefix.size()));
    if (req.method() == http::verb::get)
      route = &routes[3];
  }
  if (!path_known) {
    route_ = "other";
    send_error(404, make_error(std::nullopt, 404,
                               "Unknown route: " + std::string(req.method_string()) + " "
                                 + std::string(path) + ".",
                               "unknown_route"),
               false);
    return;
  }
  protocol_ = protocol_of(path);
  route_ = model_id.empty() ? std::string(path) : std::string("/v1/models/{id}");
  if (!route) {
    const char* allowed = "GET";
    for (const auto& r : routes)
      if (r.path == path && r.method == http::verb::post)
        allowed = "POST";
    send_error(405,
               make_error(protocol_, 405,
                          "Method " + std::string(req.method_string()) + " is not allowed on "
                            + std::string(path) + "; use " + allowed + ".",
                          "method_not_allowed"),
               false, {{"Allow", allowed}});
    return;
  }
  if (path.starts_with("/v1/") && !authorized(req)) {
    const bool presented = !req[http::field::authorization].empty()
                           || !req["x-api-key"].empty();
    send_error(401,
               make_error(protocol_, 401,
                          presented ? "Invalid API key." : "Missing API key: send it as "
                                                           "'Authorization: Bearer <key>' or "
                                                           "'x-api-key: <key>'.",
                          "invalid_api_key"),
               false, {{"WWW-Authenticate", "Bearer"}});
    return;
  }
  if (path == "/health") {
    send(200, "application/json", R"({"status":"ok"})", false);
  } else if (path == "/ready") {
    if (server_->ready && !server_->stopping)
      send(200, "application/json", R"({"status":"ready"})", false);
    else
      send_error(503,
                 make_error(std::nullopt, 503,
                            server_->stopping ? "The server is shutting down."
                                              : "The server is not ready.",
                            "not_ready"),
                 false,
                 {{"Retry-After", std::to_string(server_->params.retry_after.count())}});
  } else if (path == "/metrics") {
    send(200, "text/plain; version=0.0.4; charset=utf-8", server_->registry->expose(), false);
  } else if (route->protocol) {
    start_generation(req, *route->protocol);
  } else {
    serve_models(model_id);
  }
}

void http_session::serve_models(const std::string& one) {
  const auto& models = server_->params.models;
  auto entry = [&](const std::string& m) {
    nlohmann::ordered_json j;
    j["id"] = m;
    j["object"] = "model";
    j["created"] = server_->started_unix;
    j["owned_by"] = "troupe";
    // Anthropic's model object, so that either SDK's models.list() reads it.
    j["type"] = "model";
    j["display_name"] = m;
    j["created_at"] = rfc3339(server_->started_unix);
    return j;
  };
  if (!one.empty()) {
    if (std::find(models.begin(), models.end(), one) == models.end()) {
      send_error(404, make_error(std::nullopt, 404, "The model '" + one + "' does not exist.",
                                 "model_not_found", "model"),
                 false);
      return;
    }
    send(200, "application/json", entry(one).dump(), false);
    return;
  }
  nlohmann::ordered_json list;
  list["object"] = "list";
  list["data"] = nlohmann::ordered_json::array();
  for (const auto& m : models)
    list["data"].push_back(entry(m));
  list["has_more"] = false;
  list["first_id"] = models.empty() ? nlohmann::ordered_json(nullptr)
                                    : nlohmann::ordered_json(models.front());
  list["last_id"] = models.empty() ? nlohmann::ordered_json(nullptr)
                                   : nlohmann::ordered_json(models.back());
  send(200, "application/json", list.dump(), false);
}

void http_session::start_generation(request_t& req, recipe::protocol p) {
  auto& params = server_->params;
  const std::string retry = std::to_string(params.retry_after.count());
  if (server_->stopping) {
    send_error(503, make_error(p, 503, "The server is shutting down.", "shutting_down"), true,
               {{"Retry-After", retry}});
    return;
  }
  auto ticket = server_->admit();
  if (!ticket) {
    send_error(429,
               make_error(p, 429,
                          "Too many requests in flight (" + std::to_string(params.max_in_flight)
                            + "); retry later.",
                          "rate_limit_exceeded"),
               false, {{"Retry-After", retry}});
    return;
  }
  std::variant<recipe::encoded_request, recipe::api_error> encoded;
  try {
    encoded = params.codec->encode(p, req.body());
  } catch (const std::exception& e) {
    encoded = make_error(p, 400, std::string("The request cannot be encoded: ") + e.what());
  }
  if (auto* e = std::get_if<recipe::api_error>(&encoded)) {
    if (e->code && *e->code == "model_not_found") {
      e->status = 404;
      e->type = error_type(p, 404);
    }
    send_error(e->status, *e, false);
    return;
  }
  auto& r = std::get<recipe::encoded_request>(encoded);
  const auto& models = params.models;
  if (!models.empty()
      && std::find(models.begin(), models.end(), r.params.model) == models.end()) {
    std::string names;
    for (const auto& m : models)
      names += (names.empty() ? "" : ", ") + m;
    send_error(404,
               make_error(p, 404,
                          "The model '" + r.params.model
                            + "' does not exist; available models: " + names + ".",
                          "model_not_found", "model"),
               false);
    return;
  }
  if (r.params.n != 1) {
    send_error(400, make_error(p, 400, "Only n = 1 is supported.", std::nullopt, "n"), false);
    return;
  }
  const std::size_t prompt = r.prompt.ids.size();
  const std::size_t limit = params.max_context_tokens;
  if (prompt >= limit) {
    send_error(400,
               make_error(p, 400,
                          "This model's maximum context length is " + std::to_string(limit)
                            + " tokens; the prompt has " + std::to_string(prompt)
                            + " tokens (at least one must be left to generate).",
                          "context_length_exceeded", "messages"),
               false);
    return;
  }

  generation_request g;
  g.id = server_->next_id.fetch_add(1);
  g.prompt.reserve(prompt);
  for (const auto id : r.prompt.ids)
    g.prompt.push_back(static_cast<std::int32_t>(id));
  const std::int64_t room = static_cast<std::int64_t>(limit - prompt);
  const std::int64_t wanted = r.params.max_tokens.value_or(room);
  g.max_tokens = static_cast<std::uint32_t>(std::clamp<std::int64_t>(wanted, 1, room));
  g.sampling.temperature = r.params.temperature.value_or(1.0);
  g.sampling.top_p = r.params.top_p.value_or(1.0);
  g.sampling.top_k = r.params.top_k.value_or(0);
  g.sampling.seed = r.params.seed ? static_cast<std::uint64_t>(*r.params.seed)
                                  : mix(server_->seed ^ g.id);
  switch (p) {
    case recipe::protocol::chat_completions:
      g.sampling.top_logprobs = r.params.logprobs ? r.params.top_logprobs.value_or(0) : -1;
      break;
    case recipe::protocol::responses:
      g.sampling.top_logprobs =
        r.responses.output_text_logprobs ? r.params.top_logprobs.value_or(0) : -1;
      break;
    case recipe::protocol::messages:
      g.sampling.top_logprobs = -1;
      break;
  }
  for (const auto id : server_->stop_ids)
    g.stop_ids.push_back(static_cast<std::int32_t>(id));
  // Structured output: the format's grammar constrains the devices' sampling. (Or another
  // server's constraint field, recipe::sampling_params::extra_constraint.) With strict or
  // required tools the grammar is the tool-call block around it. It compiles on the constraint
  // table's pool while the request goes on to prefill; the client hears nothing before the
  // verdict (on_compiled).
  const bool extra = r.params.extra_constraint.has_value();
  const recipe::response_format& format = extra ? *r.params.extra_constraint : r.conversation.format;
  const std::string key = constraint_table::tools_key(r.conversation, r.params.format,
                                                      constraint_table::format_key(format));
  const bool strict = std::any_of(r.conversation.tools.begin(), r.conversation.tools.end(),
                                  [](const recipe::tool_definition& t) { return t.strict_schema.has_value(); });
  const std::string param = extra ? r.params.extra_constraint_param
                            : p == recipe::protocol::responses ? "text.format"
                            : p == recipe::protocol::messages  ? "output_config.format"
                                                               : "response_format";
  if (!key.empty() && !params.constraints && (format.type != recipe::response_format::kind::text || strict)) {
    send_error(400, make_error(p, 400, "Structured output is not available on this server.", std::nullopt,
                               format.type != recipe::response_format::kind::text ? param : "tools"), false);
    return;
  }
  if (!key.empty() && params.constraints) {
    std::vector<std::string> tool_params;
    for (const auto& t : r.conversation.tools)
      tool_params.push_back(t.schema_param);
    // Registered before the request exists in the graph, so no device samples it unconstrained.
    params.constraints->add(g.id, key, r.conversation.thinking, param, tool_params,
                            [server = server_, ex = ex_, self = shared_from_this()](std::optional<recipe::api_error> e) {
                              server->bridge.post(ex, [self, e = std::move(e)]() mutable { self->on_compiled(std::move(e)); });
                            });
    g.constraint = {key, r.conversation.thinking, g.prompt.size()};
    constraint_id_ = g.id;
    compile_pending_ = true;
  }
  // A conversation with tools is an agent's: its blocks live by the agent TTL.
  g.traffic = r.conversation.tools.empty() ? params.traffic : traffic_class::agent;

  const char* prefix = p == recipe::protocol::chat_completions ? "chatcmpl-"
                       : p == recipe::protocol::responses      ? "resp_"
                                                               : "msg_";
  response_.emplace(*params.codec, std::move(r), prefix + random_suffix(server_->seed, g.id),
                    unix_now(), server_->stop_ids);
  gen_active_ = true;
  stream_open_ = false;
  cancel_sent_ = false;
  cancel_for_output_ = false;
  shutdown_cancelled_ = false;
  first_token_ = true;
  admitted_at_ = clock_type::now();
  ticket_ = ticket;
  hold_ = shared_from_this();
  server_->metrics.queued->inc();

  generation_sink_config cfg;
  cfg.service = params.service;
  cfg.request = std::move(g);
  cfg.service_timeout = params.service_timeout;
  cfg.cancel_timeout = params.cancel_timeout;
  cfg.post = [server = server_, ex = ex_](std::function<void()> f) {
    server->bridge.post(ex, std::move(f));
  };
  cfg.listener = std::static_pointer_cast<generation_listener>(shared_from_this());
  cfg.ticket = std::move(ticket);
  sink_ = spawn_generation_sink(*server_->system, std::move(cfg));
  watch();  // a client that leaves cancels
}

// -- session: responses -----------------------------------------------------------------------

void http_session::send(int status, std::string_view content_type, std::string body, bool close,
                        const header_list& headers) {
  if (closed_)
    return;
  http::response<http::string_body> res;
  res.version(version_ >= 11 ? 11 : 10);
  res.result(static_cast<unsigned>(status));
  res.set(http::field::server, "troupe");
  res.set(http::field::content_type,
          beast::string_view(content_type.data(), content_type.size()));
  for (const auto& [name, value] : headers)
    res.set(name, value);
  const bool keep = !close && keep_alive_ && !close_after_response_;
  res.keep_alive(keep);
  res.body() = std::move(body);
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  server_->metrics.count(route_, status);
  write(os.str());
  finish_response(!keep);
}

void http_session::send_error(int status, const recipe::api_error& e, bool close,
                              const header_list& headers) {
  send(status, "application/json", error_body(protocol_, e), close, headers);
}

// -- session: the generation ------------------------------------------------------------------

void http_session::ensure_stream_open() {
  if (!response_ || !response_->streaming() || stream_open_ || closed_)
    return;
  stream_open_ = true;
  if (!chunked_ || close_after_response_)
    keep_alive_ = keep_alive_ && chunked_ && !close_after_response_;
  std::string head = version_ >= 11 ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.0 200 OK\r\n";
  head += "Server: troupe\r\n";
  head += "Content-Type: text/event-stream; charset=utf-8\r\n";
  head += "Cache-Control: no-cache\r\n";
  head += "X-Accel-Buffering: no\r\n";
  if (chunked_)
    head += "Transfer-Encoding: chunked\r\n";
  head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  head += "\r\n";
  write(std::move(head));
  write_chunk(response_->open());
}

void http_session::on_compiled(std::optional<recipe::api_error> error) {
  guarded([&] {
    if (!gen_active_ || !compile_pending_)
      return;
    compile_pending_ = false;
    auto events = std::move(held_events_);
    held_events_.clear();
    if (error) {  // refused: end the generation; the client gets the 400 and nothing else
      cancel_generation("constraint_refused");
      generation_over();
      send_error(error->status, *error, false);
      return;
    }
    for (auto& event : events)
      event();
  });
}

void http_session::on_accepted() {
  guarded([&] {
    if (compile_pending_) {
      held_events_.push_back([this] { on_accepted(); });
      return;
    }
    if (gen_active_)
      ensure_stream_open();
  });
}

void http_session::on_rejected(std::string why) {
  guarded([&] {
    if (compile_pending_) {
      held_events_.push_back([this, why = std::move(why)] { on_rejected(why); });
      return;
    }
    if (!gen_active_)
      return;
    fail_generation(503, why);
  });
}

void http_session::on_tokens(generation_tokens t) {
  guarded([&] {
    if (compile_pending_) {
      held_events_.push_back([this, t = std::move(t)] { on_tokens(t); });
      return;
    }
    if (!gen_active_ || !response_)
      return;
    const auto now = clock_type::now();
    const auto n = t.tokens.size();
    if (n == 0)
      return;
    server_->metrics.tokens->inc(static_cast<double>(n));
    if (first_token_) {
      first_token_ = false;
      server_->metrics.queued->dec();
      server_->metrics.observe_ttft(route_, seconds_between(admitted_at_, now));
      for (std::size_t i = 1; i < n; ++i)
        server_->metrics.observe_inter_token(route_, 0.0);
    } else {
      const double gap = seconds_between(last_token_at_, now) / static_cast<double>(n);
      for (std::size_t i = 0; i < n; ++i)
        server_->metrics.observe_inter_token(route_, gap);
    }
    last_token_at_ = now;
    ensure_stream_open();
    response_->push_logprobs(t.logprobs);
    const std::string frames = response_->push(t.tokens);
    if (response_->streaming())
      write_chunk(frames);
    if (response_->wants_cancel() && !cancel_sent_) {
      cancel_for_output_ = true;
      cancel_generation("stop_sequence");
    }
  });
}

void http_session::on_end(generation_end e) {
  guarded([&] {
    if (compile_pending_) {
      held_events_.push_back([this, e = std::move(e)] { on_end(e); });
      return;
    }
    if (!gen_active_ || !response_)
      return;
    server_->metrics.prompt_tokens->inc(static_cast<double>(e.prompt_tokens));
    server_->metrics.cached_tokens->inc(static_cast<double>(e.cached_tokens));
    switch (e.reason) {
      case finish_reason::error:
        fail_generation(500, e.error.empty() ? "The generation failed." : e.error);
        return;
      case finish_reason::cancelled:
        if (!cancel_for_output_) {
          if (shutdown_cancelled_)
            fail_generation(503, "The server is shutting down.");
          else
            fail_generation(500, "The request was cancelled by the server.");
          return;
        }
        break;
      case finish_reason::stop:
      case finish_reason::length:
        break;
    }
    complete_generation(e);
  });
}

void http_session::on_lost(std::string why) {
  guarded([&] {
    if (compile_pending_) {
      held_events_.push_back([this, why = std::move(why)] { on_lost(why); });
      return;
    }
    if (!gen_active_ || !response_)
      return;
    if (cancel_for_output_) {
      // The output had ended here: finish with what was received.
      generation_end e;
      e.reason = finish_reason::cancelled;
      e.completion_tokens = static_cast<std::uint32_t>(response_->tokens_pushed());
      complete_generation(e);
      return;
    }
    fail_generation(500, why);
  });
}

void http_session::complete_generation(const generation_end& end) {
  std::string body = response_->finish(end);
  server_->metrics.observe_duration(route_, seconds_between(admitted_at_, clock_type::now()));
  if (response_->streaming()) {
    ensure_stream_open();
    write_chunk(body);
    if (chunked_)
      write("0\r\n\r\n");
    server_->metrics.count(route_, 200);
    generation_over();
    finish_response(!keep_alive_);
  } else {
    generation_over();
    send(200, "application/json", std::move(body), false);
  }
}

void http_session::fail_generation(int status, const std::string& message) {
  auto e = make_error(protocol_, status, message,
                      status == 503 ? std::optional<std::string>("service_unavailable")
                                    : std::optional<std::string>("generation_failed"));
  if (response_ && response_->streaming() && stream_open_) {
    write_chunk(response_->error(e));
    if (chunked_)
      write("0\r\n\r\n");
    server_->metrics.count(route_, 200);
    generation_over();
    finish_response(!keep_alive_);
    return;
  }
  generation_over();
  header_list headers;
  if (status == 503)
    headers.emplace_back("Retry-After", std::to_string(server_->params.retry_after.count()));
  send_error(status, e, false, headers);
}

void http_session::generation_over() {
  if (!gen_active_)
    return;
  gen_active_ = false;
  compile_pending_ = false;
  held_events_.clear();
  if (constraint_id_) {
    server_->params.constraints->remove(constraint_id_);
    constraint_id_ = 0;
  }
  if (first_token_) {
    first_token_ = false;
    server_->metrics.queued->dec();
  }
  sink_ = nullptr;
  // The ticket (admission slot) is kept until the response is written (after_response).
  // Every caller holds a reference of its own, so `this` outlives the release of hold_.
  hold_.reset();
  response_.reset();
}

void http_session::cancel_generation(const char* reason) {
  if (!gen_active_ || cancel_sent_ || !sink_)
    return;
  cancel_sent_ = true;
  server_->metrics.count_cancel(reason);
  caf::anon_send(sink_, cancel_atom::value);
}

// -- session: writing -------------------------------------------------------------------------

void http_session::write(std::string bytes) {
  if (closed_ || bytes.empty())
    return;
  out_bytes_ += bytes.size();
  out_.push_back(std::move(bytes));
  if (out_bytes_ > max_backlog_bytes) {
    runtime::log::get("entrypoint")->warn("dropping a client that stopped reading");
    cancel_generation("write_stalled");
    close_now();
    return;
  }
  if (!writing_)
    do_write();
}

void http_session::write_chunk(std::string_view bytes) {
  if (bytes.empty())
    return;
  if (!chunked_) {
    write(std::string(bytes));
    return;
  }
  std::string chunk = hex(bytes.size());
  chunk += "\r\n";
  chunk += bytes;
  chunk += "\r\n";
  write(std::move(chunk));
}

void http_session::do_write() {
  writing_ = true;
  write_timer_.expires_after(server_->params.write_timeout);
  write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec)
      return;
    self->guarded([&] {
      if (self->closed_ || !self->writing_)
        return;
      self->cancel_generation("write_stalled");
      self->close_now();
    });
  });
  asio::async_write(socket_, asio::buffer(out_.front()),
                    [self = shared_from_this()](beast::error_code ec, std::size_t) {
                      self->guarded([&] { self->on_write(ec); });
                    });
}

void http_session::on_write(beast::error_code ec) {
  writing_ = false;
  write_timer_.cancel();
  if (closed_)
    return;
  if (ec) {
    close_now();  // the client is gone: cancels the generation in flight
    return;
  }
  out_bytes_ -= out_.front().size();
  out_.pop_front();
  if (!out_.empty()) {
    do_write();
    return;
  }
  if (response_done_)
    after_response();
}

void http_session::finish_response(bool close) {
  response_done_ = true;
  close_after_response_ = close_after_response_ || close;
  if (!writing_ && out_.empty())
    after_response();
}

void http_session::after_response() {
  response_done_ = false;
  ticket_.reset();  // the admission slot of a finished generation
  if (closed_)
    return;
  if (close_after_response_ || !keep_alive_) {
    linger_close();
    return;
  }
  if (watching_) {
    // The watch read must finish before the next request is read: at once when a pipelined
    // request is already buffered, else when the client sends (or the read timer fires).
    next_after_watch_ = true;
    if (buffer_.size() > 0) {
      beast::error_code ignored;
      socket_.cancel(ignored);
    } else {
      arm_read_timer(server_->params.read_timeout);
    }
    return;
  }
  read_request();
}

// -- session: watching the socket between requests --------------------------------------------

void http_session::watch() {
  if (closed_ || watching_)
    return;
  if (!closing_ && buffer_.size() >= max_pipelined_bytes)
    return;  // enough pipelined input: stop noticing a disconnect rather than buffer more
  watching_ = true;
  socket_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                            self->guarded([&] { self->on_watch(ec, n); });
                          });
}

void http_session::on_watch(beast::error_code ec, std::size_t n) {
  watching_ = false;
  if (closed_)
    return;
  if (closing_) {
    if (ec) {
      close_now();
      return;
    }
    buffer_.consume(buffer_.size());
    watch();
    return;
  }
  if (next_after_watch_) {
    next_after_watch_ = false;
    if (!ec)
      buffer_.commit(n);
    const bool cancelled_for_next = ec == asio::error::operation_aborted && !timed_out_;
    if (!ec || (cancelled_for_next && buffer_.size() > 0)) {
      read_timer_.cancel();
      read_request();
    } else {
      close_now();  // gone, or idle past the read timeout
    }
    return;
  }
  if (ec) {
    // The client closed or reset the connection: it is gone (its generation is cancelled).
    close_now();
    return;
  }
  buffer_.commit(n);
  if (gen_active_)
    watch();
}

void http_session::linger_close() {
  if (closed_ || closing_)
    return;
  closing_ = true;
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  read_timer_.expires_after(std::min<std::chrono::milliseconds>(linger_time,
                                                                server_->params.read_timeout));
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec)
      return;
    self->guarded([&] { self->close_now(); });
  });
  buffer_.consume(buffer_.size());
  watch();
}

} // namespace troupe::actors::http_detail
