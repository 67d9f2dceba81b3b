// SPDX-License-Identifier: Apache-2.0
#pragma once
// DeviceLoader: a loader whose batches arrive on a device. A background
// thread takes batches from the wrapped loader and copies them to the device
// while the current step runs; the consumer marks a step (on xla devices)
// before each batch is handed out, as torch_xla's MpDeviceLoader does. On a
// CUDA device the copies start from pinned host memory and do not block the
// host (PyTorch's pin_memory=True with non_blocking copies).

#include <fulgur/data/data_loader.h>

#include <c10/core/Device.h>

#include <functional>
#include <memory>

namespace fulgur {

class DeviceLoader : public BatchSource {
 public:
  // `before_batch` runs in the consumer's thread before each batch is handed
  // out (the step mark), with the batch about to be used.
  using BeforeBatch = std::function<void(const Batch&)>;
  DeviceLoader(std::shared_ptr<BatchSource> inner, c10::Device device, BeforeBatch before_batch = nullptr,
               int64_t prefetch = 2);
  int64_t num_batches() const override { return inner_->num_batches(); }
  void set_epoch(int64_t epoch) override { inner_->set_epoch(epoch); }
  std::unique_ptr<BatchStream> open(int64_t skip_batches = 0) override;
  const std::shared_ptr<BatchSource>& inner() const { return inner_; }
  c10::Device device() const { return device_; }

 private:
  std::shared_ptr<BatchSource> inner_;
  c10::Device device_;
  BeforeBatch before_batch_;
  int64_t prefetch_;
};

namespace detail {
// `loader` inside a DeviceLoader for `device` when that is a CUDA device and
// `loader` is not one already; else `loader` unchanged.
std::shared_ptr<BatchSource> cuda_device_loader(std::shared_ptr<BatchSource> loader, const c10::Device& device);
}  // namespace detail

}  // namespace fulgur
