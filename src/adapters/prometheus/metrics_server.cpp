// MetricsServer: a small HTTP/1.1 server for scrapes. One I/O thread owns every
// connection and never blocks on one (poll(2) over the listening socket, a wake-up
// eventfd and the connections); worker threads collect and serialise. The header's
// "Connections" gives the model, its limits and defaults.
//
// A connection's states, on the I/O thread only:
//   kReading     its request head is coming; deadline: accept + header_timeout (408)
//   kCollecting  a worker is building its response; no deadline (the collectors run)
//   kWriting     its response is going out; deadline: ready + response_timeout
//   kDraining    response sent and write side shut: read and discarded until the
//                client closes, for at most kLinger, then closed
// Lock order: mu_, jobs_mu_ and done_mu_ are never held together.
#include "inferq/adapters/prometheus/metrics_server.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "prometheus/summary.h"
#include "prometheus/text_serializer.h"

namespace inferq::prometheus {
namespace {

using Clock = std::chrono::steady_clock;

// The request line and headers together, in bytes: 431 beyond.
constexpr std::size_t kMaxHeadBytes = 8192;
// After its response a connection is read and discarded until the client closes
// it, for at most this long, and only then closed: close(2) with unread bytes sends
// a reset, which can destroy the response before the client has read it (the
// "lingering close" of RFC 9112 section 9.6).
constexpr auto kLinger = std::chrono::seconds(1);
// How long accepting pauses after accept(2) fails for want of descriptors (EMFILE),
// so that a listening socket that stays readable does not spin the I/O thread.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr std::string_view kExpositionType = "text/plain; version=0.0.4; charset=utf-8";

std::string Response(int code, std::string_view reason, std::string_view content_type,
                     std::string_view body, bool head_only, std::string_view extra_headers = "") {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) + "\r\n";
  r += "Content-Type: " + std::string(content_type) + "\r\n";
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += extra_headers;
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

std::string ErrorResponse(int code, std::string_view reason, std::string_view extra_headers = "") {
  return Response(code, reason, "text/plain; charset=utf-8", std::string(reason) + "\n", false,
                  extra_headers);
}

}  // namespace

class MetricsServer::Impl {
 public:
  explicit Impl(MetricsServerOptions options)
      : options_(std::move(options)),
        registry_(std::make_shared<::prometheus::Registry>()),
        scrapes_(::prometheus::BuildCounter()
                     .Name("exposer_scrapes_total")
                     .Help("Number of times metrics were scraped")
                     .Register(*registry_)
                     .Add({})),
        bytes_(::prometheus::BuildCounter()
                   .Name("exposer_transferred_bytes_total")
                   .Help("Transferred bytes to metrics services")
                   .Register(*registry_)
                   .Add({})),
        latencies_(::prometheus::BuildSummary()
                       .Name("exposer_request_latencies")
                       .Help("Latencies of serving scrape requests, in microseconds")
                       .Register(*registry_)
                       .Add({}, ::prometheus::Summary::Quantiles{{0.5, 0.05}, {0.9, 0.01}, {0.99, 0.001}})) {}

