// bench_serve: the cost of HTTP + actors per streamed token, beside a bare Beast floor.
//
// Two servers, each in a child process of this binary, are loaded in turn by the same client
// (this process: one Asio thread on loopback):
//
//   troupe  `troupe serve`'s path: the HTTP entrypoint (actors/entrypoint) in front of the real
//           serving graph (cluster::spawn_real_graph on examples/topologies/local-cpu.toml:
//           KV CHECK, balancers, a prefill and a decode instance, the KV hand-off), the
//           devices being instant script devices (ports/script_device.hpp, step_delay 0) that
//           answer a fixed text script instead of computing; CAF's default scheduler threads
//           and the entrypoint's 2 io threads, as `troupe serve` runs them.
//   floor   a bare Boost.Beast server with no actors, 2 io threads: it reads each request and
//           answers with the very bytes troupe sent for one stream (recorded from troupe at
//           start: the head, then every chunk, each its own write as troupe does).
//
// A run opens N keep-alive connections, then each sends K Chat Completions requests one after
// another (stream: true, max_tokens M), so that every configuration streams about --total
// tokens. Every stream is checked: status 200, `data: [DONE]`, finish_reason "length", usage
// completion_tokens M, and the text equal to the script's first M tokens; a stream that fails
// any of these is lost. The figure is the server process's CPU time (user + system, from
// /proc/PID/stat) over the run divided by the tokens streamed: µs of CPU per token, whatever
// the number of cores it used; also the wall time per token and the client-side gaps between
// chunks. Connection set-up is outside the run.
//
// Before each run the 1-minute load average is read; during it the CPU time that processes
// other than this one and its children used (from /proc/stat): a run during which they used
// more than --max-foreign of a core is printed but dropped, and rounds go on (up to
// --max-rounds) until every (server, N) has --rounds kept runs. The two servers alternate
// which goes first. The summary prints the min and median of the kept runs and troupe − floor.
//
// Usage: bench_serve [--streams 1,100,1000] [--tokens 128] [--total 128000] [--rounds 3]
//                    [--max-rounds 8] [--max-foreign 0.1]
#include "actors/entrypoint/entrypoint.hpp"
#include "actors/type_ids.hpp"
#include "cluster/real_graph.hpp"
#include "cluster/topology.hpp"
#include "ports/script_device.hpp"
#include "recipe/recipe.hpp"
#include "runtime/metrics.hpp"
#include "runtime/world.hpp"

#include <caf/send.hpp>

#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace troupe;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string model_name = "DeepSeek-V4-Flash";
const std::string tokenizer_file =
  std::string(TROUPE_SOURCE_DIR) + "/recipe/data/deepseek-v4/tokenizer.json.gz";
const std::string topology_file =
  std::string(TROUPE_SOURCE_DIR) + "/examples/topologies/local-cpu.toml";
// What the script device "generates", cycled: plain words, so every token is text.
const std::string script_text =
  " Actors share nothing and talk by messages; a request is one actor, and every token it"
  " streams crosses a few of them before it reaches the socket.";

void raise_nofile() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

std::vector<std::int32_t> script_tokens(const recipe::codec& codec) {
  std::vector<std::int32_t> out;
  for (auto id : codec.tokenize(script_text, recipe::encode_mode::raw))
    out.push_back(static_cast<std::int32_t>(id));
  return out;
}

/// Blocks until stdin closes (the parent ends a child by closing its pipe).
void wait_for_stdin_eof() {
  char c;
  while (read(0, &c, 1) > 0) {
  }
}

// -- the troupe server ----------------------------------------------------------------------

