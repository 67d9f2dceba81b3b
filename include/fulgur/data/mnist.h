// SPDX-License-Identifier: Apache-2.0
#pragma once
// MNIST from the four original IDX files (the names torch's MNIST reader uses).

#include <fulgur/data/dataset.h>

#include <memory>
#include <string>

namespace fulgur {

enum class Split { kTrain, kTest };

// Images as float [N, 1, 28, 28] normalized with MNIST's mean 0.1307 and
// std 0.3081; labels as int64 [N].
// Throws std::runtime_error naming the file when a file is missing, has the
// wrong magic number or is shorter than its header says.
std::shared_ptr<TensorDataset> load_mnist(const std::string& root, Split split);

}  // namespace fulgur
