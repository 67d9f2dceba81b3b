// SPDX-License-Identifier: Apache-2.0
// The rule table itself: every rule row names a per-op test of this binary (the gtest registry
// holds every family's tests), and fulgur-xla-ops prints exactly the table's rows.

#include "support.h"

#include <fulgur/version.h>
#include <fulgur/xla/ops.h>

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

// The "Suite.Name" of every test registered in this binary.
std::set<std::string> registered_tests() {
  std::set<std::string> out;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j)
      out.insert(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
  }
  return out;
}

// The standard output of `command` (run by the shell) and its exit status.
std::pair<std::string, int> run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {"", -1};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  return {out, pclose(pipe)};
}

}  // namespace

// Every rule in the rule table (src/xla/stablehlo/rules/) names its per-op test (the third
// column of its row), and that test exists in this binary: adding a rule without one, or naming
// one that is not there, fails here.
TEST(XlaOps, EveryRuleOfTheTableHasAPerOpTest) {
  const std::vector<fulgur::xla::LoweredOp> ops = fulgur::xla::lowered_ops();
  ASSERT_GT(ops.size(), 100u);
  const std::set<std::string> tests = registered_tests();
  std::set<std::string> families;
  for (const auto& op : ops) {
    EXPECT_TRUE(tests.count(op.test)) << op.kind << ": its row names " << op.test << ", which is no test of this binary";
    EXPECT_FALSE(op.family.empty()) << op.kind;
    families.insert(op.family);
  }
  EXPECT_EQ(families, (std::set<std::string>{"conv", "elementwise", "index", "linalg", "loss", "norm", "pool", "random",
                                             "reduce", "shape", "softmax_loss", "upsample"}));
}

// fulgur-xla-ops prints a header, one line per row of the table (kind, family, test, platform
// variants or "-", in kind order) and a count; --family keeps one family's rows; an unknown
// family is an error naming the known ones; --version says fulgur's; an unknown argument exits
// with 2.
TEST(XlaOps, TheToolListsEveryRuleWithItsFamilyAndTest) {
  const std::vector<fulgur::xla::LoweredOp> ops = fulgur::xla::lowered_ops();
  const std::string tool = fulgur::testing::program("fulgur-xla-ops");
  const auto [out, status] = run(tool);
  ASSERT_EQ(status, 0) << out;
  std::vector<std::string> lines;
  std::string line;
  for (char c : out) {
    if (c != '\n') {
      line += c;
      continue;
    }
    lines.push_back(line);
    line.clear();
  }
  ASSERT_EQ(lines.size(), ops.size() + 2) << out;
  EXPECT_EQ(lines.front().substr(0, 4), "KIND");
  for (size_t i = 0; i < ops.size(); ++i) {
    char kind[256], family[256], test[256], platforms[256];
    ASSERT_EQ(std::sscanf(lines[i + 1].c_str(), "%255s %255s %255s %255s", kind, family, test, platforms), 4)
        << lines[i + 1];
    EXPECT_EQ(kind, ops[i].kind);
    EXPECT_EQ(family, ops[i].family);
    EXPECT_EQ(test, ops[i].test);
    std::string want = ops[i].platforms.empty() ? "-" : "";
    for (const auto& p : ops[i].platforms) want += (want.empty() ? "" : ",") + p;
    EXPECT_EQ(platforms, want);
  }
  EXPECT_EQ(lines.back(), std::to_string(ops.size()) + " op kinds in 12 rule families");

  const auto [conv, conv_status] = run(tool + " --family conv");
  EXPECT_EQ(conv_status, 0);
  EXPECT_NE(conv.find("aten::convolution_backward"), std::string::npos) << conv;
  // The convolution's platform rules: libtorch's kernels, then XLA:CPU's shifted sum.
  EXPECT_TRUE(std::regex_search(
      conv, std::regex("\naten::convolution +conv +StableHlo\\.ConvolutionAndItsBackward +host_kernels,xla_cpu\n")))
      << conv;
  EXPECT_EQ(conv.find("aten::tanh"), std::string::npos) << conv;
  EXPECT_NE(conv.find("\n2 op kinds in 1 rule families\n"), std::string::npos) << conv;

  EXPECT_EQ(run(tool + " --version").first, "fulgur-xla-ops (fulgur " + fulgur::version() + ")\n");
  const auto [junk, junk_status] = run(tool + " --families 2>&1");
  EXPECT_EQ(WEXITSTATUS(junk_status), 2);
  EXPECT_NE(junk.find("unknown argument '--families'"), std::string::npos) << junk;

  const auto [bad, bad_status] = run(tool + " --family convolutions 2>&1");
  EXPECT_NE(bad_status, 0);
  EXPECT_NE(bad.find("no rule family 'convolutions' (the families: conv, elementwise,"), std::string::npos) << bad;
}