int serve_troupe(unsigned max_in_flight) {
  auto loaded = recipe::codec::load(tokenizer_file);
  if (auto* e = std::get_if<recipe::load_error>(&loaded)) {
    std::cerr << "bench_serve: " << e->message << "\n";
    return 1;
  }
  const auto& codec = std::get<recipe::codec>(loaded);
  auto topo = cluster::load_topology(topology_file);
  if (!topo.value) {
    std::cerr << "bench_serve: cannot load " << topology_file << "\n";
    return 1;
  }
  // The registry outlives the world, whose end waits for the actors that count into it.
  runtime::registry metrics;
  runtime::world w{runtime::world_options{runtime::world_mode::real, 0, 0, false,
                                          actors::register_actor_types}};
  cluster::real_graph_params gp;
  gp.device = [script = script_tokens(codec)](caf::actor_system& sys, cluster::pool_role,
                                              std::uint32_t, std::uint32_t) {
    ports::script_device_params d;
    d.script = script;
    d.at_end = ports::script_end::cycle;
    return ports::spawn_script_device(sys, std::move(d));
  };
  gp.block_bytes = 128 * 1024;
  gp.max_context = 65536;
  gp.max_batch = max_in_flight;
  auto graph = cluster::spawn_real_graph(w.system(), *topo.value, gp);
  actors::entrypoint_params ep;
  ep.models = {model_name};
  ep.max_in_flight = max_in_flight;
  ep.max_context_tokens = 65536;
  ep.codec = &codec;
  ep.service = graph.service;
  ep.metrics = &metrics;
  actors::entrypoint server(w.system(), ep);
  auto port = server.start();
  if (!port) {
    std::cerr << "bench_serve: " << w.system().render(port.error()) << "\n";
    return 1;
  }
  std::cout << "port " << *port << std::endl;
  wait_for_stdin_eof();
  server.stop(std::chrono::seconds(1));
  caf::anon_send_exit(graph.cluster, caf::exit_reason::user_shutdown);
  return 0;
}

// -- the floor: a bare Beast server sending recorded bytes -----------------------------------

/// A recorded response: the head, then the payload of every chunk, in order.
struct recording {
  std::string head;
  std::vector<std::string> chunks;
};

void save(const recording& r, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  auto put = [&](const std::string& s) {
    const std::uint64_t n = s.size();
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(s.data(), static_cast<std::streamsize>(n));
  };
  put(r.head);
  for (const auto& c : r.chunks)
    put(c);
}

recording load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<std::string> parts;
  std::uint64_t n = 0;
  while (f.read(reinterpret_cast<char*>(&n), sizeof n)) {
    std::string s(n, '\0');
    f.read(s.data(), static_cast<std::streamsize>(n));
    parts.push_back(std::move(s));
  }
  recording r;
  if (!parts.empty()) {
    r.head = parts.front();
    r.chunks.assign(parts.begin() + 1, parts.end());
  }
  return r;
}

std::string framed(const std::string& payload) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
  return size + payload + "\r\n";
}

/// One connection of the floor: read a request, write the recorded response piece by piece
/// (one write per chunk, as troupe does), again until the client closes.
class floor_session : public std::enable_shared_from_this<floor_session> {
public:
  floor_session(tcp::socket s, std::shared_ptr<const std::vector<std::string>> pieces)
    : socket_(std::move(s)), pieces_(std::move(pieces)) {}

  void read() {
    req_ = {};
    http::async_read(socket_, buffer_, req_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (!ec) {
                         self->next_ = 0;
                         self->write();
                       }
                     });
  }

private:
  void write() {
    if (next_ == pieces_->size()) {
      read();
      return;
    }
    asio::async_write(socket_, asio::buffer((*pieces_)[next_++]),
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        if (!ec)
                          self->write();
                      });
  }

  tcp::socket socket_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  std::shared_ptr<const std::vector<std::string>> pieces_;
  std::size_t next_ = 0;
};

int serve_floor(const std::string& recording_file) {
  const auto rec = load(recording_file);
  auto pieces = std::make_shared<std::vector<std::string>>();
  pieces->push_back(rec.head);
  for (const auto& c : rec.chunks)
    pieces->push_back(framed(c));
  pieces->push_back("0\r\n\r\n");
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::function<void()> accept = [&] {
    acceptor.async_accept(asio::make_strand(io), [&](beast::error_code ec, tcp::socket s) {
      if (!ec) {
        s.set_option(tcp::no_delay(true));
        std::make_shared<floor_session>(std::move(s), pieces)->read();
      }
      accept();
    });
  };
  accept();
  std::cout << "port " << acceptor.local_endpoint().port() << std::endl;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)  // as many io threads as the entrypoint's default
    threads.emplace_back([&] { io.run(); });
  wait_for_stdin_eof();
  io.stop();
  for (auto& t : threads)
    t.join();
  return 0;
}

// -- child processes -------------------------------------------------------------------------

struct child {
  pid_t pid = -1;
  int in = -1;  // its stdin: closing it ends the child
  std::uint16_t port = 0;
};

