// SPDX-License-Identifier: Apache-2.0
#pragma once
// The PJRT lazy backend's device data (pjrt_backend.h): a PJRT buffer per datum, the uploads and
// downloads that make and read them, and the backend's counters they update. Shared by the
// backend's compile (pjrt_compile.cpp) and execution (pjrt_backend.cpp).

#include <torch/csrc/lazy/backend/backend_data.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/pjrt/client.h"
#include "xla/pjrt_backend.h"

namespace fulgur::xla::detail {

namespace lazy = torch::lazy;

// The backend's counters (pjrt_backend_metrics() copies them); read and write them holding
// metrics_mutex().
std::mutex& metrics_mutex();
PjrtBackendMetrics& metrics();

// Counts bytes moved host -> device (`up`) and device -> host (`down`).
void count_bytes(int64_t up, int64_t down);

// Device data of this backend: a PJRT buffer on the process's device. It derives from TSData
// because the TorchScript lowering casts every parameter to TSData to read `scalar`; numbers
// (MakeComputationDataFromScalar) stay plain TSData. A placeholder (CreateDataPlaceholder) has
// no buffer until the lazy core assigns it an execution's result. PJRT buffers are immutable,
// so the buffer is shared, never copied, when data is assigned.
class PjrtData : public lazy::TSData {
 public:
  PjrtData(const lazy::Shape& shape, const lazy::BackendDevice& device) : lazy::TSData(shape, device) {}
  PjrtData(std::shared_ptr<const pjrt::Buffer> buffer, const lazy::Shape& shape, const lazy::BackendDevice& device)
      : lazy::TSData(shape, device), buffer_(std::move(buffer)) {}

  bool HasValue() const override { return buffer_ != nullptr; }
  void Assign(const lazy::BackendData& data) override;

  const std::shared_ptr<const pjrt::Buffer>& buffer() const { return buffer_; }
  // The value after a graph updated this input in place (a batch norm's running statistics).
  void set_buffer(std::shared_ptr<const pjrt::Buffer> buffer) { buffer_ = std::move(buffer); }

 private:
  std::shared_ptr<const pjrt::Buffer> buffer_;
};

lazy::Shape shape_of(const at::Tensor& t);

// A new buffer on the process's device holding `t` (counted).
std::shared_ptr<const pjrt::Buffer> upload(const at::Tensor& t);

// The device buffer of a number a graph takes as an argument: tensor<f64> for a float, tensor<i64>
// for an int or bool (the emitter's number inputs), cached by value (see pjrt_data.cpp).
std::shared_ptr<const pjrt::Buffer> number_buffer(const at::Scalar& s);

// The CPU tensor of a device datum: downloaded from its buffer, or the TorchScript data's own.
// Throws std::logic_error for a placeholder that holds no value yet.
at::Tensor host_tensor(const lazy::BackendDataPtr& data);

}  // namespace fulgur::xla::detail
