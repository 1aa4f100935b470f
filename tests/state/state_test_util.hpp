// Helpers for the state tests: temporary directories, raw file edits, and a
// FileSystem that injects failures.
#pragma once

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "inferq/state/file_system.hpp"
#include "inferq/state/state_store.hpp"

namespace state_test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> n{0};
    path_ = (fs::temp_directory_path() /
             ("inferq_state_" + std::to_string(::getpid()) + "_" + std::to_string(n++)))
                .string();
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Sorted names in `dir` that start with `prefix`.
inline std::vector<std::string> Files(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline inferq::StateStoreOptions Options(const std::string& dir) {
  inferq::StateStoreOptions o;
  o.dir = dir;
  o.checkpoint_interval = absl::ZeroDuration();  // checkpoints only when a test asks
  o.checkpoint_log_bytes = 0;
  return o;
}

// Fails chosen operations, otherwise forwards to the POSIX file system.
// Operation kinds: "create", "open", "read", "write", "sync", "close", "rename",
// "remove", "syncdir". `FailNth(kind, n, err)` makes the n-th call (1-based, counted from now)
// of that kind fail with errno `err` (EIO or ENOSPC); a failed write first writes
// half of its bytes, as a real short write would.
class FaultyFileSystem final : public inferq::FileSystem {
 public:
  FaultyFileSystem() : base_(inferq::PosixFileSystem()) {}

  void FailNth(const std::string& kind, int n, int err) {
    std::lock_guard lock(mu_);
    kind_ = kind;
    countdown_ = n;
    err_ = err;
  }
  int calls(const std::string& kind) {
    std::lock_guard lock(mu_);
    return counts_[kind];
  }
  // Blocks every log sync until Release(); counts syncs.
  void HoldSyncs() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  int syncs_waiting() {
    std::lock_guard lock(mu_);
    return waiting_;
  }

  absl::Status Check(const std::string& kind) {
    std::lock_guard lock(mu_);
    ++counts_[kind];
    if (kind == kind_ && countdown_ > 0 && --countdown_ == 0) {
      kind_.clear();
      const std::string msg = kind + ": injected " + (err_ == EIO ? "EIO" : "ENOSPC");
      return err_ == EIO ? absl::DataLossError(msg) : absl::ResourceExhaustedError(msg);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> Create(const std::string& p) override {
    if (auto st = Check("create"); !st.ok()) return st;
    auto f = base_->Create(p);
    if (!f.ok()) return f.status();
    return std::unique_ptr<inferq::WritableFile>(new File(this, std::move(*f)));
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> OpenForWrite(const std::string& p) override {
    if (auto st = Check("open"); !st.ok()) return st;
    auto f = base_->OpenForWrite(p);
    if (!f.ok()) return f.status();
    return std::unique_ptr<inferq::WritableFile>(new File(this, std::move(*f)));
  }
  absl::StatusOr<std::unique_ptr<inferq::FileLock>> Lock(const std::string& p) override {
    return base_->Lock(p);
  }
  absl::StatusOr<std::string> Read(const std::string& p) override {
    if (auto st = Check("read"); !st.ok()) return st;
    return base_->Read(p);
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& d) override {
    return base_->List(d);
  }
  absl::Status CreateDir(const std::string& d) override { return base_->CreateDir(d); }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    if (auto st = Check("rename"); !st.ok()) return st;
    return base_->Rename(a, b);
  }
  absl::Status Remove(const std::string& p) override {
    if (auto st = Check("remove"); !st.ok()) return st;
    return base_->Remove(p);
  }
  absl::Status SyncDir(const std::string& d) override {
    if (auto st = Check("syncdir"); !st.ok()) return st;
    return base_->SyncDir(d);
  }

 private:
  class File final : public inferq::WritableFile {
   public:
    File(FaultyFileSystem* fs, std::unique_ptr<inferq::WritableFile> f)
        : fs_(fs), f_(std::move(f)) {}
    absl::Status WriteAt(std::uint64_t offset, std::string_view data) override {
      if (auto st = fs_->Check("write"); !st.ok()) {
        (void)f_->WriteAt(offset, data.substr(0, data.size() / 2));  // a short write
        return st;
      }
      return f_->WriteAt(offset, data);
    }
    absl::Status Sync() override {
      {
        std::unique_lock lock(fs_->mu_);
        ++fs_->waiting_;
        fs_->cv_.wait(lock, [&] { return !fs_->hold_; });
        --fs_->waiting_;
      }
      if (auto st = fs_->Check("sync"); !st.ok()) return st;
      return f_->Sync();
    }
    absl::Status Close() override {
      if (auto st = fs_->Check("close"); !st.ok()) return st;
      return f_->Close();
    }

   private:
    FaultyFileSystem* fs_;
    std::unique_ptr<inferq::WritableFile> f_;
  };

  std::shared_ptr<inferq::FileSystem> base_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> counts_;
  std::string kind_;
  int countdown_ = 0;
  int err_ = EIO;
  bool hold_ = false;
  int waiting_ = 0;
};

// Forwards to the POSIX file system, with hooks a test sets before handing it to a
// store: `before_read(path)` runs before each Read (a test acts there as a writer
// would between two steps of a reader), `after_read(path, bytes)` may change what a
// Read returns (a file as read(2) can see it halfway through a pwrite(2)), and
// `refuse(op, path)` may fail a call that changes the directory (op: "lock",
// "create", "open", "createdir", "rename", "remove", "syncdir").
class HookedFileSystem final : public inferq::FileSystem {
 public:
  std::function<void(const std::string& path)> before_read;
  std::function<void(const std::string& path, std::string& bytes)> after_read;
  std::function<absl::Status(const std::string& op, const std::string& path)> refuse;

  absl::StatusOr<std::unique_ptr<inferq::FileLock>> Lock(const std::string& p) override {
    if (auto st = Refused("lock", p); !st.ok()) return st;
    return base_->Lock(p);
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> Create(const std::string& p) override {
    if (auto st = Refused("create", p); !st.ok()) return st;
    return base_->Create(p);
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> OpenForWrite(const std::string& p) override {
    if (auto st = Refused("open", p); !st.ok()) return st;
    return base_->OpenForWrite(p);
  }
  absl::StatusOr<std::string> Read(const std::string& p) override {
    if (before_read) before_read(p);
    if (auto st = Refused("read", p); !st.ok()) return st;
    auto bytes = base_->Read(p);
    if (bytes.ok() && after_read) after_read(p, *bytes);
    return bytes;
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& d) override {
    return base_->List(d);
  }
  absl::Status CreateDir(const std::string& d) override {
    if (auto st = Refused("createdir", d); !st.ok()) return st;
    return base_->CreateDir(d);
  }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    if (auto st = Refused("rename", a); !st.ok()) return st;
    return base_->Rename(a, b);
  }
  absl::Status Remove(const std::string& p) override {
    if (auto st = Refused("remove", p); !st.ok()) return st;
    return base_->Remove(p);
  }
  absl::Status SyncDir(const std::string& d) override {
    if (auto st = Refused("syncdir", d); !st.ok()) return st;
    return base_->SyncDir(d);
  }

 private:
  absl::Status Refused(const std::string& op, const std::string& path) {
    return refuse ? refuse(op, path) : absl::OkStatus();
  }
  std::shared_ptr<inferq::FileSystem> base_ = inferq::PosixFileSystem();
};

// Plays a power cut: forwards to the POSIX file system and keeps, per file, the bytes
// it held at its last Sync (a file never synced holds none). Cut() puts every file it
// knows back to that image, as the disk would hold it after the machine lost power
// with everything else in the page cache. Renames and removals count as durable at
// once (the code under test syncs a file before renaming it, and syncs the directory
// after). Files are never mapped (Map: kUnimplemented), so every write passes here.
class PowerCutFileSystem final : public inferq::FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<inferq::FileLock>> Lock(const std::string& p) override {
    return base_->Lock(p);
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> Create(const std::string& p) override {
    auto f = base_->Create(p);
    if (!f.ok()) return f.status();
    {
      std::lock_guard lock(mu_);
      durable_[p] = std::string();
    }
    return std::unique_ptr<inferq::WritableFile>(new File(this, p, *std::move(f)));
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> OpenForWrite(const std::string& p) override {
    auto f = base_->OpenForWrite(p);
    if (!f.ok()) return f.status();
    {
      std::lock_guard lock(mu_);
      if (!durable_.contains(p)) {
        auto bytes = base_->Read(p);  // there before this file system saw it: durable
        durable_[p] = bytes.ok() ? *bytes : std::string();
      }
    }
    return std::unique_ptr<inferq::WritableFile>(new File(this, p, *std::move(f)));
  }
  absl::StatusOr<std::string> Read(const std::string& p) override { return base_->Read(p); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& d) override {
    return base_->List(d);
  }
  absl::Status CreateDir(const std::string& d) override { return base_->CreateDir(d); }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    if (auto st = base_->Rename(a, b); !st.ok()) return st;
    std::lock_guard lock(mu_);
    auto it = durable_.find(a);
    if (it != durable_.end()) {
      durable_[b] = std::move(it->second);
      durable_.erase(a);
    }
    return absl::OkStatus();
  }
  absl::Status Remove(const std::string& p) override {
    if (auto st = base_->Remove(p); !st.ok()) return st;
    std::lock_guard lock(mu_);
    durable_.erase(p);
    return absl::OkStatus();
  }
  absl::Status SyncDir(const std::string& d) override { return base_->SyncDir(d); }

  // Every file written through here back to its image at its last Sync. Call it with
  // no store open on the files.
  void Cut() {
    std::lock_guard lock(mu_);
    for (const auto& [path, bytes] : durable_) {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
  }

 private:
  class File final : public inferq::WritableFile {
   public:
    File(PowerCutFileSystem* fs, std::string path, std::unique_ptr<inferq::WritableFile> f)
        : fs_(fs), path_(std::move(path)), f_(std::move(f)) {}
    absl::Status WriteAt(std::uint64_t offset, std::string_view data) override {
      return f_->WriteAt(offset, data);
    }
    absl::Status Sync() override {
      if (auto st = f_->Sync(); !st.ok()) return st;
      auto bytes = fs_->base_->Read(path_);
      if (!bytes.ok()) return bytes.status();
      std::lock_guard lock(fs_->mu_);
      fs_->durable_[path_] = *std::move(bytes);
      return absl::OkStatus();
    }
    absl::Status Close() override { return f_->Close(); }

   private:
    PowerCutFileSystem* fs_;
    std::string path_;
    std::unique_ptr<inferq::WritableFile> f_;
  };

  std::shared_ptr<inferq::FileSystem> base_ = inferq::PosixFileSystem();
  std::mutex mu_;
  std::map<std::string, std::string> durable_;
};

}  // namespace state_test
