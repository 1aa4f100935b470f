// PosixFileSystem: what the error of a second Lock says about its holder.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "inferq/state/file_system.hpp"
#include "state_test_util.hpp"

TEST_CASE("a lock held in this process says this process, not its own pid") {
  state_test::TempDir d;
  std::filesystem::create_directories(d.path());
  const std::string path = d / "LOCK";
  auto fs = inferq::PosixFileSystem();
  auto first = fs->Lock(path);
  REQUIRE(first.ok());
  auto second = fs->Lock(path);
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(second.status().message() ==
        "'" + path + "' is held by this process: another store in this process has this directory open");
  first->reset();  // released: the next opener gets it
  CHECK(fs->Lock(path).ok());
}

TEST_CASE("a lock held by another process names that process's pid") {
  state_test::TempDir d;
  std::filesystem::create_directories(d.path());
  const std::string path = d / "LOCK";
  int locked[2], release[2];
  REQUIRE(::pipe(locked) == 0);
  REQUIRE(::pipe(release) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Takes the lock, says so, and holds it until the parent writes (or goes).
    auto lock = inferq::PosixFileSystem()->Lock(path);
    const char ok = lock.ok() ? '1' : '0';
    (void)!::write(locked[1], &ok, 1);
    char c;
    (void)!::read(release[0], &c, 1);
    ::_exit(0);
  }
  ::close(locked[1]);
  ::close(release[0]);
  char ok = 0;
  REQUIRE(::read(locked[0], &ok, 1) == 1);
  REQUIRE(ok == '1');
  auto second = inferq::PosixFileSystem()->Lock(path);
  (void)!::write(release[1], "x", 1);
  ::close(release[1]);
  ::close(locked[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(second.status().message() == "'" + path + "' is held by process " + std::to_string(child) +
                                         ": another store has this directory open");
}
