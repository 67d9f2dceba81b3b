// SPDX-License-Identifier: Apache-2.0
#include <fulgur/data/mnist.h>

#include "data/idx.h"

#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace fulgur {
namespace {

std::string missing_hint(const std::string& root) {
  return " (data folder '" + root + "'; run scripts/install-deps to fetch MNIST into data/mnist)";
}

at::Tensor read_idx(const std::string& root, const std::string& name, uint32_t magic, int dims) {
  return detail::read_idx_file(root + "/" + name, magic, dims, missing_hint(root));
}

}  // namespace

std::shared_ptr<TensorDataset> load_mnist(const std::string& root, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  auto images = read_idx(root, prefix + "-images-idx3-ubyte", 2051, 3);
  auto labels = read_idx(root, prefix + "-labels-idx1-ubyte", 2049, 1);
  if (images.size(0) != labels.size(0)) {
    throw std::runtime_error("MNIST: " + root + "/" + prefix + "-images-idx3-ubyte has " +
                             std::to_string(images.size(0)) + " images but the labels file has " +
                             std::to_string(labels.size(0)));
  }
  auto x = images.to(torch::kFloat32).div_(255.0).sub_(0.1307).div_(0.3081).unsqueeze(1);
  return std::make_shared<TensorDataset>(x.contiguous(), labels.to(torch::kInt64));
}

}  // namespace fulgur
