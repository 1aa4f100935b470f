// A nats-server process for a test: JetStream on, listening on 127.0.0.1 on a free
// port the test picks, its store and log in the test's own temporary directory, and
// always stopped (SIGKILL if it does not stop on SIGTERM) when the object goes, also
// when the test fails (and with the test's process, by PR_SET_PDEATHSIG, when that is
// killed). Start after Stop or Kill keeps the port and the store (an outage).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace inferq_test {

// A port on 127.0.0.1 that nothing listened on a moment ago (the kernel's pick).
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// True once something accepts TCP connections on 127.0.0.1:port.
inline bool Listening(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A file's whole text; empty when it cannot be read.
inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Starts `args` (args[0] a path) as a child process that dies with this one
// (PR_SET_PDEATHSIG), with no signal blocked; its stdout and stderr go to the file
// `log` (empty: this process's). Returns its pid; the caller reaps it.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) std::_Exit(127);  // the parent died before prctl took effect
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);  // cluster_demo blocks SIGTERM and SIGINT
  if (!log.empty()) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
  }
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "cannot run '%s': %s\n", argv[0], std::strerror(errno));
  std::_Exit(127);
}

// Sends `sig` to child `pid` and reaps it, SIGKILL after 10 s; sets pid to -1. No-op
// for pid <= 0.
inline void SignalAndReap(pid_t& pid, int sig) {
  if (pid <= 0) return;
  ::kill(pid, sig);
  int status = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid = -1;
}

// A TCP proxy on a free loopback port to `target_port` (a nats-server's client port):
// whatever connects to port() is connected on to the target, and two threads per
// connection copy the bytes both ways. Cut() closes every proxied connection and
// refuses new ones (its listening socket closed) until Resume(): the network between
// the processes and the server gone for a while, the server itself untouched (the
// cluster demo's --outage).
class LoopbackProxy {
 public:
  explicit LoopbackProxy(int target_port) : target_(target_port), port_(FreeLoopbackPort()) {}
  ~LoopbackProxy() { Stop(); }
  LoopbackProxy(const LoopbackProxy&) = delete;
  LoopbackProxy& operator=(const LoopbackProxy&) = delete;

  // Listens on port() and accepts. False when it cannot listen.
  bool Start() {
    std::lock_guard lock(mu_);
    if (listener_ >= 0) return true;
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener_ < 0) return false;
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = Loopback(port_);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 64) != 0) {
      ::close(listener_);
      listener_ = -1;
      return false;
    }
    accepting_ = true;
    acceptor_ = std::thread([this, fd = listener_] { Accept(fd); });
    return true;
  }
  // Closes every proxied connection and stops accepting: connecting to port() is
  // refused until Start() again (which listens on the same port).
  void Cut() {
    std::thread acceptor;
    {
      std::lock_guard lock(mu_);
      accepting_ = false;  // a connection accepted meanwhile is cut as it registers
      if (listener_ >= 0) {
        ::shutdown(listener_, SHUT_RDWR);  // accept() returns
        acceptor = std::move(acceptor_);
      }
      for (const auto& weak : conns_) {
        if (auto c = weak.lock()) c->Shutdown();
      }
    }
    if (acceptor.joinable()) acceptor.join();
    std::lock_guard lock(mu_);
    if (listener_ >= 0) ::close(listener_);
    listener_ = -1;
  }
  int port() const { return port_; }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

 private:
  struct Conn {
    int a = -1, b = -1;
    void Shutdown() {
      ::shutdown(a, SHUT_RDWR);
      ::shutdown(b, SHUT_RDWR);
    }
    ~Conn() {
      ::close(a);
      ::close(b);
    }
  };

  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    return a;
  }

  void Accept(int listener) {
    for (;;) {
      const int in = ::accept(listener, nullptr, nullptr);
      if (in < 0) {
        if (errno == EINTR) continue;
        return;  // shut down (Cut, Stop)
      }
      const int out = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a = Loopback(target_);
      if (out < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        if (out >= 0) ::close(out);
        ::close(in);
        continue;
      }
      auto c = std::make_shared<Conn>();
      c->a = in;
      c->b = out;
      std::lock_guard lock(mu_);
      if (!accepting_) c->Shutdown();
      conns_.push_back(c);
      pumps_.emplace_back([c] { Pump(c, c->a, c->b); });
      pumps_.emplace_back([c] { Pump(c, c->b, c->a); });
    }
  }

  // Copies from `from` to `to` until either side ends, then ends both.
  static void Pump(const std::shared_ptr<Conn>& c, int from, int to) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(from, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      ssize_t done = 0;
      while (done < n) {
        const ssize_t w = ::send(to, buf + done, static_cast<std::size_t>(n - done), MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          c->Shutdown();
          return;
        }
        done += w;
      }
    }
    c->Shutdown();
  }

  void Stop() {
    Cut();
    std::vector<std::thread> pumps;
    {
      std::lock_guard lock(mu_);
      pumps.swap(pumps_);
      conns_.clear();
    }
    for (std::thread& t : pumps) t.join();
  }

  const int target_;
  const int port_;
  std::mutex mu_;
  int listener_ = -1;                       // guarded by mu_
  bool accepting_ = false;                  // guarded by mu_
  std::thread acceptor_;                    // guarded by mu_
  std::vector<std::weak_ptr<Conn>> conns_;  // guarded by mu_
  std::vector<std::thread> pumps_;          // guarded by mu_
};

