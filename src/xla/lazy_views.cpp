// Kernels on libtorch's Lazy dispatch key for ops its lazy core leaves to the eager fallback in a
// way that breaks: the recurrent modules (RNN, LSTM, GRU and their cells) of torch::nn aborted
// the process on an xla device.
//  - unsafe_split / unsafe_split_with_sizes (what unsafe_chunk calls; the cells split their gate
//    projections with it): functionalization treats them as plain ops and hands the Lazy key
//    the unwrapped tensors, whose split is made of slice views that a lazy tensor cannot hold
//    outside functionalization ("aten::as_strided appears to be a view operator"). Here each
//    piece is a slice_copy, which the lazy core lowers; an unsafe split promises no aliasing,
//    so copies keep its meaning.
//  - unbind_copy, split_copy, split_with_sizes_copy: functionalization regenerates an unbind or
//    split view (a sequence's time steps, chunk's pieces: MultiheadAttention's q, k, v) with
//    them, and the lazy core has no kernel for these ops that return lists: the eager fallback
//    returned CPU tensors, and the next op failed with "Input tensor is not a lazy tensor:
//    CPUFloatType". Here they are select_copy / slice_copy along the dimension.
// The ops' results are the same tensors as the eager kernels' (tests/test_xla.cpp compares the
// modules with eager), and lower to the StableHLO emitter's slices.

#include "xla/lazy_views.h"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <torch/library.h>

#include <mutex>

namespace fulgur::xla::detail {
namespace {

std::vector<at::Tensor> split_copies(const at::Tensor& self, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<at::Tensor> out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t n : sizes) {
    out.push_back(at::slice_copy(self, dim, start, start + n, 1));
    start += n;
  }
  return out;
}

// split(split_size): pieces of split_size along dim, the last one shorter (one empty piece of
// an empty dimension), as at::split.
std::vector<at::Tensor> split_size_copies(const at::Tensor& self, c10::SymInt split_size, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const int64_t size = self.size(dim), step = split_size.expect_int();
  TORCH_CHECK(step > 0 || size == 0, "split: split_size must be positive, got ", step);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size || (size == 0 && sizes.empty()); start += std::max<int64_t>(step, 1))
    sizes.push_back(std::min(step, size - start));
  return split_copies(self, sizes, dim);
}

std::vector<at::Tensor> split_sizes_copies(const at::Tensor& self, c10::SymIntArrayRef split_sizes, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const auto& s : split_sizes) {
    sizes.push_back(s.expect_int());
    total += sizes.back();
  }
  TORCH_CHECK(total == self.size(dim), "split_with_sizes: the sizes sum to ", total, ", the dimension has ",
              self.size(dim));
  return split_copies(self, sizes, dim);
}

std::vector<at::Tensor> unbind_copy(const at::Tensor& self, int64_t dim) {
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(self.size(dim)));
  for (int64_t i = 0; i < self.size(dim); ++i) out.push_back(at::select_copy(self, dim, i));
  return out;
}

}  // namespace

void install_lazy_view_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    lib.impl("unsafe_split.Tensor", TORCH_FN(split_size_copies));
    lib.impl("unsafe_split_with_sizes", TORCH_FN(split_sizes_copies));
    lib.impl("split_copy.Tensor", TORCH_FN(split_size_copies));
    lib.impl("split_with_sizes_copy", TORCH_FN(split_sizes_copies));
    lib.impl("unbind_copy.int", TORCH_FN(unbind_copy));
  });
}

}  // namespace fulgur::xla::detail
