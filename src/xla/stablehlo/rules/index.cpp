// SPDX-License-Identifier: Apache-2.0
// Index rules: embedding and its backward (gather, scatter-add), index_select, gather, scatter
// and scatter_add, and triu/tril (a mask of the last two dims' indices).

#include "xla/stablehlo/lowering.h"

namespace fulgur::xla::stablehlo {
namespace {

// weight [V, D] indexed by int indices of any shape: rows gathered, [*indices, D]. padding_idx
// and scale_grad_by_freq only change the backward.
void embedding(LoweringContext& cx, const Node* n) {
  const Operand weight = cx.materialized(cx.in(n, 0));
  if (weight.dims.size() != 2) throw Unsupported{"weight of " + std::to_string(weight.dims.size()) + " dimensions"};
  const Operand indices = cx.materialized(cx.in(n, 1));
  const int64_t rank = static_cast<int64_t>(indices.dims.size());
  const std::string numbers = "dimension_numbers = #stablehlo.gather<offset_dims = [" + std::to_string(rank) +
                              "], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = " +
                              std::to_string(rank) + ">, slice_sizes = " + i64_array({1, weight.dims[1]}) +
                              ", indices_are_sorted = false";
  Dims dims = indices.dims;
  dims.push_back(weight.dims[1]);
  cx.set(n, 0, cx.op("stablehlo.gather", {weight, indices}, dims, weight.dtype, numbers));
}

// (grad_output [*indices, D], indices, num_weights, padding_idx, scale_grad_by_freq) ->
// [num_weights, D]: each grad row added into its index's row (a scatter-add); rows whose index is
// padding_idx add nothing.
void embedding_dense_backward(LoweringContext& cx, const Node* n) {
  if (cx.bool_arg(n, 4, "scale_grad_by_freq")) throw Unsupported{"scale_grad_by_freq"};
  const c10::ScalarType t = cx.out_dtype(n);
  const Dims dims = cx.out_dims(n);
  const Operand& indices_in = cx.in(n, 1);
  int64_t k = 1;
  for (int64_t d : indices_in.dims) k *= d;
  const Operand indices = cx.reshape(cx.materialized(indices_in), {k});
  const Operand grad = cx.reshape(cx.as(cx.in(n, 0), t), {k, dims.at(1)});
  const Operand padding = cx.compare("EQ", indices, cx.in(n, 3), indices.dtype);
  const Operand padded_rows =
      cx.op("stablehlo.broadcast_in_dim", {padding}, grad.dims, c10::kBool, "broadcast_dimensions = array<i64: 0>");
  const Operand rows = cx.select(padded_rows, cx.splat(0, grad.dims, t), grad);
  const std::string numbers =
      "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], "
      "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
  cx.set(n, 0, cx.op("stablehlo.scatter", {cx.splat(0, dims, t), indices, rows}, dims, t, numbers,
                     cx.combiner("stablehlo.add", t)));
}

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
  auto iota = [&](int64_t dim) {
    return cx.op("stablehlo.iota", {}, x.dims, c10::kLong, "iota_dimension = " + std::to_string(dim) + " : i64");
  };
  const Operand row = iota(rank - 2), col = iota(rank - 1);
  const Operand keep = cx.compare(direction, cx.sub(col, row), number(cx.int_arg(n, 1, "diagonal")), c10::kLong);
  cx.set(n, 0, cx.select(keep, x, cx.splat(0, {}, x.dtype)));
}
void triu(LoweringContext& cx, const Node* n) { triangle(cx, n, "GE"); }
void tril(LoweringContext& cx, const Node* n) { triangle(cx, n, "LE"); }

// The [count, rank] coordinates of the positions p of `index` (count of them, row-major) with
// their `dim` coordinate replaced by index[p]: iotas, and index for dim.
Operand index_coordinates(LoweringContext& cx, const Operand& index, int64_t dim, int64_t count) {
  const int64_t rank = static_cast<int64_t>(index.dims.size());
  std::vector<Operand> coordinates;
  for (int64_t a = 0; a < rank; ++a) {
    const Operand c = a == dim ? cx.as(index, c10::kLong)
                               : cx.op("stablehlo.iota", {}, index.dims, c10::kLong,
                                       "iota_dimension = " + std::to_string(a) + " : i64");
    coordinates.push_back(cx.reshape(c, {count, 1}));
  }
  return cx.op("stablehlo.concatenate", coordinates, {count, rank}, c10::kLong, "dimension = 1 : i64");
}

// "0, 1, ..., rank - 1".
std::string every_dim(int64_t rank) {
  Dims all;
  for (int64_t a = 0; a < rank; ++a) all.push_back(a);
  return ints(all);
}

// (self, dim, index, sparse_grad) of one rank -> out[p] = self[p with its dim coordinate
// replaced by index[p]], for every position p of index: one stablehlo.gather of single elements
// at index_coordinates().
void gather(LoweringContext& cx, const Node* n) {
  const Operand x = cx.materialized(cx.in(n, 0));
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  if (rank == 0) throw Unsupported{"a 0-d self"};
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size());
  const Operand index = cx.materialized(cx.in(n, 2));
  if (static_cast<int64_t>(index.dims.size()) != rank) throw Unsupported{"an index of another rank than self"};
  int64_t count = 1;
  for (int64_t d : index.dims) count *= d;
  if (count == 0) {
    cx.set(n, 0, cx.splat(0, index.dims, x.dtype));
    return;
  }
  const std::string numbers = "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [" + every_dim(rank) +
                              "], start_index_map = [" + every_dim(rank) + "], index_vector_dim = 1>, slice_sizes = " +
                              i64_array(Dims(rank, 1)) + ", indices_are_sorted = false";
  const Operand picked =
      cx.op("stablehlo.gather", {x, index_coordinates(cx, index, dim, count)}, {count}, x.dtype, numbers);
  cx.set(n, 0, cx.reshape(picked, index.dims));
}

