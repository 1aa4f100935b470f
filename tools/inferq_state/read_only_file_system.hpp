// ReadOnlyFileSystem: the FileSystem inferq-state opens a stream log through, so that
// StreamLog::Open in kStrict recovery mode (which checks every frame's checksum, the
// tx_ids and the hash chain) runs on the files without changing any of them.
//
// Reads go to PosixFileSystem. What would change a file fails with
// kFailedPrecondition naming it (strict recovery of an intact log creates, renames
// and writes nothing; what it removes, it removes best effort and ignores the
// error), and the tail segment Open opens for appending refuses every write. Lock
// takes a shared flock(2) on LOCK without writing to it: an engine that has the log
// open holds it exclusively, and the tool then says so (its files change under a
// writer); an engine opening the log meanwhile is refused for as long as the tool
// reads it.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "inferq/state/file_system.hpp"

namespace inferq_state_tool {

class ReadOnlyFileSystem final : public inferq::FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<inferq::FileLock>> Lock(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::unique_ptr<inferq::FileLock>(new Held(-1));  // never opened
      return inferq::FileSystemError(errno, "open", path);
    }
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
      const int err = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      ::close(fd);
      if (err != EWOULDBLOCK) return inferq::FileSystemError(err, "flock", path);
      std::string pid(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      return absl::FailedPreconditionError(
          "'" + path + "' is held by " + (pid.empty() ? "another process" : "process " + pid) +
          ": the stream is open; inferq-state reads a stream log only while nothing writes it");
    }
    return std::unique_ptr<inferq::FileLock>(new Held(fd));
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> Create(const std::string& path) override {
    return Refuse("create", path);
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> OpenForWrite(const std::string& path) override {
    return std::unique_ptr<inferq::WritableFile>(new NoWrites(path));
  }
  absl::StatusOr<std::string> Read(const std::string& path) override { return posix_->Read(path); }
  absl::Status ReadInto(const std::string& path, std::string& out) override {
    return posix_->ReadInto(path, out);
  }
  absl::StatusOr<std::string> ReadAt(const std::string& path, std::uint64_t offset, std::size_t n) override {
    return posix_->ReadAt(path, offset, n);
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override { return posix_->List(dir); }
  absl::Status CreateDir(const std::string& dir) override {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return absl::OkStatus();
    return Refuse("create directory", dir);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return Refuse("rename", from + "' to '" + to);
  }
  absl::Status Remove(const std::string& path) override { return Refuse("remove", path); }
  absl::Status SyncDir(const std::string& dir) override { return Refuse("sync", dir); }

 private:
  static absl::Status Refuse(std::string_view what, const std::string& path) {
    return absl::FailedPreconditionError("inferq-state only reads: it would " + std::string(what) + " '" +
                                         path + "'");
  }
  class Held final : public inferq::FileLock {
   public:
    explicit Held(int fd) : fd_(fd) {}
    ~Held() override {
      if (fd_ >= 0) ::close(fd_);  // drops the flock
    }

   private:
    int fd_;
  };
  class NoWrites final : public inferq::WritableFile {
   public:
    explicit NoWrites(std::string path) : path_(std::move(path)) {}
    absl::Status WriteAt(std::uint64_t, std::string_view) override { return Refuse("write", path_); }
    absl::Status Sync() override { return Refuse("sync", path_); }
    absl::Status Close() override { return absl::OkStatus(); }

   private:
    std::string path_;
  };

  std::shared_ptr<inferq::FileSystem> posix_ = inferq::PosixFileSystem();
};

}  // namespace inferq_state_tool
