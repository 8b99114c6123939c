// The HTTP entrypoint: listener, io threads, admission and graceful stop (see entrypoint.hpp).
#include "actors/entrypoint/entrypoint.hpp"

#include "actors/entrypoint/http_session.hpp"
#include "runtime/log.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <caf/sec.hpp>

#include <random>
#include <thread>

namespace troupe::actors {

using namespace http_detail;

struct entrypoint::impl {
  caf::actor_system& sys;
  std::shared_ptr<server_state> state;
  std::unique_ptr<runtime::registry> own_registry;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  asio::strand<asio::io_context::executor_type> accept_strand;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  std::vector<std::thread> threads;
  std::uint16_t port = 0;
  std::mutex lifecycle;  // start / stop
  bool started = false;
  bool stopped = false;

  impl(caf::actor_system& s, entrypoint_params p)
    : sys(s),
      state(std::make_shared<server_state>()),
      accept_strand(asio::make_strand(ioc)),
      acceptor(accept_strand),
      accept_retry(accept_strand) {
    state->system = &sys;
    state->params = std::move(p);
  }

  void accept();
  void run_thread();
};

void entrypoint::impl::accept() {
  acceptor.async_accept(
    asio::make_strand(ioc), [this](boost::system::error_code ec,
                                   asio::basic_stream_socket<tcp, asio::strand<
                                     asio::io_context::executor_type>> socket) {
      try {
        if (ec == asio::error::operation_aborted || !acceptor.is_open())
          return;
        if (ec) {
          // Out of descriptors and the like: try again shortly instead of spinning.
          runtime::log::get("entrypoint")->warn("accept failed: {}", ec.message());
          accept_retry.expires_after(std::chrono::milliseconds(50));
          accept_retry.async_wait([this](boost::system::error_code e) {
            if (!e)
              accept();
          });
          return;
        }
        if (state->stopping) {
          boost::system::error_code ignored;
          socket.close(ignored);
          return;
        }
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto session = std::make_shared<http_session>(tcp::socket(std::move(socket)), state);
        state->add_session(session);
        asio::post(session->executor(), [session] { session->start(); });
        accept();
      } catch (const std::exception& e) {
        runtime::log::get("entrypoint")->error("accept handler failed: {}", e.what());
        if (acceptor.is_open())
          accept();
      }
    });
}

void entrypoint::impl::run_thread() {
  // Handlers catch their own exceptions; this loop keeps the thread serving if one escapes.
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {
      runtime::log::get("entrypoint")->error("io thread: {}", e.what());
    } catch (...) {
      runtime::log::get("entrypoint")->error("io thread: unknown exception");
    }
  }
}

entrypoint::entrypoint(caf::actor_system& sys, entrypoint_params params)
  : impl_(std::make_unique<impl>(sys, std::move(params))) {
}

entrypoint::~entrypoint() {
  stop(std::chrono::milliseconds(0));
}

