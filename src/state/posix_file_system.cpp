#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "inferq/base/error.hpp"
#include "inferq/state/file_system.hpp"

namespace inferq {

absl::Status FileSystemError(int err, const std::string& call, const std::string& path) {
  const std::string msg = call + " " + QuoteValue(path) + ": " + std::strerror(err);
  switch (err) {
    case EIO:
      return absl::DataLossError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EROFS:  // a read-only mount: no write can succeed, whoever asks
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

namespace {

// What a non-regular file is, for the error of Read.
std::string FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "mode " + std::to_string(static_cast<unsigned>(mode & S_IFMT));
}

// Physical memory in bytes: no file larger than this can be held as one string.
std::uint64_t MemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{1} << 40;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    Unmap();
    if (fd_ >= 0) ::close(fd_);
  }
  absl::StatusOr<char*> Map(std::uint64_t size) override {
    if (fd_ < 0) return absl::FailedPreconditionError("map of closed file " + QuoteValue(path_));
    Unmap();
    // Only where a page written once keeps its blocks: a copy-on-write file system
    // (btrfs, zfs) allocates anew on each write, and through a mapping a failed
    // allocation is SIGBUS, not ENOSPC. ext4, xfs (outside shared reflink extents,
    // which a log's own segment never has) and tmpfs.
    struct statfs fsinfo;
    if (::fstatfs(fd_, &fsinfo) != 0) return FileSystemError(errno, "fstatfs", path_);
    constexpr long kExt4 = 0xEF53, kXfs = 0x58465342, kTmpfs = 0x01021994;
    const long type = static_cast<long>(fsinfo.f_type);
    if (type != kExt4 && type != kXfs && type != kTmpfs) {
      return absl::UnimplementedError(QuoteValue(path_) + " is on a file system not mapped for "
                                      "appends (type " + std::to_string(type) + ")");
    }
    void* p = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED,
                     fd_, 0);
    if (p == MAP_FAILED) return FileSystemError(errno, "mmap", path_);
    map_ = static_cast<char*>(p);
    map_bytes_ = static_cast<std::size_t>(size);
    return map_;
  }
  absl::Status WriteAt(std::uint64_t offset, std::string_view data) override {
    if (fd_ < 0) return absl::FailedPreconditionError("write to closed file " + QuoteValue(path_));
    while (!data.empty()) {
      const ssize_t n = ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return FileSystemError(errno, "write", path_);
      }
      data.remove_prefix(static_cast<std::size_t>(n));
      offset += static_cast<std::uint64_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    if (fd_ < 0) return absl::FailedPreconditionError("sync of closed file " + QuoteValue(path_));
    if (::fdatasync(fd_) != 0) return FileSystemError(errno, "fdatasync", path_);
    return absl::OkStatus();
  }
  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    Unmap();
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return FileSystemError(errno, "close", path_);
    return absl::OkStatus();
  }

 private:
  void Unmap() {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    map_ = nullptr;
  }
  int fd_;
  std::string path_;
  char* map_ = nullptr;
  std::size_t map_bytes_ = 0;
};

class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { ::close(fd_); }  // closing the descriptor drops the flock

 private:
  int fd_;
};

