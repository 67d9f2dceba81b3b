// SPDX-License-Identifier: Apache-2.0
#pragma once
// DataLoader: batches of a Dataset in the order of a Sampler, optionally
// prepared ahead by worker threads.

#include <fulgur/data/dataset.h>
#include <fulgur/data/sampler.h>

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace fulgur {

// One pass over a loader. Not thread safe: one consumer.
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  // The next batch, or nullopt at the end of the epoch.
  virtual std::optional<Batch> next() = 0;
};

// Anything the training loop can iterate: a DataLoader, or a loader wrapped
// by a strategy (see DeviceLoader).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Batches in one epoch.
  virtual int64_t num_batches() const = 0;
  // Selects the epoch whose order the next open() yields.
  virtual void set_epoch(int64_t epoch) = 0;
  // Starts an epoch, skipping its first `skip_batches` batches (resume).
  virtual std::unique_ptr<BatchStream> open(int64_t skip_batches = 0) = 0;
};

struct DataLoaderOptions {
  explicit DataLoaderOptions(int64_t batch_size = 1) : batch_size_(batch_size) {}
  // Samples per batch. Must be >= 1.
  TORCH_ARG(int64_t, batch_size);
  // Visit samples in a new random order each epoch (seeded by seed + epoch).
  TORCH_ARG(bool, shuffle) = false;
  TORCH_ARG(uint64_t, seed) = 0;
  // Drop the last batch when it is smaller than batch_size.
  TORCH_ARG(bool, drop_last) = false;
  // Threads that assemble batches ahead of the consumer; 0 assembles them in
  // the consumer's thread. On a machine shared by several workers, 0 or 1.
  TORCH_ARG(int64_t, num_workers) = 0;
  // Batches each worker keeps ready.
  TORCH_ARG(int64_t, prefetch_factor) = 2;
};

class DataLoader : public BatchSource {
 public:
  // Throws std::invalid_argument for batch_size < 1, num_workers < 0,
  // prefetch_factor < 1 or a null dataset.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = DataLoaderOptions());

  int64_t num_batches() const override;
  void set_epoch(int64_t epoch) override { sampler_->set_epoch(epoch); }
  std::unique_ptr<BatchStream> open(int64_t skip_batches = 0) override;
  // The dataset indices of each batch of the current epoch, in the order
  // open(0) yields them (what a prediction writer receives as batch_indices).
  std::vector<std::vector<int64_t>> batch_indices() const;

  // A loader over the same dataset and options that takes its indices from
  // `sampler` (the slot a distributed strategy fills).
  std::shared_ptr<DataLoader> with_sampler(std::shared_ptr<Sampler> sampler) const;

  const DataLoaderOptions& options() const { return options_; }
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  const Sampler& sampler() const { return *sampler_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
};

}  // namespace fulgur
