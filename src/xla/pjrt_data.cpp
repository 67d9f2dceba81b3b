// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt_data.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_impl.h>
#include <torch/csrc/lazy/core/tensor_util.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "xla/pjrt/tensors.h"

namespace fulgur::xla {
namespace detail {

std::mutex& metrics_mutex() {
  static std::mutex mu;
  return mu;
}

PjrtBackendMetrics& metrics() {
  static PjrtBackendMetrics m;
  return m;
}

void count_bytes(int64_t up, int64_t down) {
  std::lock_guard<std::mutex> lock(metrics_mutex());
  metrics().bytes_to_device += up;
  metrics().bytes_to_host += down;
}

lazy::Shape shape_of(const at::Tensor& t) {
  return lazy::Shape(t.scalar_type(), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
}

std::shared_ptr<const pjrt::Buffer> upload(const at::Tensor& t) {
  auto b = std::make_shared<const pjrt::Buffer>(pjrt::to_device(pjrt::process_client(), t));
  count_bytes(static_cast<int64_t>(t.nbytes()), 0);
  return b;
}

// A number's buffer is kept by value, so that the numbers that are
// the same every step (an optimizer's learning rate, betas, eps, weight decay) are uploaded once,
// not each run: about 40 uploads a step for Adam. Numbers that change (bias corrections) fill
// the cache; it is emptied when it holds kMaxCachedNumbers. Buffers given as arguments are
// never donated, so one buffer serves every graph that takes the same number.
constexpr size_t kMaxCachedNumbers = 256;

std::shared_ptr<const pjrt::Buffer> number_buffer(const at::Scalar& s) {
  // Never destroyed, like the process's client: no buffer is destroyed after the client, nor in
  // a forked child at exit.
  static std::mutex& mu = *new std::mutex;
  static auto& cache = *new std::map<std::pair<bool, int64_t>, std::shared_ptr<const pjrt::Buffer>>;
  const bool floating = s.isFloatingPoint();
  int64_t bits = 0;
  if (floating) {
    const double v = s.toDouble();
    std::memcpy(&bits, &v, sizeof bits);  // by bits: -0.0 and each NaN stay themselves
  } else {
    bits = s.toLong();
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(floating, bits);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedNumbers) cache.clear();
  auto b = upload(floating ? at::scalar_tensor(s.toDouble(), at::kDouble) : at::scalar_tensor(bits, at::kLong));
  cache.emplace(key, b);
  return b;
}

namespace {

at::Tensor download(const pjrt::Buffer& b) {
  at::Tensor t = pjrt::to_tensor(b);
  count_bytes(0, static_cast<int64_t>(t.nbytes()));
  return t;
}

// The lazy tensor behind `t` (unwrapped from functionalization), or null.
lazy::LazyTensorPtr lazy_tensor_of(const at::Tensor& t) {
  if (!t.defined()) return {};
  return lazy::TryGetLtcTensor(lazy::maybe_unwrap_functional(t));
}

}  // namespace

void PjrtData::Assign(const lazy::BackendData& data) {
  if (const auto* p = dynamic_cast<const PjrtData*>(&data)) {
    buffer_ = p->buffer_;
    return;
  }
  // Host data of the TorchScript backend (none reaches here today; kept correct all the same).
  auto& ts = const_cast<lazy::TSData&>(static_cast<const lazy::TSData&>(data));
  buffer_ = ts.HasValue() ? upload(ts.data()) : nullptr;
}

at::Tensor host_tensor(const lazy::BackendDataPtr& data) {
  if (const auto* p = dynamic_cast<const PjrtData*>(data.get())) {
    if (!p->buffer())
      throw std::logic_error("xla (pjrt): reading device data that holds no value yet (shape " +
                             p->shape().to_string() + ")");
    return download(*p->buffer());
  }
  return std::static_pointer_cast<lazy::TSData>(data)->data();
}

}  // namespace detail

using namespace detail;

PjrtBackendMetrics pjrt_backend_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mutex());
  return metrics();
}

bool copy_device_value_to_host(const at::Tensor& tensor, const at::Tensor& dst) {
  const lazy::LazyTensorPtr lt = lazy_tensor_of(tensor);
  if (!lt || lt->CurrentIrValue() || lt->CurrentTensorData()) return false;
  const auto* p = dynamic_cast<const PjrtData*>(lt->CurrentDataHandle().get());
  if (!p || !p->buffer()) return false;
  if (!dst.is_cpu() || !dst.is_contiguous() || dst.scalar_type() != p->shape().scalar_type() ||
      dst.numel() != static_cast<int64_t>(p->shape().numel()))
    throw std::invalid_argument("copy_device_value_to_host: the destination (" + std::string(c10::toString(dst.scalar_type())) +
                                ", " + std::to_string(dst.numel()) + " elements, contiguous CPU required) does not fit " +
                                p->shape().to_string());
  p->buffer()->to_host(dst.data_ptr(), dst.nbytes());
  count_bytes(0, static_cast<int64_t>(dst.nbytes()));
  std::lock_guard<std::mutex> lock(metrics_mutex());
  ++metrics().one_copy_to_host;
  return true;
}

at::Tensor device_tensor_from_host(const at::Tensor& host, const c10::Device& device) {
  const lazy::BackendDevice bd = lazy::atenDeviceToBackendDevice(device);
  const at::Tensor c = host.contiguous();
  auto data = std::make_shared<PjrtData>(upload(c), shape_of(c), bd);
  {
    std::lock_guard<std::mutex> lock(metrics_mutex());
    ++metrics().one_copy_to_device;
  }
  return at::functionalization::impl::to_functional_tensor(lazy::CreateAtenFromLtcTensor(lazy::LazyTensor::Create(data)));
}

}  // namespace fulgur::xla
