// SPDX-License-Identifier: Apache-2.0
#include <fulgur/data/text.h>

#include <torch/torch.h>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur {

CharDataset::CharDataset(const std::string& text, int64_t block_size) : block_size_(block_size) {
  if (block_size < 1 || static_cast<int64_t>(text.size()) <= block_size) {
    throw std::invalid_argument("CharDataset: block_size " + std::to_string(block_size) +
                                " must be >= 1 and smaller than the text (" + std::to_string(text.size()) +
                                " characters)");
  }
  bool seen[256] = {};
  for (unsigned char c : text) seen[c] = true;
  for (int c = 0; c < 256; ++c) {
    stoi_[c] = -1;
    if (seen[c]) {
      stoi_[c] = static_cast<int>(itos_.size());
      itos_.push_back(static_cast<char>(c));
    }
  }
  tokens_ = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  int64_t* t = tokens_.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) t[i] = stoi_[static_cast<unsigned char>(text[i])];
}

std::shared_ptr<CharDataset> CharDataset::from_file(const std::string& path, int64_t block_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("CharDataset: cannot open " + path + " (run scripts/install-deps)");
  // The size comes from the file system, never from reading until the end
  // (a device such as /dev/zero has none): one allocation of that size, and
  // the tokens (8 bytes per character) must fit in memory's address range.
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw std::runtime_error("CharDataset: " + path + " is not a regular file");
  const uint64_t bytes = fs::file_size(path, ec);
  if (ec) throw std::runtime_error("CharDataset: cannot read the size of " + path + ": " + ec.message());
  if (bytes == 0) throw std::runtime_error("CharDataset: " + path + " is empty");
  constexpr uint64_t kMaxBytes = static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(int64_t);
  if (bytes > kMaxBytes) {
    throw std::runtime_error("CharDataset: " + path + " has " + std::to_string(bytes) + " bytes, more than the " +
                             std::to_string(kMaxBytes) + " whose tokens can be addressed");
  }
  std::string text(static_cast<size_t>(bytes), '\0');
  in.read(text.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<uint64_t>(in.gcount()) != bytes) {
    throw std::runtime_error("CharDataset: " + path + " has " + std::to_string(bytes) + " bytes, but only " +
                             std::to_string(in.gcount()) + " could be read (did the file shrink?)");
  }
  return std::make_shared<CharDataset>(text, block_size);
}

int64_t CharDataset::size() const { return tokens_.size(0) - block_size_; }

Batch CharDataset::get_batch(const std::vector<int64_t>& indices) const {
  const auto b = static_cast<int64_t>(indices.size());
  auto x = torch::empty({b, block_size_}, torch::kInt64);
  auto y = torch::empty({b, block_size_}, torch::kInt64);
  const int64_t* t = tokens_.data_ptr<int64_t>();
  int64_t* px = x.data_ptr<int64_t>();
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = indices[i];
    std::copy(t + s, t + s + block_size_, px + i * block_size_);
    std::copy(t + s + 1, t + s + 1 + block_size_, py + i * block_size_);
  }
  return {x, y};
}

std::string CharDataset::decode(const at::Tensor& ids) const {
  auto c = ids.to(torch::kCPU).to(torch::kInt64).contiguous();
  std::string out;
  const int64_t* p = c.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(itos_.at(p[i]));
  return out;
}

at::Tensor CharDataset::encode(const std::string& s) const {
  auto out = torch::empty({static_cast<int64_t>(s.size())}, torch::kInt64);
  for (size_t i = 0; i < s.size(); ++i) {
    const int id = stoi_[static_cast<unsigned char>(s[i])];
    if (id < 0) throw std::invalid_argument("CharDataset::encode: character '" + std::string(1, s[i]) + "' is not in the vocabulary");
    out[i] = id;
  }
  return out;
}

double CharDataset::unigram_entropy() const {
  auto counts = torch::bincount(tokens_).to(torch::kFloat64);
  auto p = counts / counts.sum();
  p = p.masked_select(p > 0);
  return -(p * p.log()).sum().item<double>();
}

}  // namespace fulgur