child spawn_child(const std::vector<std::string>& args) {
  int to[2], from[2];
  // Close-on-exec: a later child must not hold this one's stdin open.
  if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[0]);
    close(to[1]);
    close(from[0]);
    close(from[1]);
    std::vector<char*> argv;
    for (const auto& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  child c;
  c.pid = pid;
  c.in = to[1];
  std::string line;
  char ch;
  while (read(from[0], &ch, 1) == 1 && ch != '\n')
    line += ch;
  close(from[0]);
  if (line.rfind("port ", 0) != 0) {
    std::cerr << "bench_serve: a server did not start (" << args[2] << ")\n";
    std::exit(1);
  }
  c.port = static_cast<std::uint16_t>(std::stoi(line.substr(5)));
  return c;
}

void stop_child(child& c) {
  close(c.in);
  int status = 0;
  waitpid(c.pid, &status, 0);
}

/// CPU time (user + system, seconds) of process `pid`, all threads.
double process_cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i >= 14)
      ticks += std::stod(field);  // fields 14 and 15: utime, stime
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double self_cpu_seconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec)
         + static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

/// Busy CPU time of the whole machine (all cores), seconds, from /proc/stat.
double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  f >> cpu;
  double total = 0, idle = 0;
  for (int i = 0; i < 8; ++i) {
    double v = 0;
    f >> v;
    total += v;
    if (i == 3 || i == 4)  // idle, iowait
      idle += v;
  }
  return (total - idle) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double load_average() {
  double l[1] = {0};
  getloadavg(l, 1);
  return l[0];
}

// -- the client ------------------------------------------------------------------------------

struct stream_check {
  std::string expected_text;
  std::uint32_t tokens = 0;
};

struct run_result {
  std::uint64_t streams_ok = 0;
  std::uint64_t streams_lost = 0;
  std::uint64_t tokens = 0;
  std::string first_failure;
  std::vector<double> gaps_us;  // client-side gaps between chunks carrying text
  std::vector<double> ttft_us;  // request written → first chunk carrying text
};

/// One keep-alive connection running `requests` streams one after another.
class client_conn {
public:
  client_conn(asio::io_context& io, const stream_check& check, const std::string& request,
              run_result& out, recording* record)
    : socket_(io), check_(check), request_(request), out_(out), record_(record) {}

  tcp::socket& socket() { return socket_; }

  void start(std::uint32_t requests) {
    left_ = requests;
    send();
  }

private:
  void send() {
    if (left_ == 0) {
      beast::error_code ec;
      socket_.shutdown(tcp::socket::shutdown_both, ec);
      return;
    }
    --left_;
    reset();
    sent_at_ = clock_type::now();
    asio::async_write(socket_, asio::buffer(request_), [this](beast::error_code ec, std::size_t) {
      if (ec)
        return fail("write: " + ec.message());
      read();
    });
  }

  void read() {
    socket_.async_read_some(asio::buffer(buf_), [this](beast::error_code ec, std::size_t n) {
      if (ec)
        return fail("read: " + ec.message());
      in_.append(buf_.data(), n);
      if (parse())
        read();
    });
  }

  void reset() {
    in_.clear();
    pos_ = 0;
    head_done_ = false;
    sse_.clear();
    text_.clear();
    done_ = false;
    finish_.clear();
    completion_tokens_ = 0;
    first_ = true;
  }

  void fail(const std::string& why) {
    if (failed_)
      return;
    failed_ = true;
    out_.streams_lost += left_ + 1;
    if (out_.first_failure.empty())
      out_.first_failure = why;
    beast::error_code ec;
    socket_.close(ec);
  }

  /// Consumes what arrived; false when this connection stops reading (stream over or failed).
  bool parse() {
    if (!head_done_) {
      const auto end = in_.find("\r\n\r\n");
      if (end == std::string::npos)
        return true;
      const std::string head = in_.substr(0, end + 4);
      if (head.rfind("HTTP/1.1 200", 0) != 0
          || head.find("Transfer-Encoding: chunked") == std::string::npos) {
        fail("response: " + head.substr(0, head.find("\r\n")) + " " + in_.substr(end + 4, 200));
        return false;
      }
      if (record_)
        record_->head = head;
      head_done_ = true;
      pos_ = end + 4;
    }
    for (;;) {
      const auto eol = in_.find("\r\n", pos_);
      if (eol == std::string::npos)
        break;
      const std::size_t size = std::strtoul(in_.c_str() + pos_, nullptr, 16);
      if (size == 0) {
        if (in_.size() < eol + 4)
          break;
        return stream_over();
      }
      if (in_.size() < eol + 2 + size + 2)
        break;
      chunk(std::string_view(in_).substr(eol + 2, size));
      pos_ = eol + 2 + size + 2;
    }
    if (pos_ > 0) {
      in_.erase(0, pos_);
      pos_ = 0;
    }
    return true;
  }

