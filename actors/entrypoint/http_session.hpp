// http_session: one client connection of the HTTP entrypoint, and the state its server shares.
//
// Internal to entrypoint.cpp (it exposes Boost.Asio types); entrypoint.hpp is the public API.
// A session reads one request at a time (pipelined requests wait in its buffer), answers it,
// and keeps the connection for the next one when the client wants that. Every handler runs on
// the session's strand, so the session's state needs no lock; the only things shared across
// threads live in `server_state` (admission count, flags, the session list) and are atomic or
// locked. A generation request is handed to a generation_sink actor, which posts the graph's
// messages back to the strand through `io_bridge` (which drops them once the io_context is
// gone, so an actor never touches a destroyed io_context).
#pragma once

#include "actors/entrypoint/api_response.hpp"
#include "actors/entrypoint/entrypoint.hpp"
#include "actors/entrypoint/entrypoint_metrics.hpp"
#include "actors/entrypoint/generation_sink.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors::http_detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

/// Posts work from actors to strands while the io_context exists; drops it afterwards.
class io_bridge {
public:
  /// Runs `f` on `ex` (a session's strand) unless close() was called. Never blocks beyond a
  /// short lock.
  void post(const asio::any_io_executor& ex, std::function<void()> f);
  /// No post reaches an executor after this returns.
  void close();

private:
  std::mutex mtx_;
  bool open_ = true;
};

class http_session;

/// What the server and its sessions share.
struct server_state : std::enable_shared_from_this<server_state> {
  caf::actor_system* system = nullptr;
  entrypoint_params params;
  std::vector<recipe::token_id> stop_ids;
  runtime::registry* registry = nullptr;
  entrypoint_metrics metrics;
  io_bridge bridge;
  std::int64_t started_unix = 0;
  std::uint64_t seed = 0;  // per server: response ids and default sampling seeds
  std::atomic<bool> stopping{false};
  std::atomic<bool> ready{false};
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<int> open_sessions{0};

  /// Takes an admission slot: a ticket that gives it back when its last copy is dropped, or
  /// null when max_in_flight are taken.
  std::shared_ptr<void> admit();
  std::size_t in_flight() const;
  /// Waits until no slot is taken or `deadline`; true when none is.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);

  /// After this, released tickets no longer update the metrics (a ticket may be released by a
  /// sink actor after the server, and the registry, are gone).
  void detach_metrics();

  void add_session(const std::shared_ptr<http_session>& s);
  std::vector<std::shared_ptr<http_session>> live_sessions();

private:
  void release();
  mutable std::mutex mtx_;
  std::condition_variable idle_;
  std::size_t in_flight_ = 0;
  bool metrics_detached_ = false;
  std::vector<std::weak_ptr<http_session>> sessions_;
};

class http_session final : public generation_listener,
                           public std::enable_shared_from_this<http_session> {
public:
  http_session(tcp::socket socket, std::shared_ptr<server_state> server);
  ~http_session() override;

  /// The strand every handler of this session runs on.
  const asio::any_io_executor& executor() const noexcept { return ex_; }

  // Called on the strand (post them there):
  /// Starts reading the first request.
  void start();
  /// The server stops: an idle connection closes now, a busy one after its response.
  void server_stopping();
  /// The grace is over: cancel the generation in flight (its client gets an error).
  void shutdown_cancel();
  /// Close the connection now.
  void force_close();

  // generation_listener (called on the strand by the sink's posts)
  void on_accepted() override;
  void on_rejected(std::string why) override;
  void on_tokens(generation_tokens tokens) override;
  void on_end(generation_end end) override;
  void on_lost(std::string why) override;
  /// The constraint table's verdict on the request's constraint (posted to the strand).
  void on_compiled(std::optional<recipe::api_error> error);

private:
  using request_t = http::request<http::string_body>;

  template <class F>
  void guarded(F&& f) noexcept;

  // reading
  void read_request();
  void on_header(beast::error_code ec);
  void on_body(beast::error_code ec);
  void on_read_error(beast::error_code ec);
  void arm_read_timer(std::chrono::milliseconds d);
  void handle(request_t& req);

  // routes
  void serve_models(const std::string& one);
  void start_generation(request_t& req, recipe::protocol p);
  bool authorized(const request_t& req) const;

  // responses
  void send(int status, std::string_view content_type, std::string body, bool close,
            const std::vector<std::pair<std::string, std::string>>& headers = {});
  void send_error(int status, const recipe::api_error& e, bool close,
                  const std::vector<std::pair<std::string, std::string>>& headers = {});

  // generation
  void ensure_stream_open();
  void complete_generation(const generation_end& end);
  void fail_generation(int status, const std::string& message);
  void generation_over();
  void cancel_generation(const char* reason);

  // writing
  void write(std::string bytes);
  void write_chunk(std::string_view bytes);
  void do_write();
  void on_write(beast::error_code ec);
  void finish_response(bool close);
  void after_response();

  // the socket while no request is read
  void watch();
  void on_watch(beast::error_code ec, std::size_t n);
  void linger_close();
  void close_now();

  std::shared_ptr<server_state> server_;
  tcp::socket socket_;
  asio::any_io_executor ex_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;

  // connection
  bool closed_ = false;
  bool closing_ = false;          // lingering close: output shut down, input drained
  bool reading_ = false;          // a request read is pending
  bool timed_out_ = false;        // the read timer fired
  bool watching_ = false;         // a watch read is pending
  bool next_after_watch_ = false; // read the next request when the watch completes
  bool stop_requested_ = false;   // the server stops: no keep-alive
  unsigned version_ = 11;
  bool keep_alive_ = true;
  std::string route_ = "other";
  std::optional<recipe::protocol> protocol_;  // error shape of the current route

  // writing
  std::deque<std::string> out_;
  std::size_t out_bytes_ = 0;
  bool writing_ = false;
  bool response_done_ = false;
  bool close_after_response_ = false;

  // the generation in flight
  bool gen_active_ = false;
  std::optional<api_response> response_;
  caf::actor sink_;
  std::shared_ptr<void> ticket_;
  std::shared_ptr<http_session> hold_;
  bool chunked_ = true;
  bool stream_open_ = false;
  bool cancel_sent_ = false;
  bool cancel_for_output_ = false;  // cancelled because the output ended (stop sequence)
  bool shutdown_cancelled_ = false;
  bool first_token_ = true;
  std::uint64_t constraint_id_ = 0;  // the request registered in params.constraints (0: none)
  bool compile_pending_ = false;     // its verdict has not come yet: nothing reaches the client
  // The generation's events meanwhile, run after a good verdict (dropped after a refusal).
  std::vector<std::function<void()>> held_events_;
  std::chrono::steady_clock::time_point admitted_at_{};
  std::chrono::steady_clock::time_point last_token_at_{};
};

} // namespace troupe::actors::http_detail