caf::expected<std::uint16_t> entrypoint::start() {
  auto& d = *impl_;
  std::lock_guard guard{d.lifecycle};
  auto fail = [](std::string what) {
    return caf::make_error(caf::sec::runtime_error, "entrypoint: " + std::move(what));
  };
  if (d.started)
    return fail("already started");
  auto& p = d.state->params;
  if (p.codec == nullptr)
    return fail("no recipe codec");
  if (!p.service)
    return fail("no generation service");
  if (p.io_threads == 0)
    return fail("io_threads must be at least 1");
  if (p.max_in_flight == 0)
    return fail("max_in_flight must be at least 1");
  if (p.max_context_tokens < 2)
    return fail("max_context_tokens must be at least 2");
  if (p.metrics == nullptr)
    d.own_registry = std::make_unique<runtime::registry>();
  d.state->registry = p.metrics ? p.metrics : d.own_registry.get();
  auto metrics = entrypoint_metrics::register_in(*d.state->registry);
  if (!metrics)
    return fail("metrics: " + d.sys.render(metrics.error()));
  d.state->metrics = *metrics;
  d.state->stop_ids = p.codec->stop_ids();

  boost::system::error_code ec;
  const auto address = asio::ip::make_address(p.address, ec);
  if (ec)
    return fail("invalid listen address '" + p.address + "': " + ec.message());
  const tcp::endpoint endpoint{address, p.port};
  const std::string where = p.address + ":" + std::to_string(p.port);
  d.acceptor.open(endpoint.protocol(), ec);
  if (!ec)
    d.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec)
    d.acceptor.bind(endpoint, ec);
  if (!ec)
    d.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    boost::system::error_code ignored;
    d.acceptor.close(ignored);
    return fail("cannot listen on " + where + ": " + ec.message());
  }
  d.port = d.acceptor.local_endpoint(ec).port();
  d.started = true;
  std::random_device rd;
  d.state->seed = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  d.state->started_unix = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  d.state->ready = true;
  d.work.emplace(d.ioc.get_executor());
  asio::post(d.accept_strand, [&d] { d.accept(); });
  for (unsigned i = 0; i < p.io_threads; ++i)
    d.threads.emplace_back([&d] { d.run_thread(); });
  return d.port;
}

void entrypoint::stop(std::chrono::milliseconds grace) {
  auto& d = *impl_;
  std::lock_guard guard{d.lifecycle};
  if (!d.started || d.stopped)
    return;
  d.stopped = true;
  auto& st = *d.state;
  st.stopping = true;
  st.ready = false;
  using clock = std::chrono::steady_clock;

  // 1. No new connections; idle ones close, busy ones close after their response.
  asio::post(d.accept_strand, [&d] {
    boost::system::error_code ignored;
    d.acceptor.close(ignored);
    d.accept_retry.cancel();
  });
  for (auto& s : st.live_sessions())
    asio::post(s->executor(), [s] { s->server_stopping(); });

  // 2. Requests in flight get the grace to finish (their responses written).
  if (!st.wait_idle(clock::now() + grace)) {
    // 3. Then they are cancelled; their clients get an error response or event.
    for (auto& s : st.live_sessions())
      asio::post(s->executor(), [s] { s->shutdown_cancel(); });
    st.wait_idle(clock::now() + st.params.cancel_timeout + std::chrono::milliseconds(500));
  }

  // 4. Every connection closes; the io threads end once their handlers are done.
  for (auto& s : st.live_sessions())
    asio::post(s->executor(), [s] { s->force_close(); });
  const auto deadline = clock::now() + std::chrono::seconds(2);
  while (st.open_sessions.load() > 0 && clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  d.work.reset();
  d.ioc.stop();
  for (auto& t : d.threads)
    if (t.joinable())
      t.join();
  d.threads.clear();
  // Sessions whose close did not run before the threads ended close here (no thread runs
  // their strand any more).
  for (auto& s : st.live_sessions())
    s->force_close();
  // No actor posts into the io_context from now on (it is destroyed with this object), and a
  // sink that ends later no longer touches the registry.
  st.bridge.close();
  st.detach_metrics();
}

std::uint16_t entrypoint::port() const noexcept {
  return impl_->port;
}

void entrypoint::set_ready(bool ready) noexcept {
  impl_->state->ready = ready && impl_->started && !impl_->state->stopping;
}

bool entrypoint::ready() const noexcept {
  return impl_->state->ready && !impl_->state->stopping;
}

std::size_t entrypoint::in_flight() const noexcept {
  return impl_->state->in_flight();
}

runtime::registry& entrypoint::metrics() noexcept {
  auto& d = *impl_;
  if (d.state->registry)
    return *d.state->registry;
  if (!d.own_registry)
    d.own_registry = std::make_unique<runtime::registry>();
  return *d.own_registry;
}

} // namespace troupe::actors