  void chunk(std::string_view payload) {
    if (record_)
      record_->chunks.emplace_back(payload);
    sse_.append(payload);
    const auto before = text_.size();
    std::size_t start = 0;
    for (auto end = sse_.find("\n\n"); end != std::string::npos; end = sse_.find("\n\n", start)) {
      event(std::string_view(sse_).substr(start, end - start));
      start = end + 2;
    }
    sse_.erase(0, start);
    if (text_.size() > before) {
      const auto now = clock_type::now();
      const double us = std::chrono::duration<double, std::micro>(
                          now - (first_ ? sent_at_ : last_text_at_))
                          .count();
      (first_ ? out_.ttft_us : out_.gaps_us).push_back(us);
      first_ = false;
      last_text_at_ = now;
    }
  }

  void event(std::string_view e) {
    if (e.rfind("data: ", 0) != 0)
      return;
    e.remove_prefix(6);
    if (e == "[DONE]") {
      done_ = true;
      return;
    }
    const auto j = nlohmann::json::parse(e, nullptr, false);
    if (j.is_discarded())
      return;
    if (auto c = j.find("choices"); c != j.end() && !c->empty()) {
      const auto& choice = (*c)[0];
      if (auto d = choice.find("delta"); d != choice.end())
        for (const char* field : {"reasoning_content", "content"})
          if (auto t = d->find(field); t != d->end() && t->is_string())
            text_ += t->get<std::string>();
      if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string())
        finish_ = f->get<std::string>();
    }
    if (auto u = j.find("usage"); u != j.end() && u->is_object())
      completion_tokens_ = u->value("completion_tokens", 0u);
  }

  bool stream_over() {
    if (!done_ || finish_ != "length" || completion_tokens_ != check_.tokens
        || text_ != check_.expected_text) {
      fail("stream: done " + std::to_string(done_) + ", finish_reason '" + finish_
           + "', completion_tokens " + std::to_string(completion_tokens_) + ", text "
           + (text_ == check_.expected_text ? "as expected" : "'" + text_ + "'"));
      return false;
    }
    ++out_.streams_ok;
    out_.tokens += check_.tokens;
    send();
    return false;  // send() reads again
  }

  tcp::socket socket_;
  const stream_check& check_;
  const std::string& request_;
  run_result& out_;
  recording* record_;
  std::array<char, 65536> buf_{};
  std::string in_;
  std::size_t pos_ = 0;
  bool head_done_ = false;
  std::string sse_;
  std::string text_;
  bool done_ = false;
  std::string finish_;
  std::uint32_t completion_tokens_ = 0;
  bool first_ = true;
  bool failed_ = false;
  std::uint32_t left_ = 0;
  clock_type::time_point sent_at_, last_text_at_;
};

std::string chat_request(std::uint32_t tokens) {
  const std::string body = R"({"model":")" + model_name
                           + R"(","messages":[{"role":"user","content":"Tell me about actors."}],)"
                           + R"("stream":true,"max_tokens":)" + std::to_string(tokens) + "}";
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
         "Content-Type: application/json\r\nContent-Length: "
         + std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct measured {
  run_result r;
  double wall_s = 0;
  double server_cpu_s = 0;
  double client_cpu_s = 0;
  double foreign_cores = 0;
  double load = 0;
};

