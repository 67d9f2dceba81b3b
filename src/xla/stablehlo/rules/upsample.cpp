// SPDX-License-Identifier: Apache-2.0
// Upsampling rules: upsample_nearest2d and its backward over the last two dims of a [N, C, H, W]
// or [C, H, W] input, for whole factors (other factors stay on TorchScript).

#include "xla/stablehlo/lowering.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace fulgur::xla::stablehlo {
namespace {

// The whole factor by which upsample_nearest2d maps `in` rows to `out` (output row d reads input
// row d / factor), computed as libtorch's CPU kernel picks source rows (nearest_idx: the
// identity, d >> 1 for twice the size, else min(floor(d * scale), in - 1) in float with scale
// 1 / scales or in / out); throws Unsupported where that is not a whole-factor repeat.
int64_t nearest_factor(int64_t in, int64_t out, std::optional<double> scales) {
  if (in <= 0 || out % in != 0) throw Unsupported{"upsampling " + std::to_string(in) + " to " + std::to_string(out)};
  const int64_t factor = out / in;
  if (factor == 1 || factor == 2) return factor;
  const float scale = scales && *scales > 0 ? static_cast<float>(1.0 / *scales)
                                            : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    const int64_t src = std::min(static_cast<int64_t>(std::floor(static_cast<float>(d) * scale)), in - 1);
    if (src != d / factor) throw Unsupported{"scale " + std::to_string(scale) + " is not a whole-factor repeat"};
  }
  return factor;
}

std::optional<double> optional_double(LoweringContext& cx, const Node* n, size_t i) {
  if (cx.none_arg(n, i)) return std::nullopt;
  return cx.constant(n, i, "scales").toDouble();
}

// (self [N, C, H, W] or [C, H, W], output_size, scales_h?, scales_w?): each element repeated fh x
// fw times (nearest_factor): reshaped to [.., H, 1, W, 1], broadcast to [.., H, fh, W, fw],
// reshaped to [.., H * fh, W * fw].
void upsample_nearest2d(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  if (x.dims.size() != 3 && x.dims.size() != 4) throw Unsupported{"an input of " + std::to_string(x.dims.size()) + " dims"};
  const Dims out = cx.ints_arg(n, 1, "output_size");
  if (out.size() != 2) throw Unsupported{"output_size of " + std::to_string(out.size()) + " values"};
  const size_t h = x.dims.size() - 2;
  const int64_t H = x.dims[h], W = x.dims[h + 1];
  const int64_t fh = nearest_factor(H, out[0], optional_double(cx, n, 2)),
                fw = nearest_factor(W, out[1], optional_double(cx, n, 3));
  Dims lead(x.dims.begin(), x.dims.begin() + static_cast<std::ptrdiff_t>(h));
  Dims unit = lead, spread = lead;
  unit.insert(unit.end(), {H, 1, W, 1});
  spread.insert(spread.end(), {H, fh, W, fw});
  cx.set(n, 0, cx.reshape(cx.broadcast_to(cx.reshape(x, unit), spread), cx.out_dims(n)));
}

// (grad_output, output_size, input_size, scales_h?, scales_w?): the sum of each input element's
// fh x fw copies, in float32 for 16-bit floats, rounded once.
void upsample_nearest2d_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType out = cx.out_dtype(n), t = accumulation_type(out);
  const Operand g = cx.as(cx.materialized(cx.in(n, 0)), t);
  const Dims output_size = cx.ints_arg(n, 1, "output_size"), input_size = cx.ints_arg(n, 2, "input_size");
  if (output_size.size() != 2 || (input_size.size() != 3 && input_size.size() != 4))
    throw Unsupported{"sizes of " + std::to_string(output_size.size()) + " and " + std::to_string(input_size.size())};
  const size_t h = input_size.size() - 2;
  const int64_t H = input_size[h], W = input_size[h + 1];
  const int64_t fh = nearest_factor(H, output_size[0], optional_double(cx, n, 3)),
                fw = nearest_factor(W, output_size[1], optional_double(cx, n, 4));
  Dims spread(input_size.begin(), input_size.begin() + static_cast<std::ptrdiff_t>(h));
  spread.insert(spread.end(), {H, fh, W, fw});
  const Operand sums = cx.reduce(cx.reshape(g, spread), {static_cast<int64_t>(h) + 1, static_cast<int64_t>(h) + 3},
                                 "stablehlo.add", 0);
  cx.set(n, 0, cx.reshape(cx.as(sums, out), cx.out_dims(n)));
}

}  // namespace

void add_upsample_rules(RuleTable& table) {
  table.add("aten::upsample_nearest2d", upsample_nearest2d);
  table.add("aten::upsample_nearest2d_backward", upsample_nearest2d_backward);
}

}  // namespace fulgur::xla::stablehlo
