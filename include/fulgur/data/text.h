// SPDX-License-Identifier: Apache-2.0
#pragma once
// Character-level language modelling data: a text, its vocabulary, and
// windows of `block_size` characters whose targets are the next characters.

#include <fulgur/data/dataset.h>

#include <memory>
#include <string>

namespace fulgur {

class CharDataset : public Dataset {
 public:
  // REQUIRES: text.size() > block_size.
  CharDataset(const std::string& text, int64_t block_size);
  // Reads a text file; throws std::runtime_error naming a missing or empty file.
  static std::shared_ptr<CharDataset> from_file(const std::string& path, int64_t block_size);

  // Sample i is tokens [i, i + block_size) with targets [i + 1, i + block_size + 1).
  int64_t size() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

  int64_t vocab_size() const { return static_cast<int64_t>(itos_.size()); }
  int64_t block_size() const { return block_size_; }
  const at::Tensor& tokens() const { return tokens_; }
  std::string decode(const at::Tensor& ids) const;
  at::Tensor encode(const std::string& s) const;
  // Entropy of the character distribution in nats: the loss of a model that
  // ignores context.
  double unigram_entropy() const;

 private:
  at::Tensor tokens_;  // int64 [len]
  std::string itos_;
  int stoi_[256];
  int64_t block_size_;
};

}  // namespace fulgur