// A fresh directory under the system's temporary directory, removed with the object.
// A process killed outright (SIGKILL, a ctest timeout) leaves its directories behind:
// each new TempDir first removes those of processes that no longer exist.
class TempDir {
 public:
  TempDir() {
    RemoveStale();
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("inferq-nats-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  // Removes inferq-nats-<pid>-* directories whose process is gone (kill(pid, 0) says
  // ESRCH); a live process, or one of another user, keeps its own.
  static void RemoveStale() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path(), ec)) {
      const std::string name = entry.path().filename().string();
      constexpr std::string_view kPrefix = "inferq-nats-";
      if (name.rfind(kPrefix, 0) != 0) continue;
      const std::size_t dash = name.find('-', kPrefix.size());
      if (dash == std::string::npos) continue;
      long pid = 0;
      try {
        pid = std::stol(name.substr(kPrefix.size(), dash - kPrefix.size()));
      } catch (...) {
        continue;
      }
      if (pid <= 0 || pid == ::getpid()) continue;
      if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(entry.path(), ec);
    }
  }

  std::filesystem::path path_;
};

class NatsServer {
 public:
  // `dir`: the store (dir/store), the log (dir/server.log) and any config file.
  // `extra_args`: more nats-server arguments (a config file with -c, ...).
  // `jetstream`: false starts a server without JetStream (-js left out).
  explicit NatsServer(std::filesystem::path dir, std::vector<std::string> extra_args = {}, bool jetstream = true)
      : dir_(std::move(dir)), extra_(std::move(extra_args)), jetstream_(jetstream), port_(FreeLoopbackPort()) {}
  ~NatsServer() { Kill(); }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  // Starts it and waits (at most 20 s) until it accepts connections. False when it
  // exits or does not listen in time (its log is in log_path()).
  bool Start() {
    if (pid_ > 0) return true;
    std::filesystem::create_directories(dir_ / "store");
    std::vector<std::string> args = {"nats-server", "-sd", (dir_ / "store").string(), "-a",
                                     "127.0.0.1", "-p", std::to_string(port_), "-l", log_path().string()};
    if (jetstream_) args.insert(args.begin() + 1, "-js");
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      // The server dies with the test, also when the test is killed.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // Signals the parent blocks (cluster_demo takes SIGTERM with sigtimedwait)
      // must reach the server: Stop sends SIGTERM.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execvp("nats-server", argv.data());
      std::_Exit(127);
    }
    if (pid_ < 0) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      if (Listening(port_)) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return false;
  }
  // A clean shutdown (SIGTERM), SIGKILL after 10 s.
  void Stop() { Signal(SIGTERM); }
  // A crash.
  void Kill() { Signal(SIGKILL); }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  int port() const { return port_; }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  std::filesystem::path log_path() const { return dir_ / "server.log"; }
  std::string Log() const { return ReadText(log_path()); }

 private:
  void Signal(int sig) { SignalAndReap(pid_, sig); }

  std::filesystem::path dir_;
  std::vector<std::string> extra_;
  bool jetstream_;
  int port_;
  pid_t pid_ = -1;
};

}  // namespace inferq_test

namespace inferq_test {

// A cluster of `n` nats-servers with JetStream (names n0, n1, ...; cluster "inferq"),
// each on free loopback ports (client and route), routes to all the others, stores
// under dir/n<i>. Every server is stopped with the object.
class NatsCluster {
 public:
  NatsCluster(const std::filesystem::path& dir, int n) {
    std::vector<int> route_ports;
    for (int i = 0; i < n; ++i) route_ports.push_back(FreeLoopbackPort());
    for (int i = 0; i < n; ++i) {
      const std::filesystem::path d = dir / ("n" + std::to_string(i));
      std::filesystem::create_directories(d);
      std::string routes;
      for (int j = 0; j < n; ++j) {
        if (j != i) routes += "    nats-route://127.0.0.1:" + std::to_string(route_ports[j]) + "\n";
      }
      std::ofstream(d / "server.conf") << "server_name: n" << i << "\n"
                                       << "cluster {\n  name: inferq\n  listen: 127.0.0.1:" << route_ports[i]
                                       << "\n  routes: [\n" << routes << "  ]\n}\n";
      servers_.push_back(std::make_unique<NatsServer>(d, std::vector<std::string>{"-c", (d / "server.conf").string()}));
    }
  }
  // Starts every server. False when one does not start.
  bool Start() {
    for (auto& s : servers_) {
      if (!s->Start()) return false;
    }
    return true;
  }
  NatsServer& server(int i) { return *servers_[static_cast<std::size_t>(i)]; }
  int size() const { return static_cast<int>(servers_.size()); }
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (const auto& s : servers_) out.push_back(s->url());
    return out;
  }
  // "nats://a,nats://b,..." as nats.c's natsConnection_ConnectTo takes it.
  std::string url_list() const {
    std::string out;
    for (const auto& u : urls()) out += (out.empty() ? "" : ",") + u;
    return out;
  }

 private:
  std::vector<std::unique_ptr<NatsServer>> servers_;
};

}  // namespace inferq_test
