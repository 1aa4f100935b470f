// A minimal HTTP/1.0 GET over a loopback TCP socket, for tests and benchmarks that
// read a MetricsServer (or a Prometheus server's API): the status code and body.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <optional>
#include <string>

namespace inferq_test {

struct HttpResponse {
  int status = 0;
  std::string headers;  // the status line and header lines
  std::string body;
};

// A TCP socket connected to 127.0.0.1:<port>, its reads timing out after 10 s; -1
// when it cannot be made or connected. The caller closes it.
inline int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET http://127.0.0.1:<port><target>; nullopt when the connection or the response
// fails (10 s timeout per read).
inline std::optional<HttpResponse> HttpGet(int port, const std::string& target) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return std::nullopt;
  std::string raw;
  {
    const std::string req = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      for (;;) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        raw.append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  ::close(fd);
  const std::size_t end = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 && raw.compare(0, 9, "HTTP/1.0 ") != 0) return std::nullopt;
  if (end == std::string::npos) return std::nullopt;
  HttpResponse r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

}  // namespace inferq_test
