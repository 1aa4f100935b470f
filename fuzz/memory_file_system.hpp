// An in-memory, read-only FileSystem holding one directory of named files: lets the
// fuzz targets run recovery on bytes the fuzzer made, without touching the disk.
#pragma once

#include <map>
#include <string>

#include "inferq/state/file_system.hpp"

namespace inferq_fuzz {

class MemoryFileSystem final : public inferq::FileSystem {
 public:
  std::map<std::string, std::string> files;  // name -> bytes, all in directory "mem"

  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> Create(const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::StatusOr<std::unique_ptr<inferq::WritableFile>> OpenForWrite(const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::StatusOr<std::unique_ptr<inferq::FileLock>> Lock(const std::string&) override {
    return std::make_unique<inferq::FileLock>();
  }
  absl::StatusOr<std::string> Read(const std::string& path) override {
    auto it = files.find(path.substr(path.rfind('/') + 1));
    if (it == files.end()) return absl::NotFoundError(path);
    return it->second;
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string&) override {
    std::vector<std::string> names;
    for (const auto& [name, bytes] : files) names.push_back(name);
    return names;
  }
  absl::Status CreateDir(const std::string&) override { return absl::OkStatus(); }
  absl::Status Rename(const std::string&, const std::string&) override {
    return absl::UnimplementedError("read-only");
  }
  absl::Status Remove(const std::string&) override { return absl::UnimplementedError("read-only"); }
  absl::Status SyncDir(const std::string&) override { return absl::OkStatus(); }
};

}  // namespace inferq_fuzz
