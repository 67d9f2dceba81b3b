// SPDX-License-Identifier: Apache-2.0
#include <fulgur/data/sampler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <numeric>
#include <stdexcept>
#include <string>

namespace fulgur {
namespace {

// torch.randperm(n, generator=g) with g.manual_seed(seed): the same order as Python.
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto perm = at::randperm(n, gen, torch::kInt64);
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

}  // namespace

std::vector<int64_t> RandomSampler::indices() const {
  if (shuffle_) return permutation(n_, seed_ + static_cast<uint64_t>(epoch_));
  std::vector<int64_t> out(n_);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, Options options)
    : n_(dataset_size), options_(options) {
  if (options_.num_replicas() < 1) {
    throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1, got " +
                                std::to_string(options_.num_replicas()));
  }
  if (options_.rank() < 0 || options_.rank() >= options_.num_replicas()) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(options_.rank()) +
                                " is outside [0, " + std::to_string(options_.num_replicas()) + ")");
  }
  const int64_t r = options_.num_replicas();
  // torch: ceil((n - r) / r) with drop_last when n is not divisible, else ceil(n / r).
  if (options_.drop_last() && n_ % r != 0) {
    num_samples_ = (n_ - r + r - 1) / r;
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = (n_ + r - 1) / r;
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle()) {
    order = permutation(n_, options_.seed() + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(n_);
    std::iota(order.begin(), order.end(), 0);
  }
  const int64_t total = num_samples_ * options_.num_replicas();
  if (!options_.drop_last()) {
    // Pad by repeating the start of the order, as often as needed.
    const int64_t missing = total - n_;
    for (int64_t i = 0; i < missing && n_ > 0; ++i) order.push_back(order[i % n_]);
  } else {
    order.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = options_.rank(); i < total; i += options_.num_replicas()) mine.push_back(order[i]);
  return mine;
}

}  // namespace fulgur
