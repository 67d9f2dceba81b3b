// SPDX-License-Identifier: Apache-2.0
#include <fulgur/data/dataset.h>

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace fulgur {

TensorDataset::TensorDataset(at::Tensor data, at::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (data_.size(0) != target_.size(0)) {
    throw std::invalid_argument("TensorDataset: data has " + std::to_string(data_.size(0)) +
                                " rows but target has " + std::to_string(target_.size(0)));
  }
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  auto idx = torch::from_blob(const_cast<int64_t*>(indices.data()),
                              {static_cast<int64_t>(indices.size())}, torch::kInt64);
  return {data_.index_select(0, idx), target_.index_select(0, idx)};
}

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, int64_t start, int64_t count)
    : base_(std::move(base)), start_(start), count_(count) {
  if (!base_) throw std::invalid_argument("SubsetDataset: base dataset is null");
  if (start < 0 || count < 0 || start + count > base_->size()) {
    throw std::invalid_argument("SubsetDataset: range [" + std::to_string(start) + ", " + std::to_string(start + count) +
                                ") is not inside the base dataset's [0, " + std::to_string(base_->size()) + ")");
  }
}

Batch SubsetDataset::get_batch(const std::vector<int64_t>& indices) const {
  if (start_ == 0) return base_->get_batch(indices);
  std::vector<int64_t> shifted(indices);
  for (auto& i : shifted) i += start_;
  return base_->get_batch(shifted);
}

}  // namespace fulgur
