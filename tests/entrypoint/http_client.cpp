// The tests' loopback HTTP client (see http_client.hpp).
#include "http_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include <algorithm>
#include <cctype>

namespace troupe::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

std::string http_reply::header(const std::string& lower_name) const {
  auto i = headers.find(lower_name);
  return i == headers.end() ? std::string() : i->second;
}

std::vector<sse_event> parse_sse(const std::string& body) {
  std::vector<sse_event> out;
  std::size_t pos = 0;
  while (pos < body.size()) {
    auto end = body.find("\n\n", pos);
    if (end == std::string::npos)
      end = body.size();
    const std::string block = body.substr(pos, end - pos);
    pos = end + 2;
    sse_event e;
    std::size_t line_start = 0;
    while (line_start < block.size()) {
      auto nl = block.find('\n', line_start);
      if (nl == std::string::npos)
        nl = block.size();
      const std::string line = block.substr(line_start, nl - line_start);
      line_start = nl + 1;
      if (line.rfind("event: ", 0) == 0)
        e.event = line.substr(7);
      else if (line.rfind("data: ", 0) == 0)
        e.data += line.substr(6);
    }
    if (!e.event.empty() || !e.data.empty())
      out.push_back(std::move(e));
  }
  return out;
}

struct http_client::impl {
  std::uint16_t port;
  asio::io_context ioc;
  tcp::socket socket{ioc};
  beast::flat_buffer buffer;

  // Runs the io_context until `done` or the timeout; on timeout cancels the pending ops.
  bool run(bool& done, std::chrono::milliseconds timeout) {
    ioc.restart();
    ioc.run_for(timeout);
    if (!done) {
      boost::system::error_code ignored;
      socket.cancel(ignored);
      ioc.restart();
      ioc.run_for(std::chrono::milliseconds(200));
    }
    return done;
  }
};

http_client::http_client(std::uint16_t port) : impl_(new impl{port}) {
}

http_client::~http_client() {
  close();
  delete impl_;
}

bool http_client::connect(std::chrono::milliseconds timeout) {
  bool done = false;
  boost::system::error_code result = asio::error::timed_out;
  impl_->socket.async_connect(
    tcp::endpoint(asio::ip::make_address("127.0.0.1"), impl_->port),
    [&](boost::system::error_code ec) {
      result = ec;
      done = true;
    });
  impl_->run(done, timeout);
  return done && !result;
}

bool http_client::send_raw(const std::string& bytes, std::chrono::milliseconds timeout) {
  bool done = false;
  boost::system::error_code result = asio::error::timed_out;
  asio::async_write(impl_->socket, asio::buffer(bytes),
                    [&](boost::system::error_code ec, std::size_t) {
                      result = ec;
                      done = true;
                    });
  impl_->run(done, timeout);
  return done && !result;
}

bool http_client::send_request(const std::string& method, const std::string& target,
                               const std::string& body,
                               const std::map<std::string, std::string>& headers) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_type = false;
  for (const auto& [k, v] : headers) {
    std::string lower = k;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    has_type = has_type || lower == "content-type";
    req += k + ": " + v + "\r\n";
  }
  if (!body.empty() && !has_type)
    req += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST")
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n";
  req += body;
  return send_raw(req);
}

std::optional<http_reply> http_client::read_reply(std::chrono::milliseconds timeout) {
  http::response_parser<http::string_body> parser;
  parser.body_limit(256u << 20);
  bool done = false;
  boost::system::error_code result = asio::error::timed_out;
  http::async_read(impl_->socket, impl_->buffer, parser,
                   [&](boost::system::error_code ec, std::size_t) {
                     result = ec;
                     done = true;
                   });
  impl_->run(done, timeout);
  if (!done || result)
    return std::nullopt;
  auto res = parser.release();
  http_reply r;
  r.status = static_cast<int>(res.result_int());
  for (const auto& f : res) {
    std::string name(f.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    r.headers[name] = std::string(f.value());
  }
  r.body = std::move(res.body());
  r.keep_alive = res.keep_alive();
  return r;
}

std::string http_client::read_until(const std::string& marker, std::chrono::milliseconds timeout) {
  std::string got(static_cast<const char*>(impl_->buffer.data().data()), impl_->buffer.size());
  impl_->buffer.consume(impl_->buffer.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char chunk[4096];
  while (got.find(marker) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      break;
    bool done = false;
    boost::system::error_code result = asio::error::timed_out;
    std::size_t n = 0;
    impl_->socket.async_read_some(asio::buffer(chunk),
                                  [&](boost::system::error_code ec, std::size_t k) {
                                    result = ec;
                                    n = k;
                                    done = true;
                                  });
    impl_->run(done, left);
    if (!done || result)
      break;
    got.append(chunk, n);
  }
  return got;
}

bool http_client::closed_by_server(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char chunk[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return false;
    bool done = false;
    boost::system::error_code result = asio::error::timed_out;
    impl_->socket.async_read_some(asio::buffer(chunk),
                                  [&](boost::system::error_code ec, std::size_t) {
                                    result = ec;
                                    done = true;
                                  });
    impl_->run(done, left);
    if (!done)
      return false;
    if (result)
      return result == asio::error::eof || result == asio::error::connection_reset;
  }
}

void http_client::close() {
  boost::system::error_code ignored;
  if (impl_->socket.is_open()) {
    impl_->socket.shutdown(tcp::socket::shutdown_both, ignored);
    impl_->socket.close(ignored);
  }
}

std::optional<http_reply> http_call(std::uint16_t port, const std::string& method,
                                    const std::string& target, const std::string& body,
                                    const std::map<std::string, std::string>& headers) {
  http_client c(port);
  if (!c.connect() || !c.send_request(method, target, body, headers))
    return std::nullopt;
  return c.read_reply();
}

} // namespace troupe::test
