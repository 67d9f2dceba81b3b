// SPDX-License-Identifier: Apache-2.0
#pragma once
// Datasets: random access to samples, assembled into a batch in one call so a
// dataset held in memory collates with one gather instead of per-sample copies.

#include <fulgur/types.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace fulgur {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // The samples at `indices`, stacked along a new first dimension.
  // REQUIRES: every index in [0, size()). Thread safety: called concurrently
  // from loader worker threads; implementations must be const-safe.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
};

// Samples are rows of two tensors held in memory.
class TensorDataset : public Dataset {
 public:
  // REQUIRES: data.size(0) == target.size(0).
  TensorDataset(at::Tensor data, at::Tensor target);
  int64_t size() const override { return data_.size(0); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const at::Tensor& data() const { return data_; }
  const at::Tensor& target() const { return target_; }

 private:
  at::Tensor data_;
  at::Tensor target_;
};

// Samples [start, start + count) of another dataset (splits, fast tests).
class SubsetDataset : public Dataset {
 public:
  // Throws std::invalid_argument when the range is not inside the base dataset.
  SubsetDataset(std::shared_ptr<const Dataset> base, int64_t start, int64_t count);
  int64_t size() const override { return count_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t start_;
  int64_t count_;
};

}  // namespace fulgur
