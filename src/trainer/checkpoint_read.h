// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading the Trainer's own entries of a checkpoint (connectors/checkpoint_connector.cpp): every value is checked
// before it is used, and an error names the file (`where`), the dotted key and what was expected.

#include <fulgur/checkpoint.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fulgur::detail {

// Larger loop counts than any run reaches (2^53: still exact as the float scores that
// ModelCheckpoint keeps).
constexpr int64_t kMaxLoopCount = int64_t(1) << 53;

// checkpoint[path[0]][path[1]]...: state that fulgur's Trainer writes (the loop position, the
// generators). A checkpoint written elsewhere (Lightning keeps loops.fit_loop in another layout)
// may lack it; the error names the file, the whole key and what to do instead.
c10::IValue checkpoint_entry(const Checkpoint& checkpoint, const std::vector<std::string>& path, const std::string& where,
                             const c10::TypePtr& type = nullptr);

// `n`, the value under the dotted key `name`, if it is in [0, bound]; else an error naming the
// file, the key, the value and the bound, with `why` the bound is what it is.
int64_t check_count(int64_t n, const std::string& where, const std::string& name, int64_t bound, const std::string& why);

}  // namespace fulgur::detail
