// SPDX-License-Identifier: Apache-2.0
// fulgur-xla-ops: lists every op kind the `xla` device compiles to StableHLO, with its rule
// family, its per-op test against eager libtorch and the platforms with a variant of its rule
// (fulgur::xla::lowered_ops(), the rule table's own rows, so the listing is the table). A kind
// not listed falls back to the TorchScript interpreter.
//
// Usage: fulgur-xla-ops [--family NAME] [--version]
//   --family NAME   only the kinds of rule family NAME (elementwise, conv, ...)
// A usage error exits with 2, as fulgur's other programs.

#include <fulgur/version.h>
#include <fulgur/xla/ops.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace {

int usage(std::FILE* out, int code) {
  std::fprintf(out, "usage: fulgur-xla-ops [--family NAME] [--version]\n"
                    "Lists every op kind the xla device lowers to StableHLO: kind, rule family, per-op test,\n"
                    "platform variants of the rule.\n");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::string family;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return usage(stdout, 0);
    if (arg == "--version") {
      std::printf("fulgur-xla-ops (fulgur %s)\n", fulgur::version().c_str());
      return 0;
    }
    if (arg == "--family" && i + 1 < argc) {
      family = argv[++i];
      continue;
    }
    std::fprintf(stderr, "fulgur-xla-ops: unknown argument '%s'\n", arg.c_str());
    return usage(stderr, 2);
  }
  const std::vector<fulgur::xla::LoweredOp> ops = fulgur::xla::lowered_ops();
  std::set<std::string> families;
  for (const auto& op : ops) families.insert(op.family);
  if (!family.empty() && !families.count(family)) {
    std::string known;
    for (const auto& f : families) known += (known.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "fulgur-xla-ops: no rule family '%s' (the families: %s)\n", family.c_str(), known.c_str());
    return 2;
  }
  size_t kind_width = 4, family_width = 6, test_width = 4;
  for (const auto& op : ops) {
    kind_width = std::max(kind_width, op.kind.size());
    family_width = std::max(family_width, op.family.size());
    test_width = std::max(test_width, op.test.size());
  }
  auto row = [&](const std::string& kind, const std::string& f, const std::string& test, const std::string& platforms) {
    std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(kind_width), kind.c_str(), static_cast<int>(family_width),
                f.c_str(), static_cast<int>(test_width), test.c_str(), platforms.c_str());
  };
  row("KIND", "FAMILY", "TEST", "PLATFORMS");
  size_t listed = 0;
  for (const auto& op : ops) {
    if (!family.empty() && op.family != family) continue;
    std::string platforms;
    for (const auto& p : op.platforms) platforms += (platforms.empty() ? "" : ",") + p;
    row(op.kind, op.family, op.test, platforms.empty() ? "-" : platforms);
    ++listed;
  }
  std::printf("%zu op kinds in %zu rule families\n", listed, family.empty() ? families.size() : size_t{1});
  return 0;
}