// (self, dim, index, src) of one rank -> self with src[p] written (or, for scatter_add, added) at
// the position p with its `dim` coordinate replaced by index[p], for every position p of index:
// one stablehlo.scatter of single elements at index_coordinates(). Where index repeats a
// position, scatter keeps one of the values (which is unspecified, as in libtorch) and
// scatter_add adds them all.
void scatter_values(LoweringContext& cx, const Node* n, bool add) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand x = cx.as(cx.materialized(cx.in(n, 0)), t);
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  if (rank == 0) throw Unsupported{"a 0-d self"};
  const int64_t dim = wrap_dim(cx.int_arg(n, 1, "dim"), x.dims.size());
  const Operand index = cx.materialized(cx.in(n, 2));
  const Operand src = cx.as(cx.materialized(cx.in(n, 3)), t);
  if (static_cast<int64_t>(index.dims.size()) != rank || static_cast<int64_t>(src.dims.size()) != rank)
    throw Unsupported{"index or src of another rank than self"};
  int64_t count = 1;
  for (int64_t d : index.dims) count *= d;
  if (count == 0) {
    cx.set(n, 0, x);
    return;
  }
  const Operand updates = cx.reshape(cx.slice(src, Dims(rank, 0), index.dims, Dims(rank, 1)), {count});
  const std::string numbers = "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [" +
                              every_dim(rank) + "], scatter_dims_to_operand_dims = [" + every_dim(rank) +
                              "], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
  std::string region;
  if (add) {
    region = cx.combiner("stablehlo.add", t);
  } else {
    const std::string s = mlir_type({}, t), old_value = cx.fresh(), update = cx.fresh();
    region = "{\n    ^bb0(" + old_value + ": " + s + ", " + update + ": " + s + "):\n      \"stablehlo.return\"(" +
             update + ") : (" + s + ") -> ()\n    }";
  }
  cx.set(n, 0, cx.op("stablehlo.scatter", {x, index_coordinates(cx, index, dim, count), updates}, x.dims, t, numbers,
                     region));
}

void scatter(LoweringContext& cx, const Node* n) { scatter_values(cx, n, false); }
void scatter_add(LoweringContext& cx, const Node* n) { scatter_values(cx, n, true); }

}  // namespace

void add_index_rules(RuleTable& table) {
  table.add("aten::embedding", embedding, "StableHlo.EmbeddingGathersRows");
  table.add("aten::embedding_dense_backward", embedding_dense_backward,
            "StableHlo.EmbeddingDenseBackwardAddsRepeatedIndicesAndSkipsPadding");
  table.add("aten::index_select", index_select, "XlaOps.IndexSelect");
  table.add("aten::triu", triu, "XlaOps.TriuTrilAndTheirBackwards");
  table.add("aten::tril", tril, "XlaOps.TriuTrilAndTheirBackwards");
  table.add("aten::gather", gather, "XlaOps.ScatterScatterAddAndTheBackwardsOfTopkAndMax");
  table.add("aten::scatter", scatter, "XlaOps.ScatterScatterAddAndTheBackwardsOfTopkAndMax");
  table.add("aten::scatter_add", scatter_add, "XlaOps.ScatterScatterAddAndTheBackwardsOfTopkAndMax");
}

}  // namespace fulgur::xla::stablehlo
