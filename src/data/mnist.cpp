#include <fulgur/data/mnist.h>

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fulgur {
namespace {

uint32_t read_be32(std::istream& in) {
  unsigned char b[4];
  in.read(reinterpret_cast<char*>(b), 4);
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
}

std::string missing_hint(const std::string& root) {
  return " (data folder '" + root + "'; run scripts/install-deps to fetch MNIST into data/mnist)";
}

// Reads an IDX file with `dims` dimensions and the given magic number.
at::Tensor read_idx(const std::string& root, const std::string& name, uint32_t magic, int dims) {
  const std::string path = root + "/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("MNIST: cannot open " + path + missing_hint(root));
  const uint32_t got = read_be32(in);
  if (!in || got != magic) {
    throw std::runtime_error("MNIST: " + path + " has magic number " + std::to_string(got) + ", expected " +
                             std::to_string(magic) + "; the file is not an IDX file of this kind");
  }
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    const uint32_t v = read_be32(in);
    if (!in || v == 0 || v > 10'000'000) {
      throw std::runtime_error("MNIST: " + path + " has a bad header (dimension " + std::to_string(d) + ")");
    }
    shape.push_back(v);
    count *= v;
  }
  auto out = torch::empty(shape, torch::kUInt8);
  in.read(reinterpret_cast<char*>(out.data_ptr<uint8_t>()), count);
  if (in.gcount() != count) {
    throw std::runtime_error("MNIST: " + path + " is truncated: header says " + std::to_string(count) +
                             " bytes of data, file has " + std::to_string(in.gcount()));
  }
  return out;
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
