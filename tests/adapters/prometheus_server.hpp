// A Prometheus server (Debian's prometheus 2.42) for a test: it scrapes the given
// loopback targets every second, listens on 127.0.0.1 on a free port, keeps its
// store and configuration in the test's own directory, and is always stopped when
// the object goes (and with the test's process, by PR_SET_PDEATHSIG). Query reads
// its HTTP API.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "http_get.hpp"
#include "nats_server.hpp"  // FreeLoopbackPort, Listening

namespace inferq_test {

class PrometheusServer {
 public:
  PrometheusServer(std::filesystem::path dir, std::vector<int> target_ports)
      : dir_(std::move(dir)), targets_(std::move(target_ports)), port_(FreeLoopbackPort()) {}
  ~PrometheusServer() { Stop(); }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  // Writes its configuration, starts it and waits (at most 60 s) until it is ready
  // (/-/ready answers 200). False when it exits or is not ready in time (its output
  // is in log_path()).
  bool Start() {
    std::filesystem::create_directories(dir_ / "data");
    {
      std::ofstream cfg(dir_ / "prometheus.yml");
      cfg << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
          << "scrape_configs:\n  - job_name: inferq\n    static_configs:\n      - targets: [";
      for (std::size_t i = 0; i < targets_.size(); ++i) {
        cfg << (i ? ", " : "") << "'127.0.0.1:" << targets_[i] << "'";
      }
      cfg << "]\n";
    }
    std::vector<std::string> args = {"prometheus",
                                     "--config.file=" + (dir_ / "prometheus.yml").string(),
                                     "--storage.tsdb.path=" + (dir_ / "data").string(),
                                     "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                     "--log.level=warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = log_path().string();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      ::dup2(::fileno(stderr), STDOUT_FILENO);
      ::execvp("prometheus", argv.data());
      std::_Exit(127);
    }
    if (pid_ < 0) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      if (Listening(port_)) {
        auto r = HttpGet(port_, "/-/ready");
        if (r && r->status == 200) return true;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Stop();
    return false;
  }

  // SIGTERM, then SIGKILL after 10 s.
  void Stop() { SignalAndReap(pid_, SIGTERM); }

  // The value of a PromQL instant query whose result is one sample, as text
  // ("12", "0.5"); nullopt when the query fails or gives no sample or several.
  std::optional<std::string> Query(const std::string& promql) const {
    auto r = HttpGet(port_, "/api/v1/query?query=" + UrlEncode(promql));
    if (!r || r->status != 200) return std::nullopt;
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[1.7e9,"12"]}]}}
    static const std::regex kSample(R"re("value":\[[0-9.e+]+,"([^"]*)"\])re");
    auto begin = std::sregex_iterator(r->body.begin(), r->body.end(), kSample);
    if (begin == std::sregex_iterator() || std::next(begin) != std::sregex_iterator()) return std::nullopt;
    return (*begin)[1].str();
  }

  int port() const { return port_; }
  std::filesystem::path log_path() const { return dir_ / "prometheus.log"; }
  std::string Log() const {
    std::ifstream in(log_path());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  static std::string UrlEncode(const std::string& s) {
    static const char* kHex = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
      if (std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
        out.push_back(static_cast<char>(c));
      } else {
        out += '%';
        out.push_back(kHex[c >> 4]);
        out.push_back(kHex[c & 15]);
      }
    }
    return out;
  }

  std::filesystem::path dir_;
  std::vector<int> targets_;
  int port_;
  pid_t pid_ = -1;
};

}  // namespace inferq_test
