// SPDX-License-Identifier: Apache-2.0
#include <fulgur/data/data_loader.h>

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace fulgur {
namespace {

// The index lists of an epoch's batches, from batch `skip` on.
std::vector<std::vector<int64_t>> epoch_batches(const Sampler& sampler, int64_t batch_size, bool drop_last,
                                                int64_t skip) {
  std::vector<int64_t> order = sampler.indices();
  std::vector<std::vector<int64_t>> out;
  const auto n = static_cast<int64_t>(order.size());
  for (int64_t start = skip * batch_size; start < n; start += batch_size) {
    const int64_t end = std::min(n, start + batch_size);
    if (drop_last && end - start < batch_size) break;
    out.emplace_back(order.begin() + start, order.begin() + end);
  }
  return out;
}

// Assembles batches in the consumer's thread.
class InlineStream : public BatchStream {
 public:
  InlineStream(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches)
      : dataset_(std::move(dataset)), batches_(std::move(batches)) {}
  std::optional<Batch> next() override {
    if (pos_ >= batches_.size()) return std::nullopt;
    return dataset_->get_batch(batches_[pos_++]);
  }

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::vector<int64_t>> batches_;
  size_t pos_ = 0;
};

// Worker threads assemble batches ahead; batches come out in order. Worker w
// builds batches w, w + W, w + 2W, ... and stops `depth` batches ahead.
class PrefetchStream : public BatchStream {
 public:
  PrefetchStream(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches,
                 int64_t workers, int64_t depth)
      : dataset_(std::move(dataset)), batches_(std::move(batches)), ready_(batches_.size()),
        depth_(std::max<int64_t>(depth, workers)) {
    for (int64_t w = 0; w < workers; ++w) threads_.emplace_back([this, w, workers] { work(w, workers); });
  }
  ~PrefetchStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  std::optional<Batch> next() override {
    if (pos_ >= batches_.size()) return std::nullopt;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_[pos_].has_value() || error_; });
    if (error_) std::rethrow_exception(error_);
    Batch b = std::move(*ready_[pos_]);
    ready_[pos_].reset();
    ++pos_;
    lock.unlock();
    cv_.notify_all();
    return b;
  }

 private:
  void work(int64_t first, int64_t stride) {
    for (size_t i = first; i < batches_.size(); i += stride) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(i - pos_) < depth_; });
        if (stop_) return;
      }
      try {
        Batch b = dataset_->get_batch(batches_[i]);
        std::lock_guard<std::mutex> lock(mu_);
        ready_[i] = std::move(b);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
      }
      cv_.notify_all();
    }
  }

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::vector<int64_t>> batches_;
  std::vector<std::optional<Batch>> ready_;
  int64_t depth_;
  size_t pos_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (!dataset_) throw std::invalid_argument("DataLoader: dataset is null");
  if (options_.batch_size() < 1) {
    throw std::invalid_argument("DataLoader: batch_size must be >= 1, got " + std::to_string(options_.batch_size()));
  }
  if (options_.num_workers() < 0) {
    throw std::invalid_argument("DataLoader: num_workers must be >= 0, got " + std::to_string(options_.num_workers()));
  }
  if (options_.prefetch_factor() < 1) {
    throw std::invalid_argument("DataLoader: prefetch_factor must be >= 1, got " +
                                std::to_string(options_.prefetch_factor()));
  }
  sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.shuffle(), options_.seed());
}

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_->size();
  const int64_t b = options_.batch_size();
  return options_.drop_last() ? n / b : (n + b - 1) / b;
}

std::unique_ptr<BatchStream> DataLoader::open(int64_t skip_batches) {
  auto batches = epoch_batches(*sampler_, options_.batch_size(), options_.drop_last(), skip_batches);
  if (options_.num_workers() == 0) return std::make_unique<InlineStream>(dataset_, std::move(batches));
  return std::make_unique<PrefetchStream>(dataset_, std::move(batches), options_.num_workers(),
                                          options_.num_workers() * options_.prefetch_factor());
}

std::vector<std::vector<int64_t>> DataLoader::batch_indices() const {
  return epoch_batches(*sampler_, options_.batch_size(), options_.drop_last(), 0);
}

std::shared_ptr<DataLoader> DataLoader::with_sampler(std::shared_ptr<Sampler> sampler) const {
  if (!sampler) throw std::invalid_argument("DataLoader::with_sampler: sampler is null");
  auto copy = std::make_shared<DataLoader>(*this);
  sampler->set_epoch(sampler_->epoch());
  copy->sampler_ = std::move(sampler);
  return copy;
}

}  // namespace fulgur
