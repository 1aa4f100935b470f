// A small HTTP/1.1 server on a free loopback port, for tests of clients that POST
// (the OTLP exporter): it keeps every request (method, target, headers, body) and
// answers each with the next status of a script (200 once the script is used up).
// A gate can hold the answers, so that a test controls when a request completes.
// Keep-alive connections are served one at a time, on one thread; the destructor
// stops it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace inferq_test {

struct HttpRequest {
  std::string method;
  std::string target;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  std::string body;
  std::optional<std::string> Header(const std::string& lower_name) const {
    for (const auto& [k, v] : headers) {
      if (k == lower_name) return v;
    }
    return std::nullopt;
  }
};

class HttpReceiver {
 public:
  HttpReceiver() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;  // a free port
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 16) != 0) {
      std::abort();
    }
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~HttpReceiver() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      gate_open_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ::close(listen_fd_);
  }

  int port() const { return port_; }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  // The statuses of the next answers, in order (then 200), and the body they carry.
  void Script(std::deque<int> statuses, std::string body = "{}") {
    std::lock_guard lock(mu_);
    script_ = std::move(statuses);
    answer_body_ = std::move(body);
  }
  // false: requests are counted and their bodies' bytes summed, not kept (a
  // benchmark's long run).
  void KeepRequests(bool keep) {
    std::lock_guard lock(mu_);
    keep_ = keep;
  }
  std::size_t request_count() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  std::uint64_t body_bytes() const {
    std::lock_guard lock(mu_);
    return body_bytes_;
  }
  // Closed: a request is read and kept, but not answered until Open().
  void Close() {
    std::lock_guard lock(mu_);
    gate_open_ = false;
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      gate_open_ = true;
    }
    cv_.notify_all();
  }
  std::vector<HttpRequest> requests() const {
    std::lock_guard lock(mu_);
    return requests_;
  }
  // Waits (real time, at most 30 s) until `n` requests arrived; whether they did.
  bool WaitForRequests(std::size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return count_ >= n; });
  }

 private:
  void Serve() {
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (stop_) return;
      }
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ServeConnection(fd);
      ::close(fd);
    }
  }

  // Reads requests off one connection until the peer closes it or the server stops.
  void ServeConnection(int fd) {
    std::string buf;
    for (;;) {
      std::size_t head_end;
      while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
        if (!ReadMore(fd, buf)) return;
      }
      HttpRequest req;
      const std::string head = buf.substr(0, head_end);
      std::size_t line_end = head.find("\r\n");
      const std::string first = head.substr(0, line_end);
      const std::size_t sp1 = first.find(' ');
      const std::size_t sp2 = first.find(' ', sp1 + 1);
      req.method = first.substr(0, sp1);
      req.target = first.substr(sp1 + 1, sp2 - sp1 - 1);
      std::size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
      std::size_t length = 0;
      while (pos < head.size()) {
        std::size_t e = head.find("\r\n", pos);
        if (e == std::string::npos) e = head.size();
        const std::string line = head.substr(pos, e - pos);
        const std::size_t colon = line.find(':');
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        if (name == "content-length") length = std::strtoull(value.c_str(), nullptr, 10);
        req.headers.emplace_back(std::move(name), std::move(value));
        pos = e + 2;
      }
      buf.erase(0, head_end + 4);
      while (buf.size() < length) {
        if (!ReadMore(fd, buf)) return;
      }
      req.body = buf.substr(0, length);
      buf.erase(0, length);
      int status = 200;
      std::string body;
      {
        std::unique_lock lock(mu_);
        ++count_;
        body_bytes_ += req.body.size();
        if (keep_) requests_.push_back(std::move(req));
        cv_.notify_all();
        cv_.wait(lock, [&] { return gate_open_; });
        if (!script_.empty()) {
          status = script_.front();
          script_.pop_front();
        }
        body = answer_body_;
      }
      const std::string answer = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n"
                                 "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
      if (::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(answer.size())) return;
    }
  }

  bool ReadMore(int fd, std::string& buf) {
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (stop_) return false;
      }
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, 50);
      if (r == 0) continue;
      if (r < 0) return false;
      char chunk[16384];
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      buf.append(chunk, static_cast<std::size_t>(n));
      return true;
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool gate_open_ = true;
  std::deque<int> script_;
  std::string answer_body_ = "{}";
  std::vector<HttpRequest> requests_;
  bool keep_ = true;
  std::size_t count_ = 0;
  std::uint64_t body_bytes_ = 0;
  std::thread thread_;
};

}  // namespace inferq_test