/// Opens `n` connections to `port`, then runs `per_conn` streams on each; measures the server
/// process `server` (and, to find foreign CPU use, every child in `children`).
measured run_load(std::uint16_t port, pid_t server, const std::vector<pid_t>& children,
                  std::size_t n, std::uint32_t per_conn, const stream_check& check,
                  const std::string& request, recording* record = nullptr) {
  measured m;
  asio::io_context io;
  std::vector<std::unique_ptr<client_conn>> conns;
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  for (std::size_t i = 0; i < n; ++i) {
    conns.push_back(std::make_unique<client_conn>(io, check, request, m.r, record));
    conns.back()->socket().connect(ep);
    conns.back()->socket().set_option(tcp::no_delay(true));
  }
  auto children_cpu = [&] {
    double s = 0;
    for (auto pid : children)
      s += process_cpu_seconds(pid);
    return s;
  };
  m.load = load_average();
  const double busy0 = machine_busy_seconds(), self0 = self_cpu_seconds();
  const double kids0 = children_cpu(), server0 = process_cpu_seconds(server);
  const auto t0 = clock_type::now();
  for (auto& c : conns)
    c->start(per_conn);
  io.run();
  m.wall_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  const double self1 = self_cpu_seconds();
  m.server_cpu_s = process_cpu_seconds(server) - server0;
  m.client_cpu_s = self1 - self0;
  const double own = (self1 - self0) + (children_cpu() - kids0);
  m.foreign_cores = std::max(0.0, machine_busy_seconds() - busy0 - own) / m.wall_s;
  return m;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(std::stoul(item));
  return out;
}

