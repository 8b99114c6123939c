#include "runtime/line_stream.hpp"

#include <cerrno>
#include <unistd.h>

namespace troupe::runtime {

line_buf::~line_buf() {
  std::lock_guard<std::mutex> guard{mu_};
  write_lines_locked();
  if (!pending_.empty())
    write_all(pending_.data(), pending_.size());
}

line_buf::int_type line_buf::overflow(int_type ch) {
  if (traits_type::eq_int_type(ch, traits_type::eof()))
    return traits_type::not_eof(ch);
  std::lock_guard<std::mutex> guard{mu_};
  pending_.push_back(traits_type::to_char_type(ch));
  if (ch == '\n')
    write_lines_locked();
  return ch;
}

std::streamsize line_buf::xsputn(const char* s, std::streamsize n) {
  std::lock_guard<std::mutex> guard{mu_};
  pending_.append(s, static_cast<std::size_t>(n));
  write_lines_locked();
  return n;
}

int line_buf::sync() {
  std::lock_guard<std::mutex> guard{mu_};
  write_lines_locked();
  return 0;
}

void line_buf::write_lines_locked() {
  auto end = pending_.rfind('\n');
  if (end == std::string::npos)
    return;
  write_all(pending_.data(), end + 1);
  pending_.erase(0, end + 1);
}

void line_buf::write_all(const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return; // a closed stderr: nothing more can be said
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

} // namespace troupe::runtime
