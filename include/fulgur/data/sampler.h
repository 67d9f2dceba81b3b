// SPDX-License-Identifier: Apache-2.0
#pragma once
// Samplers: which dataset indices an epoch visits, in which order.

#include <torch/arg.h>

#include <cstdint>
#include <vector>

namespace fulgur {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices of the current epoch, in order.
  virtual std::vector<int64_t> indices() const = 0;
  // How many indices indices() returns.
  virtual int64_t size() const = 0;
  // Reseeds the order for epoch `epoch` (shuffling samplers only).
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

// 0..n-1, or a permutation drawn from a generator seeded with seed + epoch
// (the same permutation torch.randperm gives in Python for that seed).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, bool shuffle, uint64_t seed) : n_(n), shuffle_(shuffle), seed_(seed) {}
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  bool shuffle_;
  uint64_t seed_;
};

// torch.utils.data.DistributedSampler: rank r of num_replicas takes every
// num_replicas-th index of the (shuffled) epoch order starting at r. Without
// drop_last the order is padded by repeating its start so every rank gets
// ceil(n / num_replicas) indices; with drop_last the tail is cut so every
// rank gets floor(n / num_replicas).
class DistributedSampler : public Sampler {
 public:
  // Example: DistributedSampler::Options().num_replicas(4).rank(1).seed(7)
  struct Options {
    TORCH_ARG(int64_t, num_replicas) = 1;
    TORCH_ARG(int64_t, rank) = 0;
    TORCH_ARG(bool, shuffle) = true;
    TORCH_ARG(uint64_t, seed) = 0;
    TORCH_ARG(bool, drop_last) = false;
  };
  // Throws std::invalid_argument for num_replicas < 1 or rank outside [0, num_replicas).
  DistributedSampler(int64_t dataset_size, Options options);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return num_samples_; }
  const Options& options() const { return options_; }

 private:
  int64_t n_;
  Options options_;
  int64_t num_samples_;
};

}  // namespace fulgur