int usage(const std::string& why) {
  std::cerr << "bench_serve: " << why
            << "\nusage: bench_serve [--streams 1,100,1000] [--tokens 128] [--total 128000] "
               "[--rounds 3] [--max-rounds 8] [--max-foreign 0.1]\n";
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  raise_nofile();
  std::vector<std::size_t> streams = {1, 100, 1000};
  std::uint32_t tokens = 128;
  std::uint64_t total = 128000;
  std::size_t rounds = 3, max_rounds = 8;
  double max_foreign = 0.1;
  // The servers: this binary started by itself (spawn_child).
  if (argc == 5 && std::string(argv[1]) == "--server") {
    if (std::string(argv[2]) == "troupe")
      return serve_troupe(static_cast<unsigned>(std::stoul(argv[4])));
    return serve_floor(argv[4]);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc)
      return usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--streams")
      streams = parse_list(v);
    else if (a == "--tokens")
      tokens = static_cast<std::uint32_t>(std::stoul(v));
    else if (a == "--total")
      total = std::stoull(v);
    else if (a == "--rounds")
      rounds = std::stoul(v);
    else if (a == "--max-rounds")
      max_rounds = std::stoul(v);
    else if (a == "--max-foreign")
      max_foreign = std::stod(v);
    else
      return usage("unknown argument " + a);
  }
  if (streams.empty() || tokens == 0 || rounds == 0 || max_rounds < rounds)
    return usage("bad arguments");

  // What every stream must carry: the script's first `tokens` tokens, as text.
  auto loaded = recipe::codec::load(tokenizer_file);
  if (auto* e = std::get_if<recipe::load_error>(&loaded)) {
    std::cerr << "bench_serve: " << e->message << "\n";
    return 1;
  }
  const auto& codec = std::get<recipe::codec>(loaded);
  const auto script = script_tokens(codec);
  std::vector<recipe::token_id> ids;
  for (std::uint32_t k = 0; k < tokens; ++k)
    ids.push_back(static_cast<recipe::token_id>(script[k % script.size()]));
  const stream_check check{codec.detokenize(ids), tokens};
  const std::string request = chat_request(tokens);
  const std::size_t most = *std::max_element(streams.begin(), streams.end());

  const std::string in_flight = std::to_string(std::max<std::size_t>(most, 64));
  child troupe_server =
    spawn_child({"bench_serve", "--server", "troupe", "--max-in-flight", in_flight});
  // The floor's bytes: one stream recorded from troupe.
  recording rec;
  {
    auto m = run_load(troupe_server.port, troupe_server.pid, {troupe_server.pid}, 1, 1, check,
                      request, &rec);
    if (m.r.streams_ok != 1) {
      std::cerr << "bench_serve: the recording stream failed: " << m.r.first_failure << "\n";
      return 1;
    }
  }
  char tmpl[] = "/tmp/bench_serve_XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  save(rec, tmpl);
  child floor_server = spawn_child({"bench_serve", "--server", "floor", "--recording", tmpl});
  std::size_t bytes = rec.head.size() + 5;
  for (const auto& c : rec.chunks)
    bytes += framed(c).size();
  std::printf("each stream: %u tokens, %zu chunks, %zu bytes (head included); script device "
              "step_delay 0; %ld cores\n",
              tokens, rec.chunks.size(), bytes, sysconf(_SC_NPROCESSORS_ONLN));

  struct server_ref {
    const char* name;
    child* c;
  };
  const std::vector<server_ref> servers = {{"troupe", &troupe_server}, {"floor", &floor_server}};
  const std::vector<pid_t> kids = {troupe_server.pid, floor_server.pid};
  // Warm-up (not counted): 4 streams on each of up to 100 connections, per server.
  for (const auto& s : servers)
    run_load(s.c->port, s.c->pid, kids, std::min<std::size_t>(most, 100), 4, check, request);

  std::map<std::pair<std::string, std::size_t>, std::vector<measured>> kept;
  std::uint64_t lost = 0;
  std::vector<double> loads;
  for (std::size_t round = 0; round < max_rounds; ++round) {
    bool all = true;
    for (auto n : streams)
      for (const auto& s : servers)
        all = all && kept[{s.name, n}].size() >= rounds;
    if (all)
      break;
    for (auto n : streams) {
      const auto per_conn = static_cast<std::uint32_t>(
        std::max<std::uint64_t>(1, (total + n * tokens - 1) / (n * tokens)));
      for (std::size_t k = 0; k < servers.size(); ++k) {
        const auto& s = servers[(k + round) % servers.size()];
        auto& slot = kept[{s.name, n}];
        if (slot.size() >= rounds)
          continue;
        auto m = run_load(s.c->port, s.c->pid, kids, n, per_conn, check, request);
        loads.push_back(m.load);
        lost += m.r.streams_lost;
        const bool contended = m.foreign_cores > max_foreign;
        const double tok = static_cast<double>(std::max<std::uint64_t>(1, m.r.tokens));
        std::printf("round %zu %-6s N=%-4zu load %4.2f others %4.2f cores%s: %llu/%llu streams "
                    "(%llu tokens) in %.2f s, server CPU %.2f s = %.2f us/token (%.2f cores), "
                    "wall %.2f us/token, client CPU %.2f s; ttft p50 %.0f us, chunk gap p50 %.0f "
                    "p99 %.0f us%s%s\n",
                    round + 1, s.name, n, m.load, m.foreign_cores,
                    contended ? " DROPPED (contention)" : "",
                    static_cast<unsigned long long>(m.r.streams_ok),
                    static_cast<unsigned long long>(n * per_conn),
                    static_cast<unsigned long long>(m.r.tokens), m.wall_s, m.server_cpu_s,
                    m.server_cpu_s / tok * 1e6, m.server_cpu_s / m.wall_s, m.wall_s / tok * 1e6,
                    m.client_cpu_s, percentile(m.r.ttft_us, 0.5), percentile(m.r.gaps_us, 0.5),
                    percentile(m.r.gaps_us, 0.99), m.r.streams_lost ? " LOST: " : "",
                    m.r.first_failure.c_str());
        std::fflush(stdout);
        if (!contended)
          slot.push_back(std::move(m));
      }
    }
  }
  stop_child(troupe_server);
  stop_child(floor_server);
  std::remove(tmpl);

  std::printf("\nserver CPU us per streamed token (kept runs; min / median), %u tokens per "
              "stream; load average before runs %.2f..%.2f\n",
              tokens, *std::min_element(loads.begin(), loads.end()),
              *std::max_element(loads.begin(), loads.end()));
  int rc = lost ? 1 : 0;
  for (auto n : streams) {
    auto per_token = [&](const std::string& name) {
      std::vector<double> v;
      for (const auto& m : kept[{name, n}])
        v.push_back(m.server_cpu_s / static_cast<double>(m.r.tokens) * 1e6);
      return v;
    };
    const auto t = per_token("troupe"), f = per_token("floor");
    if (t.empty() || f.empty()) {
      std::printf("N=%-4zu no figure: every run was taken under contention\n", n);
      rc = 1;
      continue;
    }
    std::printf("N=%-4zu troupe %6.2f / %6.2f   floor %5.2f / %5.2f   troupe - floor %6.2f us "
                "(medians; %zu + %zu runs)\n",
                n, *std::min_element(t.begin(), t.end()), median(t),
                *std::min_element(f.begin(), f.end()), median(f), median(t) - median(f),
                t.size(), f.size());
  }
  std::printf("streams lost: %llu\n", static_cast<unsigned long long>(lost));
  return rc;
}
