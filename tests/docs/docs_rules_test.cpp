// docs_rules.hpp: the rules check_docs applies to the repository's Markdown, each on
// the smallest input that shows it.
#include "docs_rules.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

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

// --- What GitHub renders, on inputs that broke the rules before. ---

TEST_CASE("a fence closes only on its own character, at least as long, with nothing after") {
  // "```cpp x" inside a ``` block is content; the block ends at the bare ```.
  CHECK(FencedLines(SplitLines("```sh\n```cpp x\n```\n## After\n")) ==
        std::vector<bool>{true, true, true, false});
  // A 4-backtick block shows a 3-backtick one.
  CHECK(FencedLines(SplitLines("````md\n```cpp\n```\n````\nafter\n")) ==
        std::vector<bool>{true, true, true, true, false});
  CHECK(FencedLines(SplitLines("~~~\n```\n~~~\nafter\n")) ==
        std::vector<bool>{true, true, true, false});
  CHECK(FencedLines(SplitLines("```\nx\n`````\nafter\n")) ==
        std::vector<bool>{true, true, true, false});
  CHECK(FencedLines(SplitLines("``` a`b\nnot a fence\n")) == std::vector<bool>{false, false});
  CHECK(FencedLines(SplitLines("```\nnever closed\n")) == std::vector<bool>{true, true});
  CHECK(FencedLines(SplitLines("")).empty());
  // CRLF and a last line without a newline.
  CHECK(SplitLines("a\r\nb") == std::vector<std::string_view>{"a", "b"});
  // A run of two backticks does not close a span of one.
  CHECK(WithoutCodeSpans("`a`` [l](x.md)") == "`a`` [l](x.md)");
}

TEST_CASE("slugs drop emoji, dashes and arrows, lowercase every script, and read the rendered text") {
  CHECK(GithubSlug("\xF0\x9F\x9A\x80 Launch") == "-launch");                     // emoji
  CHECK(GithubSlug("\xE2\x9A\xA0\xEF\xB8\x8F Warning") == "\xEF\xB8\x8F-warning");  // VS16 is a mark
  CHECK(GithubSlug("\xC3\x84rger") == "\xC3\xA4rger");                           // Ä -> ä
  CHECK(GithubSlug("\xCE\x91\xCE\x92\xCE\x93 \xD0\x9F\xD0\xA0\xD0\x98") ==
        "\xCE\xB1\xCE\xB2\xCE\xB3-\xD0\xBF\xD1\x80\xD0\xB8");                  // ΑΒΓ ПРИ
  CHECK(GithubSlug("Publish \xE2\x86\x92 deliver") == "publish--deliver");        // →
  CHECK(GithubSlug("em\xE2\x80\x94" "dash") == "emdash");                         // —
  CHECK(GithubSlug("a\xC2\xA0" "b \xC2\xB5s") == "ab-\xC2\xB5s");               // NBSP; µ stays
  CHECK(GithubSlug("Title <a id=\"x\"></a>") == "title-");
  CHECK(GithubSlug("`<T>` type") == "t-type");
  CHECK(GithubSlug("_Emphasis_ and max_ack_pending") == "emphasis-and-max_ack_pending");
  CHECK(GithubSlug("__init__ here") == "init-here");
  CHECK(GithubSlug("![logo](l.png) Name") == "-name");
  CHECK(GithubSlug("AT&amp;T") == "att");
  CHECK(GithubSlug("[ref link][r] x") == "ref-link-x");
  CHECK(GithubSlug("<https://example.com>") == "httpsexamplecom");
  CHECK(GithubSlug("C\\_D") == "c_d");
}

TEST_CASE("anchors: repeated slugs as github-slugger numbers them, setext, indented, HTML ids") {
  CHECK(Anchors("## Foo 1\n## Foo\n## Foo\n") ==
        std::set<std::string>{"foo-1", "foo", "foo-2"});
  CHECK(Anchors("   ## Indented\n    ## Code, not a heading\n") ==
        std::set<std::string>{"indented"});
  CHECK(Anchors("Setext one\n==========\n\nSetext two\n---\n\n- item\n---\n\n---\n") ==
        std::set<std::string>{"setext-one", "setext-two"});
  CHECK(Anchors("<!--\n## Commented\n-->\n# Shown\n") == std::set<std::string>{"shown"});
  CHECK(Anchors("`<a id=\"code\"></a>` <a name='single'></a> <h3 id=h3>x</h3>\n") ==
        std::set<std::string>{"single", "h3"});
  CHECK(Anchors("# C#\n#\n") == std::set<std::string>{"c"});
}

