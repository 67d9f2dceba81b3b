// Index rules: index_select, and triu/tril (a mask of the last two dims' indices).

#include "xla/stablehlo/lowering.h"

namespace fulgur::xla::stablehlo {
namespace {

// (self, dim, index [k] or []) -> self's slices at `index` along dim (k of them, 1 for a 0-d
// index): one stablehlo.gather whose batch dim takes dim's place. An index out of range is an
// error in libtorch and clamped by XLA.
void index_select(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const Dims out = cx.out_dims(n);
  if (x.dims.empty()) throw Unsupported{"a 0-d input"};
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size());
  const Operand& index_in = cx.in(n, 2);
  if (index_in.dims.size() > 1) throw Unsupported{"an index of " + std::to_string(index_in.dims.size()) + " dims"};
  const int64_t k = out[dim];
  const Operand index = cx.reshape(cx.materialized(index_in), {k, 1});
  Dims offset, sizes = x.dims;
  for (int64_t d = 0; d < static_cast<int64_t>(x.dims.size()); ++d)
    if (d != dim) offset.push_back(d);
  sizes[dim] = 1;
  const std::string numbers = "dimension_numbers = #stablehlo.gather<offset_dims = [" + ints(offset) +
                              "], collapsed_slice_dims = [" + std::to_string(dim) + "], start_index_map = [" +
                              std::to_string(dim) + "], index_vector_dim = 1>, slice_sizes = " + i64_array(sizes) +
                              ", indices_are_sorted = false";
  cx.set(n, 0, cx.op("stablehlo.gather", {x, index}, out, x.dtype, numbers));
}

// (self, diagonal): the elements with column - row >= diagonal (triu) or <= diagonal (tril) of
// the last two dims, zero elsewhere.
void triangle(LoweringContext& cx, const Node* n, const char* direction) {
  const Operand x = cx.materialized(cx.in(n, 0));
  if (x.dims.size() < 2) throw Unsupported{"an input of " + std::to_string(x.dims.size()) + " dims"};
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  const Operand row = cx.op("stablehlo.iota", {}, x.dims, c10::kLong, "iota_dimension = " + std::to_string(rank - 2) + " : i64");
  const Operand col = cx.op("stablehlo.iota", {}, x.dims, c10::kLong, "iota_dimension = " + std::to_string(rank - 1) + " : i64");
  const Operand keep = cx.compare(direction, cx.sub(col, row), number(cx.int_arg(n, 1, "diagonal")), c10::kLong);
  cx.set(n, 0, cx.select(keep, x, cx.splat(0, {}, x.dtype)));
}
void triu(LoweringContext& cx, const Node* n) { triangle(cx, n, "GE"); }
void tril(LoweringContext& cx, const Node* n) { triangle(cx, n, "LE"); }

}  // namespace

void add_index_rules(RuleTable& table) {
  table.add("aten::index_select", index_select);
  table.add("aten::triu", triu);
  table.add("aten::tril", tril);
}

}  // namespace fulgur::xla::stablehlo
