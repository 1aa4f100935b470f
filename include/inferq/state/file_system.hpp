/// @file inferq/state/file_system.hpp
///
/// The file operations the Delta-State Log needs, behind an interface so that tests
/// can inject failures (EIO, ENOSPC) at any step and a host can put the log on its
/// own storage layer. `PosixFileSystem()` is the default: write(2), fdatasync(2),
/// rename(2), and fsync(2) of the directory.
///
/// Usage:
/// @code
///   inferq::StateStoreOptions o;
///   o.dir = "/var/lib/app/state";
///   o.file_system = std::make_shared<MyFaultyFileSystem>(inferq::PosixFileSystem());
/// @endcode
///
/// Errors: every call returns the errno of the failed system call as an absl::Status
/// (EIO -> kDataLoss, ENOSPC and EDQUOT -> kResourceExhausted, ENOENT -> kNotFound,
/// EEXIST -> kAlreadyExists, EROFS (a read-only mount), EACCES and EPERM ->
/// kPermissionDenied, as absl::ErrnoToStatusCode maps them; others -> kInternal)
/// whose message names the call and the path, then strerror: "open '/d/LOCK':
/// Read-only file system". FileSystemError() builds it, for other implementations.
///
/// Thread safety: a FileSystem may be called from several threads at once; one
/// WritableFile is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferq {

/// A file open for writing at explicit offsets (pwrite(2)). The log writes into
/// space it zero-filled ahead of time, so that a commit's fdatasync flushes data only,
/// not a file-size change.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  /// Writes all of `data` (bytes) at byte `offset`, extending the file if needed.
  virtual absl::Status WriteAt(std::uint64_t offset, std::string_view data) = 0;
  /// Makes the data written so far durable (fdatasync).
  virtual absl::Status Sync() = 0;
  /// Closes the file; later calls are errors. A mapping (Map) goes with it.
  virtual absl::Status Close() = 0;

  /// Optional, for appending without a system call per write. Map: the file's bytes
  /// [0, size) mapped shared and writable (MAP_SHARED), valid until Close or the
  /// file's destruction. Only bytes already written (WriteAt: the log writes zeros
  /// ahead, which allocates their blocks) may be touched: past the file's end a
  /// touch is SIGBUS, and in a hole it could find no space. PosixFileSystem maps
  /// files on ext4, xfs and tmpfs only (on a copy-on-write file system every write
  /// allocates, and a failed one would be SIGBUS).
  /// A byte copied there is in the page cache at once, as after WriteAt: it
  /// survives a crash of the process, and Sync makes it durable. kUnimplemented
  /// (the default) when this file cannot be mapped: callers then use WriteAt.
  virtual absl::StatusOr<char*> Map(std::uint64_t size);
};

/// An exclusive lock on a file, held until destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

/// The file operations of the Delta-State Log (see the file comment); PosixFileSystem()
/// is the default, a test or host may supply its own.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  /// Takes an exclusive lock on `path` (created if absent) without waiting:
  /// kFailedPrecondition when another holder, in this process or another, has it.
  /// The POSIX implementation writes the holder's pid into the file and names it in
  /// that error ("'/d/LOCK' is held by process 4242: another store has this
  /// directory open"), or says "is held by this process: another store in this
  /// process has this directory open" when the holder is the caller's own process.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path) = 0;
  /// Creates `path`, which must not exist.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path) = 0;
  /// Opens the existing `path` for writing; nothing in it changes until written.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) = 0;
  /// The whole content of the regular file `path`. The POSIX implementation returns
  /// kFailedPrecondition for anything else (a directory, a FIFO, a device: it never
  /// waits for a FIFO's writer) and kResourceExhausted for a file larger than the
  /// machine's physical memory (a sparse or damaged file), both naming the path.
  virtual absl::StatusOr<std::string> Read(const std::string& path) = 0;
  /// Read into `out` (its content replaced; empty after an error), so that a caller
  /// reading many files reuses one buffer's memory. The default calls Read;
  /// PosixFileSystem reads into `out`'s own memory. Errors as Read's.
  virtual absl::Status ReadInto(const std::string& path, std::string& out);
  /// `n` bytes of the regular file `path` from byte `offset` (pread(2)): exactly `n`
  /// bytes, or kOutOfRange naming the path when the file ends first. The default
  /// reads the whole file (Read) and slices it; PosixFileSystem reads only the range.
  virtual absl::StatusOr<std::string> ReadAt(const std::string& path, std::uint64_t offset,
                                             std::size_t n);
  /// Names (not paths) of the entries of directory `dir`.
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& dir) = 0;
  /// Creates directory `dir` (and its parents) if absent.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  /// rename(2): replaces `to` atomically.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  /// Removes the file `path`.
  virtual absl::Status Remove(const std::string& path) = 0;
  /// fsync(2) of directory `dir`: makes creations, renames and removals in it durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
};

/// The process-wide POSIX file system.
std::shared_ptr<FileSystem> PosixFileSystem();

/// The status PosixFileSystem returns when `call` (e.g. "open") on `path` failed with
/// errno `err` (see Errors above).
absl::Status FileSystemError(int err, const std::string& call, const std::string& path);

}  // namespace inferq
