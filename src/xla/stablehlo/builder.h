// SPDX-License-Identifier: Apache-2.0
#pragma once
// The StableHLO builder the lowering rules write with: typed operands (SSA name, dims, dtype and
// promotion tier) and ops written in MLIR's generic form into one function body. It knows
// PyTorch's conversion and broadcasting rules but nothing of TorchScript graphs (those are the
// LoweringContext's, lowering.h). Private to the emitter (emitter.h).
//
// Thread safety: a Builder is used by one thread.

#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace fulgur::xla::stablehlo {

using Dims = std::vector<int64_t>;

// Thrown by a lowering for an argument it does not handle; the emitter records it as the reason
// the graph falls back ("aten::div (rounding_mode 'floor')").
struct Unsupported {
  std::string what;
};

// How an operand takes part in type promotion (torch.result_type): dimensioned tensors first,
// then 0-d tensors, then numbers ("wrapped numbers").
enum class Tier { dimensioned, zero_dim, number };

struct Operand {
  std::string ssa;  // empty for a constant not yet written
  Dims dims;
  c10::ScalarType dtype;
  Tier tier;
  std::optional<c10::Scalar> constant;  // the value of a known number (a prim::Constant)
};

// The dtype a reduction of `t` accumulates in: float32 for the 16-bit floats, as libtorch's CPU
// kernels do; `t` itself otherwise.
c10::ScalarType accumulation_type(c10::ScalarType t);
// "f32", "bf16", "i64", ... Throws Unsupported for a dtype StableHLO programs here do not take.
std::string mlir_element_type(c10::ScalarType t);
std::string mlir_type(const Dims& dims, c10::ScalarType t);
// "1, 2, 3" and "array<i64: 1, 2, 3>".
std::string ints(const Dims& v);
std::string i64_array(const Dims& v);
// An MLIR literal for `value` converted to `t` as libtorch converts a scalar (a C++ cast);
// floating values in hexadecimal (their exact bits, and the only spelling of inf and nan).
std::string literal(const c10::Scalar& value, c10::ScalarType t);
bool is_floating(c10::ScalarType t);
// torch.result_type of the operands (their tiers, then c10's promotion).
c10::ScalarType result_type(const std::vector<const Operand*>& operands);
// A number operand (written as a constant of whatever dtype it meets).
Operand number(const c10::Scalar& value);
// NumPy broadcasting; throws std::invalid_argument for shapes that do not broadcast.
Dims broadcast_dims(const Dims& a, const Dims& b);
// `dim` in [0, rank) (a 0-d tensor takes dims -1 and 0, as in PyTorch); throws
// std::invalid_argument outside [-rank, rank).
int64_t wrap_dim(int64_t dim, size_t rank);

class Builder {
 public:
  // The ops written so far, one per line.
  std::string body() const { return body_.str(); }

  // A fresh SSA name, "%vK".
  std::string fresh() { return "%v" + std::to_string(next_++); }
  // One op of one result of `dims` and `t`; `attrs` inside {...}, `region` inside (...).
  Operand op(const std::string& name, const std::vector<Operand>& args, const Dims& dims, c10::ScalarType t,
             const std::string& attrs = "", const std::string& region = "");
  // An op of several results, `%vK#i`.
  std::vector<Operand> op_n(const std::string& name, const std::vector<Operand>& args,
                            const std::vector<std::pair<Dims, c10::ScalarType>>& results, const std::string& attrs,
                            const std::string& region);
  Operand splat(const c10::Scalar& value, const Dims& dims, c10::ScalarType t);
  // `x` converted to `t` (a known number written as a constant of `t`), its tier kept.
  Operand as(const Operand& x, c10::ScalarType t);
  Operand broadcast_to(const Operand& x, const Dims& dims);
  // `x` with an SSA value (a constant written out in its own dtype).
  Operand materialized(const Operand& x) { return x.ssa.empty() ? as(x, x.dtype) : x; }
  Operand reshape(const Operand& x, const Dims& dims);
  // An elementwise op of `a` and `b` converted to `t` and broadcast.
  Operand binary(const std::string& name, const Operand& a, const Operand& b, c10::ScalarType t);
  // `a` `direction` `b` ("LT", "EQ", ...) compared in `t`, broadcast; a bool result.
  Operand compare(const std::string& direction, const Operand& a, const Operand& b, c10::ScalarType t);
  Operand select(const Operand& pred, const Operand& on_true, const Operand& on_false);
  // `x` reduced over `dims` with `body_op` from `init`, in x's dtype.
  Operand reduce(const Operand& x, const Dims& dims, const std::string& body_op, const c10::Scalar& init);
  // A region of one block combining two 0-d values of `t` with `body_op` (reduce, scatter).
  std::string combiner(const std::string& body_op, c10::ScalarType t);
  // combiner() for a floating `t` that returns NaN when either value is NaN, as libtorch's max
  // and min reductions do (XLA:CPU's maximum returns its first operand when only the second is
  // NaN); combiner() itself for other types.
  std::string nan_combiner(const std::string& body_op, c10::ScalarType t);
  // reduce() with nan_combiner().
  Operand reduce_nan(const Operand& x, const Dims& dims, const std::string& body_op, const c10::Scalar& init);
  // `reduced` (the result of reducing `full` over `dims`) broadcast back to `full`.
  Operand keep_dims(const Operand& reduced, const Dims& full, const Dims& dims);
  Operand dot(const Operand& a, const Operand& b, const Dims& batch, int64_t lhs_contract, int64_t rhs_contract,
              c10::ScalarType t);
  // The [start, limit) slice of `x` with `strides`.
  Operand slice(const Operand& x, const Dims& start, const Dims& limit, const Dims& strides);
  // x * s, skipped if s is the constant 1.
  Operand scaled(const Operand& x, const Operand& s);
  Operand mul(const Operand& a, const Operand& b) { return binary("stablehlo.multiply", a, b, a.dtype); }
  Operand add(const Operand& a, const Operand& b) { return binary("stablehlo.add", a, b, a.dtype); }
  Operand sub(const Operand& a, const Operand& b) { return binary("stablehlo.subtract", a, b, a.dtype); }
  Operand unary(const std::string& name, const Operand& x) { return op(name, {x}, x.dims, x.dtype); }
  // `x` (of a wider float type) with the precision of `t` where `t` is a 16-bit float, keeping
  // x's type: the value libtorch reads back after storing it as `t`. A stablehlo.reduce_precision,
  // which XLA keeps, where it may drop a convert to `t` and back (excess precision).
  Operand rounded_as(const Operand& x, c10::ScalarType t);

 private:
  std::ostringstream body_;
  int next_ = 0;
};

}  // namespace fulgur::xla::stablehlo