  ~Impl() {
    {
      std::lock_guard l(jobs_mu_);
      stop_.store(true);
    }
    jobs_cv_.notify_all();
    Wake();
    if (io_.joinable()) io_.join();
    for (std::thread& t : workers_) t.join();
    for (auto& [id, c] : conns_) ::close(c.fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  absl::Status Listen() {
    const MetricsServerOptions& o = options_;
    const std::string listen = o.address + ":" + std::to_string(o.port);
    auto fail = [&](const char* call) {
      return absl::UnavailableError("metrics server cannot listen on " + listen + ": " + call + ": " +
                                    std::strerror(errno));
    };
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return fail("socket");
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // past TIME_WAIT only
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(o.port));
    ::inet_pton(AF_INET, o.address.c_str(), &a.sin_addr);  // checked by Start
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return fail("bind");
    if (::listen(listen_fd_, 128) != 0) return fail("listen");
    socklen_t len = sizeof a;
    if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return fail("getsockname");
    port_ = ntohs(a.sin_port);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return fail("eventfd");
    io_ = std::thread([this] { IoLoop(); });
    for (int i = 0; i < o.threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
    return absl::OkStatus();
  }

  void Add(std::shared_ptr<::prometheus::Collectable> collectable) {
    std::lock_guard lock(mu_);
    collectables_.push_back(std::move(collectable));
  }

  int port() const { return port_; }
  const MetricsServerOptions& options() const { return options_; }

 private:
  enum class State { kReading, kCollecting, kWriting, kDraining };
  struct Conn {
    int fd = -1;
    State state = State::kReading;
    Clock::time_point accepted;
    Clock::time_point deadline;  // of kReading, kWriting and kDraining
    std::string in;              // kReading: the head so far
    std::string out;             // kWriting: the response
    std::size_t sent = 0;
  };
  struct Job {
    std::uint64_t id = 0;
    bool head_only = false;
  };
  struct Done {
    std::uint64_t id = 0;
    std::string response;
  };

  void Wake() {
    const std::uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof one);
  }

  // --- The I/O thread -----------------------------------------------------------

  void IoLoop() {
    std::vector<pollfd> pfds;
    std::vector<std::uint64_t> ids;
    while (!stop_.load()) {
      TakeDone();
      const Clock::time_point now = Clock::now();
      Expire(now);
      pfds.clear();
      ids.clear();
      pfds.push_back({wake_fd_, POLLIN, 0});
      const bool accepting = now >= accept_paused_until_ &&
                             (conns_.size() < static_cast<std::size_t>(options_.max_connections) ||
                              Evictable() != conns_.end());
      if (accepting) pfds.push_back({listen_fd_, POLLIN, 0});
      Clock::time_point next = Clock::time_point::max();
      if (!accepting && now < accept_paused_until_) next = accept_paused_until_;
      for (auto& [id, c] : conns_) {
        if (c.state == State::kCollecting) continue;
        pfds.push_back({c.fd, static_cast<short>(c.state == State::kWriting ? POLLOUT : POLLIN), 0});
        ids.push_back(id);
        next = std::min(next, c.deadline);
      }
      int timeout_ms = -1;
      if (next != Clock::time_point::max()) {
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
        timeout_ms = static_cast<int>(std::clamp<std::int64_t>(ms, 0, 60'000));
      }
      const int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
      if (n < 0) {
        if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // ENOMEM
        continue;
      }
      if (pfds[0].revents != 0) {
        std::uint64_t count;
        (void)!::read(wake_fd_, &count, sizeof count);
      }
      std::size_t base = 1;
      if (accepting) {
        if (pfds[1].revents != 0) Accept();
        base = 2;
      }
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (pfds[base + i].revents != 0) Ready(ids[i]);
      }
    }
  }

  // The connection a new one may take the place of when max_connections are open: a
  // draining one (its response is sent), else the one waiting longest for its head.
  std::map<std::uint64_t, Conn>::iterator Evictable() {
    auto oldest = conns_.end();
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      if (it->second.state == State::kDraining) return it;
      if (it->second.state == State::kReading &&
          (oldest == conns_.end() || it->second.accepted < oldest->second.accepted)) {
        oldest = it;
      }
    }
    return oldest;
  }

  void Accept() {
    for (;;) {
      const bool full = conns_.size() >= static_cast<std::size_t>(options_.max_connections);
      if (full && Evictable() == conns_.end()) return;  // all being answered: the backlog waits
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until_ = Clock::now() + kAcceptPause;
        }
        return;  // EAGAIN: none left; ECONNABORTED and the like: the next poll retries
      }
      if (full) {  // only now that a new one has come
        auto victim = Evictable();
        if (victim->second.state == State::kReading) {
          const std::string r = ErrorResponse(408, "Request Timeout");
          (void)!::send(victim->second.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        Close(victim);
      }
      Conn c;
      c.fd = fd;
      c.accepted = Clock::now();
      c.deadline = c.accepted + absl::ToChronoNanoseconds(options_.header_timeout);
      conns_.emplace(next_id_++, std::move(c));
    }
  }

  // Poll reported `id`'s descriptor ready (readable, writable, hung up or failed).
  void Ready(std::uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;  // taken over by a new connection in Accept
    Conn& c = it->second;
    char buf[4096];
    switch (c.state) {
      case State::kReading: {
        bool gone = false;  // end of file (a client may shut its side after the head) or error
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
          if (n <= 0) {
            gone = true;
            break;
          }
          c.in.append(buf, static_cast<std::size_t>(n));
          if (c.in.size() > kMaxHeadBytes) break;
        }
        std::size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) end = c.in.find("\n\n");
        if (end != std::string::npos && end <= kMaxHeadBytes) {
          Dispatch(id, c, std::string_view(c.in).substr(0, end));
        } else if (c.in.size() > kMaxHeadBytes) {
          Reply(c, ErrorResponse(431, "Request Header Fields Too Large"));
        } else if (gone) {
          Close(it);  // gone before its head was complete
        }
        return;
      }
      case State::kWriting: {
        while (c.sent < c.out.size()) {
          const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
          if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
            Close(it);
            return;
          }
          c.sent += static_cast<std::size_t>(n);
        }
        ::shutdown(c.fd, SHUT_WR);
        c.state = State::kDraining;
        c.deadline = Clock::now() + kLinger;
        std::string().swap(c.out);
        std::string().swap(c.in);
        return;
      }
      case State::kDraining: {
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
          Close(it);  // the client closed (or reset): done
          return;
        }
      }
      case State::kCollecting:
        return;  // not polled
    }
  }

  // A whole request head: a scrape goes to a worker, anything else is answered here.
  void Dispatch(std::uint64_t id, Conn& c, std::string_view head) {
    while (head.starts_with("\r\n") || head.starts_with("\n")) head.remove_prefix(head[0] == '\r' ? 2 : 1);
    std::string_view line = head.substr(0, head.find('\n'));
    if (line.ends_with('\r')) line.remove_suffix(1);
    std::string_view parts[3];
    for (std::string_view& p : parts) {
      const std::size_t sp = line.find(' ');
      p = line.substr(0, sp);
      line = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
    }
    const std::string_view method = parts[0], target = parts[1], version = parts[2];
    if (method.empty() || target.empty() || !line.empty() ||
        (version != "HTTP/1.0" && version != "HTTP/1.1")) {
      Reply(c, ErrorResponse(400, "Bad Request"));
      return;
    }
    if (target.substr(0, target.find('?')) != options_.path) {
      Reply(c, ErrorResponse(404, "Not Found"));
      return;
    }
    if (method != "GET" && method != "HEAD") {
      Reply(c, ErrorResponse(405, "Method Not Allowed", "Allow: GET, HEAD\r\n"));
      return;
    }
    const bool head_only = method == "HEAD";
    c.state = State::kCollecting;
    std::string().swap(c.in);  // `head` and its views end here
    {
      std::lock_guard l(jobs_mu_);
      jobs_.push_back({id, head_only});
    }
    jobs_cv_.notify_one();
  }

  void Reply(Conn& c, std::string response) {
    c.out = std::move(response);
    c.sent = 0;
    c.state = State::kWriting;
    c.deadline = Clock::now() + absl::ToChronoNanoseconds(options_.response_timeout);
  }

  // Responses the workers finished: to their connections' kWriting.
  void TakeDone() {
    std::vector<Done> done;
    {
      std::lock_guard l(done_mu_);
      done.swap(done_);
    }
    for (Done& d : done) {
      auto it = conns_.find(d.id);
      if (it != conns_.end()) Reply(it->second, std::move(d.response));
    }
  }

  void Expire(Clock::time_point now) {
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = it->second;
      auto next = std::next(it);
      if (c.state != State::kCollecting && c.deadline <= now) {
        if (c.state == State::kReading) {
          Reply(c, ErrorResponse(408, "Request Timeout"));  // written when writable
        } else {
          Close(it);  // a response not taken in time, or the linger's end
        }
      }
      it = next;
    }
  }

  void Close(std::map<std::uint64_t, Conn>::iterator it) {
    ::close(it->second.fd);
    conns_.erase(it);
  }

  // --- The workers ----------------------------------------------------------------

  void WorkerLoop() {
    for (;;) {
      Job job;
      {
        std::unique_lock l(jobs_mu_);
        jobs_cv_.wait(l, [&] { return stop_.load() || !jobs_.empty(); });
        if (stop_.load()) return;
        job = jobs_.front();
        jobs_.pop_front();
      }
      std::string response = Scrape(job.head_only);
      {
        std::lock_guard l(done_mu_);
        done_.push_back({job.id, std::move(response)});
      }
      Wake();
    }
  }

  std::string Scrape(bool head_only) {
    const Clock::time_point t0 = Clock::now();
    std::vector<std::shared_ptr<::prometheus::Collectable>> collectables;
    {
      std::lock_guard l(mu_);
      collectables = collectables_;
    }
    std::vector<::prometheus::MetricFamily> families;
    try {
      families = registry_->Collect();
      for (const auto& c : collectables) {
        std::vector<::prometheus::MetricFamily> f = c->Collect();
        std::move(f.begin(), f.end(), std::back_inserter(families));
      }
    } catch (...) {  // a collector that throws fails this scrape, not the server
      return ErrorResponse(500, "Internal Server Error");
    }
    const std::string body = ::prometheus::TextSerializer().Serialize(families);
    scrapes_.Increment();
    bytes_.Increment(static_cast<double>(body.size()));
    latencies_.Observe(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    return Response(200, "OK", kExpositionType, body, head_only);
  }

  const MetricsServerOptions options_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: a worker finished, or the destructor stops the I/O thread
  std::atomic<bool> stop_{false};
  std::thread io_;
  std::vector<std::thread> workers_;

  // The I/O thread's own.
  std::map<std::uint64_t, Conn> conns_;
  std::uint64_t next_id_ = 1;
  Clock::time_point accept_paused_until_{};

  std::mutex mu_;
  std::vector<std::shared_ptr<::prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  std::mutex done_mu_;
  std::vector<Done> done_ ABSL_GUARDED_BY(done_mu_);

  // The exposer_* families (prometheus-cpp's Exposer's names and help).
  std::shared_ptr<::prometheus::Registry> registry_;
  ::prometheus::Counter& scrapes_;
  ::prometheus::Counter& bytes_;
  ::prometheus::Summary& latencies_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(MetricsServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError("MetricsServerOptions.port " + std::to_string(options.port) +
                                      " is outside 0..65535");
  }
  in_addr addr{};
  if (::inet_pton(AF_INET, options.address.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError("MetricsServerOptions.address '" + options.address +
                                      "' is not a dotted IPv4 address (such as 127.0.0.1 or 0.0.0.0)");
  }
  bool path_ok = !options.path.empty() && options.path[0] == '/';
  for (char c : options.path) path_ok = path_ok && static_cast<unsigned char>(c) > 0x20 && c != 0x7f;
  if (!path_ok) {
    return absl::InvalidArgumentError("MetricsServerOptions.path '" + options.path +
                                      "' must start with '/' and hold no space or control character");
  }
  if (options.threads < 1 || options.threads > 64) {
    return absl::InvalidArgumentError("MetricsServerOptions.threads " + std::to_string(options.threads) +
                                      " is outside 1..64");
  }
  if (options.header_timeout <= absl::ZeroDuration() || options.header_timeout > absl::Seconds(60)) {
    return absl::InvalidArgumentError("MetricsServerOptions.header_timeout " +
                                      absl::FormatDuration(options.header_timeout) + " is outside (0, 60s]");
  }
  if (options.response_timeout <= absl::ZeroDuration() || options.response_timeout > absl::Minutes(10)) {
    return absl::InvalidArgumentError("MetricsServerOptions.response_timeout " +
                                      absl::FormatDuration(options.response_timeout) +
                                      " is outside (0, 10m]");
  }
  if (options.max_connections < 1 || options.max_connections > 4096) {
    return absl::InvalidArgumentError("MetricsServerOptions.max_connections " +
                                      std::to_string(options.max_connections) + " is outside 1..4096");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() = default;  // Impl stops the threads before the collectables go

void MetricsServer::Add(std::shared_ptr<::prometheus::Collectable> collectable) {
  impl_->Add(std::move(collectable));
}

int MetricsServer::port() const { return impl_->port(); }

std::string MetricsServer::url() const {
  const MetricsServerOptions& o = impl_->options();
  return "http://" + o.address + ":" + std::to_string(impl_->port()) + o.path;
}

std::string ExpositionText(const ::prometheus::Collectable& collectable) {
  return ::prometheus::TextSerializer().Serialize(collectable.Collect());
}

}  // namespace inferq::prometheus