class Posix final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return FileSystemError(errno, "open", path);
    // flock: held per open file description, so a second open in this process
    // conflicts too (fcntl locks would not).
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        // The holder wrote its pid when it took the lock (below).
        char buf[32] = {};
        const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
        ::close(fd);
        std::string holder = "another process or store";
        if (n > 0) {
          std::string_view text(buf, static_cast<std::size_t>(n));
          while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
          if (!text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos) {
            holder = "process " + std::string(text);
          }
        }
        // Its own pid: another store of this process holds the lock (flock conflicts
        // between open file descriptions of one process too). The pid alone would
        // send the reader looking for another process.
        if (holder == "process " + std::to_string(::getpid())) {
          return absl::FailedPreconditionError(QuoteValue(path) +
                                               " is held by this process: another store in "
                                               "this process has this directory open");
        }
        return absl::FailedPreconditionError(QuoteValue(path) + " is held by " + holder +
                                             ": another store has this directory open");
      }
      ::close(fd);
      return FileSystemError(err, "flock", path);
    }
    // The holder's pid, for the error above (a diagnostic: the flock is the lock).
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
      const int err = errno;
      ::close(fd);
      return FileSystemError(err, "write pid to", path);
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(fd));
  }
  absl::StatusOr<std::string> ReadAt(const std::string& path, std::uint64_t offset,
                                     std::size_t n) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return FileSystemError(errno, "open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return FileSystemError(err, "fstat", path);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::FailedPreconditionError(QuoteValue(path) + " is not a regular file (" +
                                           FileKind(st.st_mode) + ")");
    }
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, out.data() + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        return FileSystemError(err, "read", path);
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    ::close(fd);
    if (got < n) {
      return absl::OutOfRangeError(QuoteValue(path) + " ends before byte " +
                                   std::to_string(offset + n) + " (read " +
                                   std::to_string(got) + " of " + std::to_string(n) +
                                   " bytes from offset " + std::to_string(offset) + ")");
    }
    return out;
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path) override {
    // O_RDWR, not O_WRONLY: a shared writable mapping (Map) needs read access too.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return FileSystemError(errno, "create", path);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return FileSystemError(errno, "open", path);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }
  absl::StatusOr<std::string> Read(const std::string& path) override {
    std::string out;
    if (absl::Status st = ReadInto(path, out); !st.ok()) return st;
    return out;
  }
  absl::Status ReadInto(const std::string& path, std::string& out) override {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. It is
    // cleared below, once the file is known to be regular (where it has no effect).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return FileSystemError(errno, "open", path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return FileSystemError(err, "fstat", path);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::FailedPreconditionError(QuoteValue(path) + " is not a regular file (" +
                                           FileKind(st.st_mode) + ")");
    }
    const std::uint64_t limit = MemoryBytes();
    if (static_cast<std::uint64_t>(st.st_size) > limit) {
      ::close(fd);
      return absl::ResourceExhaustedError(
          QuoteValue(path) + " is " + std::to_string(st.st_size) +
          " bytes, more than the machine's " + std::to_string(limit) +
          " bytes of memory: it cannot be read whole");
    }
    // Straight into `out`, whose memory a caller that reads file after file reuses
    // (no page faults on fresh memory per file): the size fstat gave, then whatever
    // the file grew by meanwhile, 64 KiB at a time.
    try {  // under a memory limit (ulimit -v, a cgroup) the string may not fit
      out.resize(static_cast<std::size_t>(st.st_size));
    } catch (const std::bad_alloc&) {
      ::close(fd);
      out.clear();
      return absl::ResourceExhaustedError("cannot allocate " + std::to_string(st.st_size) +
                                          " bytes to read " + QuoteValue(path));
    }
    std::size_t have = 0;
    for (;;) {
      if (have == out.size()) {
        if (out.size() + (std::size_t{1} << 16) > limit) {  // it grew while being read
          ::close(fd);
          out.clear();
          return absl::ResourceExhaustedError(QuoteValue(path) + " grew past the machine's " +
                                              std::to_string(limit) +
                                              " bytes of memory while being read");
        }
        try {
          out.resize(out.size() + (std::size_t{1} << 16));
        } catch (const std::bad_alloc&) {
          ::close(fd);
          const std::size_t want = out.size();
          out.clear();
          return absl::ResourceExhaustedError("cannot allocate " + std::to_string(want) +
                                              " bytes to read " + QuoteValue(path));
        }
      }
      const ssize_t n = ::read(fd, out.data() + have, out.size() - have);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        out.clear();
        return FileSystemError(err, "read", path);
      }
      if (n == 0) break;
      have += static_cast<std::size_t>(n);
    }
    ::close(fd);
    out.resize(have);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return FileSystemError(errno, "opendir", dir);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }
  absl::Status CreateDir(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("directory path is empty");
    std::string prefix;
    std::size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      prefix = dir.substr(0, pos);
      if (prefix.empty()) continue;
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return FileSystemError(errno, "mkdir", prefix);
      }
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return FileSystemError(errno, "stat", dir);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(QuoteValue(dir) + " exists and is not a directory");
    }
    return absl::OkStatus();
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return FileSystemError(errno, "rename", from);
    return absl::OkStatus();
  }
  absl::Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return FileSystemError(errno, "unlink", path);
    return absl::OkStatus();
  }
  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return FileSystemError(errno, "open", dir);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return FileSystemError(err, "fsync", dir);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<char*> WritableFile::Map(std::uint64_t) {
  return absl::UnimplementedError("this file system does not map files");
}

absl::Status FileSystem::ReadInto(const std::string& path, std::string& out) {
  absl::StatusOr<std::string> all = Read(path);
  if (!all.ok()) {
    out.clear();
    return all.status();
  }
  out = *std::move(all);
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileSystem::ReadAt(const std::string& path, std::uint64_t offset,
                                               std::size_t n) {
  absl::StatusOr<std::string> all = Read(path);
  if (!all.ok()) return all.status();
  if (offset > all->size() || all->size() - offset < n) {
    return absl::OutOfRangeError(QuoteValue(path) + " ends before byte " +
                                 std::to_string(offset + n) + " (it has " +
                                 std::to_string(all->size()) + " bytes)");
  }
  return all->substr(static_cast<std::size_t>(offset), n);
}

std::shared_ptr<FileSystem> PosixFileSystem() {
  // Never destroyed, like every static here that threads may use while std::exit runs.
  static const auto& fs = *new std::shared_ptr<FileSystem>(std::make_shared<Posix>());
  return fs;
}

}  // namespace inferq
