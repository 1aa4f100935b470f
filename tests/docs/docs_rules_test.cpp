// docs_rules.hpp: the rules check_docs applies to the repository's Markdown, each on
// the smallest input that shows it.
#include "docs_rules.hpp"

#include <catch2/catch.hpp>

using namespace inferq_docs;

TEST_CASE("headings get GitHub's anchors") {
  CHECK(GithubSlug("Streams and consumers") == "streams-and-consumers");
  CHECK(GithubSlug("The NATS bridge: past one process") == "the-nats-bridge-past-one-process");
  CHECK(GithubSlug("`Engine::Create` and `Close()`") == "enginecreate-and-close");
  CHECK(GithubSlug("Durable replay: crash and resume") == "durable-replay-crash-and-resume");
  CHECK(GithubSlug("Metrics: Prometheus (optional)") == "metrics-prometheus-optional");
  CHECK(GithubSlug("max_ack_pending / max_deliver") == "max_ack_pending--max_deliver");
  CHECK(GithubSlug("[The guide](guide.md) index") == "the-guide-index");
  CHECK(GithubSlug("Größe") == "größe");
  const std::set<std::string> a = Anchors(
      "# Top\n"
      "## Options\n"
      "text <a id=\"kept-here\"></a>\n"
      "```sh\n"
      "# not a heading\n"
      "```\n"
      "## Options\n"
      "### Options ##\n"
      "#NoSpace\n");
  CHECK(a == std::set<std::string>{"top", "options", "options-1", "options-2", "kept-here"});
}

TEST_CASE("links are found outside code, with their anchors") {
  const std::vector<Link> links = Links(
      "See [a](a.md#x) and ![img](../images/r.png \"title\").\n"
      "`[not](code.md)` and [ext](https://example.com/x.md)\n"
      "```md\n"
      "[in fence](fence.md)\n"
      "```\n"
      "[ref]: b.md#y\n"
      "[self](#here) [angle](<c d.md>)\n");
  REQUIRE(links.size() == 6);
  CHECK(links[0].line == 1);
  CHECK(links[0].target == "a.md#x");
  CHECK(links[1].target == "../images/r.png");
  CHECK(links[2].line == 2);
  CHECK(links[2].target == "https://example.com/x.md");
  CHECK(IsExternal(links[2].target));
  CHECK(links[3].line == 6);
  CHECK(links[3].target == "b.md#y");
  CHECK(links[4].target == "#here");
  CHECK(links[5].target == "c d.md");
}

TEST_CASE("issue mentions are found in prose, not in code spans") {
  CHECK(IssueMention("as issue 15's fifth round showed") == "issue 15");
  CHECK(IssueMention("Issues 12-14 found") == "Issues 12");
  CHECK(IssueMention("fixed (issue #3)") == "issue #3");
  CHECK(IssueMention("see #37 for details") == "#37");
  CHECK(IssueMention("(#37)") == "#37");
  CHECK(IssueMention("an issue with 3 replicas") == "");
  CHECK(IssueMention("reissue 5 times") == "");
  CHECK(IssueMention("`issue 15` in code") == "");
  CHECK(IssueMention("#include <x>") == "");
  CHECK(IssueMention("C#7 and a#1") == "");
  CHECK(IssueMention("# 5 replicas") == "");
}

TEST_CASE("commit ids are found in prose, not in code or link targets") {
  CHECK(CommitId("at commit 7c2bfb0 the build took") == "7c2bfb0");
  CHECK(CommitId("(commit ce6a22f):") == "ce6a22f");
  CHECK(CommitId("range 85c462f..598a404") == "85c462f");
  CHECK(CommitId("full 42107a4c195b55e6f12db0d0359e0c3b13f31bfb28a") == "");  // 41 digits
  CHECK(CommitId("the word deadbeef has no digit") == "");
  CHECK(CommitId("2026120 has no letter") == "");
  CHECK(CommitId("`7c2bfb0` in a code span") == "");
  CHECK(CommitId("[the data](https://x/commit/6ea57973)") == "");
  CHECK(CommitId("abc1234x is a longer word") == "");
  CHECK(CommitId("file_7c2bfb0.md") == "");
  CHECK(CommitId("a1b2c3d.md is a file") == "");
  CHECK(CommitId("ends a sentence 7c2bfb0.") == "7c2bfb0");
  CHECK(CommitId("1e6 and 3.5e10 are numbers") == "");
  CHECK(CommitId("signed with ed25519 keys") == "");
}

TEST_CASE("fenced blocks end at their own fence") {
  const auto lines = SplitLines("a\n```\nb\n~~~\nc\n```\nd\n");
  CHECK(FencedLines(lines) == std::vector<bool>{false, true, true, true, true, true, false});
  CHECK(WithoutCodeSpans("x `a` y ``b`c`` z `open") == "x     y         z `open");
}

TEST_CASE("the newest release of a changelog skips Unreleased") {
  CHECK(NewestRelease("# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-06\n## [0.1.0]\n") ==
        std::pair<std::string, int>{"0.2.0", 5});
  CHECK(NewestRelease("# Changelog\n## [Unreleased]\n") == std::pair<std::string, int>{"", 0});
}