TEST_CASE("links: footnotes are not definitions; HTML src and href count; comments do not") {
  const std::vector<Link> links = Links(
      "[^1]: A footnote, not a link.\n"
      "[ref]: <a b.md> \"Title\"\n"
      "<img src=\"img/x.png\"> <a href='docs/'>docs</a>\n"
      "text <!-- [hidden](h.md) --> [shown](<s p.md> \"t\")\n"
      "<!--\n[hidden too](h2.md)\n-->\n"
      "````md\n```\n[in fence](f.md)\n```\n````\n"
      "[after](y.md#z)\n");
  REQUIRE(links.size() == 5);
  CHECK(links[0].line == 2);
  CHECK(links[0].target == "a b.md");
  CHECK(links[1].target == "img/x.png");
  CHECK(links[2].target == "docs/");
  CHECK(links[3].line == 4);
  CHECK(links[3].target == "s p.md");
  CHECK(links[4].line == 13);
  CHECK(links[4].target == "y.md#z");
}

TEST_CASE("link targets as GitHub resolves them") {
  CHECK(IsExternal("HTTPS://example.com/x"));
  CHECK(IsExternal("tel:+123"));
  CHECK(IsExternal("//example.com/x"));
  CHECK_FALSE(IsExternal("docs/a.md"));
  CHECK_FALSE(IsExternal("#x:y"));
  const LinkTarget t = ParseLinkTarget("my%20file.md?plain=1#gr%C3%B6%C3%9Fe");
  CHECK(t.path == "my file.md");
  CHECK_FALSE(t.from_root);
  CHECK(t.anchor == "gr\xC3\xB6\xC3\x9F" "e");
  const LinkTarget r = ParseLinkTarget("/docs/x.md");
  CHECK(r.path == "docs/x.md");
  CHECK(r.from_root);
  CHECK(IsLineAnchor("L12"));
  CHECK(IsLineAnchor("L1-L3"));
  CHECK_FALSE(IsLineAnchor("L"));
  CHECK_FALSE(IsLineAnchor("L1-"));
  CHECK_FALSE(IsLineAnchor("l12"));
  CHECK_FALSE(IsLineAnchor("L1-2"));
}

TEST_CASE("links checked against a tree: outside it, too long a name, folders, lines of code") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "inferq_docs_rules_test_tree";
  fs::remove_all(root);
  fs::create_directories(root / "docs" / "guide");
  fs::create_directories(root / "src");
  std::ofstream(root / "docs" / "guide" / "README.md") << "# Guide\n";
  std::ofstream(root / "src" / "a.cpp") << "int a;\n";
  std::ofstream(root.parent_path() / "inferq_docs_rules_test_outside.md") << "# Out\n";
  const std::string text =
      "[a](../inferq_docs_rules_test_outside.md) [b](" + std::string(300, 'x') + ".md)\n"
      "[c](docs/guide/#guide) [d](docs/guide#nope) [e](src/a.cpp#L1-L2) [f](src/a.cpp#top)\n"
      "[g](/src/a.cpp) [h](/nothing.md) [i](docs/guide/README.md#guide)\n";
  AnchorCache anchors;
  int checked = 0;
  std::vector<std::string> got;
  for (const Finding& f : LinkFindings(root, "README.md", text, anchors, checked)) {
    got.push_back(f.Text());
  }
  CHECK(checked == 9);
  CHECK(got == std::vector<std::string>{
                   "README.md:1: links to '../inferq_docs_rules_test_outside.md': it leaves the "
                   "repository",
                   "README.md:1: links to '" + std::string(300, 'x') + ".md': no file '" +
                       std::string(300, 'x') + ".md'",
                   "README.md:2: links to 'docs/guide#nope': 'docs/guide/README.md' has no heading "
                   "with anchor 'nope'",
                   "README.md:2: links to 'src/a.cpp#top': only a Markdown file has anchors "
                   "(another file has its lines': #L12)",
                   "README.md:3: links to '/nothing.md': no file 'nothing.md'"});
  fs::remove_all(root);
  fs::remove(root.parent_path() / "inferq_docs_rules_test_outside.md");
}

TEST_CASE("a commit named in a code span right after the word commit is still a commit") {
  CHECK(CommitId("a release build at commit `17771aa` (2026-12-02)") == "17771aa");
  CHECK(CommitId("Commit: [`d543fa4`](https://x/commit/d543fa4)") == "d543fa4");
  CHECK(CommitId("the hash `7c2bfb0` in sample output") == "");
  CHECK(CommitId("git commit `--amend`") == "");
  CHECK(CommitId("commit `deadbeef`, no digit") == "");
  // A sentence wrapped between "commit" and the code span.
  CHECK(CommitIdAfter("(release build at commit", "`d543fa4`, 2026-12-05, 59 s):") == "d543fa4");
  CHECK(CommitIdAfter("we recommit", "`d543fa4` here") == "");
  CHECK(CommitIdAfter("no such word", "`d543fa4` here") == "");
}

TEST_CASE("the newest release skips a heading in a code block and a lower-case Unreleased") {
  CHECK(NewestRelease("# Changelog\n```md\n## [9.9.9]\n```\n## [unreleased]\n## [0.2.0]\n") ==
        std::pair<std::string, int>{"0.2.0", 6});
}
