// SPDX-License-Identifier: Apache-2.0
// libtorch's CPU convolutions as XLA FFI handlers; see host_kernels.h.

#include "xla/host_kernels.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <array>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "xla/pjrt/ffi_abi.h"
#include "xla/pjrt/plugin.h"

namespace fulgur::xla::host_kernels {
namespace {

// Thrown inside a handler and turned into XLA's error (the execution fails with this message).
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

ffi::Error* error(const ffi::CallFrame* frame, const std::string& message) {
  ffi::ErrorCreateArgs a{};
  a.struct_size = offsetof(ffi::ErrorCreateArgs, code) + sizeof(ffi::ErrorCode);
  a.message = message.c_str();  // XLA copies it
  a.code = ffi::ErrorCode::internal;
  return frame->api->error_create(&a);
}

// Answers XLA's metadata query (made when the handler is registered); false for a real call.
bool answered_metadata(ffi::CallFrame* frame) {
  for (ffi::ExtensionBase* e = frame->extension_start; e; e = e->next) {
    if (e->type != ffi::kMetadataExtension) continue;
    ffi::Metadata* m = reinterpret_cast<ffi::MetadataExtension*>(e)->metadata;
    m->api_version.major_version = ffi::kMajor;
    m->api_version.minor_version = ffi::kMinor;
    m->traits = 0;
    return true;
  }
  return false;
}

at::Tensor tensor_of(void* p, const char* what) {
  const auto* b = static_cast<const ffi::Buffer*>(p);
  c10::ScalarType t;
  switch (b->dtype) {
    case ffi::DataType::f32: t = at::kFloat; break;
    case ffi::DataType::f64: t = at::kDouble; break;
    default: throw KernelError(std::string(what) + " has XLA element type " + std::to_string(int(b->dtype)) +
                               "; the host convolutions take float32 and float64");
  }
  return at::from_blob(b->data, at::IntArrayRef(b->dims, static_cast<size_t>(b->rank)), at::TensorOptions(t));
}

const void* attr(const ffi::CallFrame* f, const char* name, ffi::AttrType type) {
  const ffi::Attrs& a = f->attrs;
  for (int64_t i = 0; i < a.size; ++i) {
    const ffi::ByteSpan* n = a.names[i];
    if (n->len == std::strlen(name) && std::memcmp(n->ptr, name, n->len) == 0) {
      if (a.types[i] != type) throw KernelError(std::string("attribute ") + name + " has the wrong kind");
      return a.attrs[i];
    }
  }
  std::string present;
  for (int64_t i = 0; i < a.size; ++i) present += (i ? ", " : "") + std::string(a.names[i]->ptr, a.names[i]->len);
  throw KernelError(std::string("attribute ") + name + " is missing (the call has: " +
                    (present.empty() ? "none" : present) + ")");
}

std::vector<int64_t> ints(const ffi::CallFrame* f, const char* name) {
  const auto* a = static_cast<const ffi::Array*>(attr(f, name, ffi::AttrType::array));
  if (a->dtype != ffi::DataType::s64) throw KernelError(std::string("attribute ") + name + " is not an i64 array");
  const auto* d = static_cast<const int64_t*>(a->data);
  return {d, d + a->size};
}

int64_t int_attr(const ffi::CallFrame* f, const char* name) {
  const auto* s = static_cast<const ffi::Scalar*>(attr(f, name, ffi::AttrType::scalar));
  if (s->dtype != ffi::DataType::s64) throw KernelError(std::string("attribute ") + name + " is not an i64");
  return *static_cast<const int64_t*>(s->value);
}

struct Window {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
};
Window window_of(const ffi::CallFrame* f) {
  return {ints(f, "stride"), ints(f, "padding"), ints(f, "dilation"), int_attr(f, "groups")};
}

void write(void* ret, const at::Tensor& value, const char* what) {
  at::Tensor out = tensor_of(ret, what);
  if (!out.sizes().equals(value.sizes()))
    throw KernelError(std::string(what) + " has sizes " + c10::str(out.sizes()) + ", the kernel made " +
                      c10::str(value.sizes()));
  out.copy_(value);
}

// A handler body: the metadata answer, then `run` with exceptions turned into XLA errors.
template <class F>
ffi::Error* handle(ffi::CallFrame* frame, const char* name, F run) {
  if (answered_metadata(frame)) return nullptr;
  try {
    if (frame->struct_size < offsetof(ffi::CallFrame, attrs) + sizeof(ffi::Attrs))
      throw KernelError("XLA passed a call frame of " + std::to_string(frame->struct_size) +
                        " bytes, smaller than XLA FFI API 0.1's");
    c10::NoGradGuard no_grad;
    run(frame);
    return nullptr;
  } catch (const std::exception& e) {
    return error(frame, std::string(name) + ": " + e.what());
  }
}

ffi::Error* convolution(ffi::CallFrame* frame) {
  return handle(frame, kConvolution, [](ffi::CallFrame* f) {
    if (f->args.size != 2 && f->args.size != 3) throw KernelError("takes 2 or 3 operands");
    if (f->rets.size != 1) throw KernelError("gives 1 result");
    const Window w = window_of(f);
    const at::Tensor x = tensor_of(f->args.args[0], "input"), weight = tensor_of(f->args.args[1], "weight");
    c10::optional<at::Tensor> bias;
    if (f->args.size == 3) bias = tensor_of(f->args.args[2], "bias");
    const std::vector<int64_t> output_padding(w.stride.size(), 0);
    write(f->rets.rets[0],
          at::convolution(x, weight, bias, w.stride, w.padding, w.dilation, false, output_padding, w.groups),
          "the output");
  });
}

ffi::Error* convolution_backward(ffi::CallFrame* frame) {
  return handle(frame, kConvolutionBackward, [](ffi::CallFrame* f) {
    if (f->args.size != 3) throw KernelError("takes 3 operands");
    const Window w = window_of(f);
    const std::vector<int64_t> mask = ints(f, "output_mask");
    if (mask.size() != 3) throw KernelError("output_mask has " + std::to_string(mask.size()) + " flags, not 3");
    std::array<bool, 3> m{mask[0] != 0, mask[1] != 0, mask[2] != 0};
    if (f->rets.size != m[0] + m[1] + m[2]) throw KernelError("gives one result per flag set in output_mask");
    const at::Tensor grad = tensor_of(f->args.args[0], "grad_output"), x = tensor_of(f->args.args[1], "input"),
                     weight = tensor_of(f->args.args[2], "weight");
    const std::vector<int64_t> output_padding(w.stride.size(), 0), bias_sizes{weight.size(0)};
    auto r = at::convolution_backward(grad, x, weight, bias_sizes, w.stride, w.padding, w.dilation, false,
                                      output_padding, w.groups, m);
    const at::Tensor* outs[3] = {&std::get<0>(r), &std::get<1>(r), &std::get<2>(r)};
    const char* names[3] = {"grad_input", "grad_weight", "grad_bias"};
    int64_t j = 0;
    for (int i = 0; i < 3; ++i)
      if (m[i]) write(f->rets.rets[j++], *outs[i], names[i]);
  });
}

}  // namespace

void register_with(const pjrt::Plugin& plugin) {
  plugin.register_ffi_handler(kConvolution, reinterpret_cast<void*>(&convolution), "cpu");
  plugin.register_ffi_handler(kConvolutionBackward, reinterpret_cast<void*>(&convolution_backward), "cpu");
}

}  // namespace fulgur::xla::host_kernels
