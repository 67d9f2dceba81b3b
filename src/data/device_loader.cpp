// SPDX-License-Identifier: Apache-2.0
#include <fulgur/data/device_loader.h>

#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace fulgur {
namespace {

class DeviceStream : public BatchStream {
 public:
  DeviceStream(std::unique_ptr<BatchStream> inner, c10::Device device, DeviceLoader::BeforeBatch before_batch,
               int64_t depth)
      : inner_(std::move(inner)), device_(device), before_batch_(std::move(before_batch)), depth_(depth) {
    thread_ = std::thread([this] { run(); });
  }
  ~DeviceStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::optional<Batch> next() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || done_ || error_; });
    if (error_) std::rethrow_exception(error_);
    if (queue_.empty()) return std::nullopt;
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    cv_.notify_all();
    if (before_batch_) before_batch_(b);
    return b;
  }

 private:
  // To the device; to a CUDA device from pinned memory and without blocking: the copy runs on
  // the device's current stream, ordered before the step that uses it, and the caching host
  // allocator keeps the pinned buffer until the copy is done.
  at::Tensor copy(const at::Tensor& t) const {
    if (!t.defined()) return t;
    if (!device_.is_cuda() || !t.device().is_cpu()) return t.to(device_);
    return (t.is_pinned() ? t : t.pin_memory()).to(device_, /*non_blocking=*/true);
  }

  void run() {
    try {
      while (true) {
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < depth_; });
          if (stop_) return;
        }
        auto b = inner_->next();
        if (!b) break;
        Batch moved{copy(b->data), copy(b->target)};
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(moved));
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

  std::unique_ptr<BatchStream> inner_;
  c10::Device device_;
  DeviceLoader::BeforeBatch before_batch_;
  int64_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  bool done_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

DeviceLoader::DeviceLoader(std::shared_ptr<BatchSource> inner, c10::Device device, DeviceLoader::BeforeBatch before_batch,
                           int64_t prefetch)
    : inner_(std::move(inner)), device_(device), before_batch_(std::move(before_batch)), prefetch_(prefetch) {
  if (!inner_) throw std::invalid_argument("DeviceLoader: the wrapped loader is null");
  if (prefetch_ < 1) throw std::invalid_argument("DeviceLoader: prefetch must be >= 1, got " + std::to_string(prefetch_));
}

std::unique_ptr<BatchStream> DeviceLoader::open(int64_t skip_batches) {
  return std::make_unique<DeviceStream>(inner_->open(skip_batches), device_, before_batch_, prefetch_);
}

namespace detail {
std::shared_ptr<BatchSource> cuda_device_loader(std::shared_ptr<BatchSource> loader, const c10::Device& device) {
  if (!loader || !device.is_cuda() || std::dynamic_pointer_cast<DeviceLoader>(loader)) return loader;
  return std::make_shared<DeviceLoader>(std::move(loader), device);
}
}  // namespace detail

}  // namespace fulgur
