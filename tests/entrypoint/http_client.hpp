// http_client: a small loopback HTTP/1.1 client for the entrypoint tests (Boost.Beast).
//
// Tests must talk to the server the way clients do, including the ways bad clients do: raw
// bytes, half requests, disconnecting mid-stream. Every operation has a timeout (the client
// runs its own io_context for a bounded time), so no test can hang on a server bug.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::test {

struct http_reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // de-chunked
  bool keep_alive = true;

  std::string header(const std::string& lower_name) const;
};

/// One SSE event: its `event:` name (empty when none) and its `data:` payload.
struct sse_event {
  std::string event;
  std::string data;
};

/// Splits an SSE body into events.
std::vector<sse_event> parse_sse(const std::string& body);

class http_client {
public:
  explicit http_client(std::uint16_t port);
  ~http_client();
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;

  /// Connects to 127.0.0.1:port; false when refused or timed out.
  bool connect(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// Sends `bytes` as they are; false on error or timeout.
  bool send_raw(const std::string& bytes,
                std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// Sends a request with Content-Length (and Host, Content-Type for a body).
  bool send_request(const std::string& method, const std::string& target,
                    const std::string& body = {},
                    const std::map<std::string, std::string>& headers = {});
  /// Reads one response; nullopt on timeout, error, or a close before a response.
  std::optional<http_reply>
  read_reply(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  /// Reads raw bytes until `marker` appears (returns all read) or the timeout / close.
  std::string read_until(const std::string& marker,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10));
  /// True when the server closes the connection within `timeout` (bytes before the close are
  /// discarded).
  bool closed_by_server(std::chrono::milliseconds timeout);
  /// Closes the connection (as a client that leaves).
  void close();

private:
  struct impl;
  impl* impl_;
};

/// Connects, sends one request, reads the reply; nullopt when any step fails.
std::optional<http_reply> http_call(std::uint16_t port, const std::string& method,
                                    const std::string& target, const std::string& body = {},
                                    const std::map<std::string, std::string>& headers = {});

} // namespace troupe::test
