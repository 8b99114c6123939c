// An output stream that reaches its file descriptor one whole line per write(2).
//
// `troupe launch` and its `troupe node` and `troupe agent` children share one stderr (a pipe
// when a test or a process manager reads it). std::cerr is unbuffered, so `err << a << b`
// is several writes, and two processes writing at once interleave mid-line ("...10730 KiB),
// troupe node[decode/1]: drained..."), which breaks anyone parsing the log. A write of at
// most PIPE_BUF bytes to a pipe is atomic, so writing each complete line in one call keeps
// lines whole across processes. Safe to use from several threads of one process.
#pragma once

#include <mutex>
#include <ostream>
#include <streambuf>
#include <string>

namespace troupe::runtime {

class line_buf : public std::streambuf {
public:
  explicit line_buf(int fd) : fd_(fd) {}
  ~line_buf() override;

protected:
  int_type overflow(int_type ch) override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;
  // Writes what is buffered (whole lines only; a partial line waits for its newline, except at
  // destruction).
  int sync() override;

private:
  void write_lines_locked();
  void write_all(const char* p, std::size_t n);

  int fd_;
  std::mutex mu_;
  std::string pending_;
};

/// An ostream over `line_buf`: each line it is given reaches `fd` in one write.
class line_ostream : public std::ostream {
public:
  explicit line_ostream(int fd) : std::ostream(&buf_), buf_(fd) {}

private:
  line_buf buf_;
};

} // namespace troupe::runtime
