// SPDX-License-Identifier: Apache-2.0
#pragma once
// Declared apart from the test that calls it, so that public_api.cpp sees
// nothing but <fulgur/fulgur.h>.

#include <string>
#include <vector>

namespace fulgur::testing {

// The public names public_api.cpp used, each once it worked.
std::vector<std::string> names_from_fulgur_h();

}  // namespace fulgur::testing
