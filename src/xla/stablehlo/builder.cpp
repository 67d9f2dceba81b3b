// SPDX-License-Identifier: Apache-2.0
// The StableHLO builder; see builder.h.

#include "xla/stablehlo/builder.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <stdexcept>

namespace fulgur::xla::stablehlo {

c10::ScalarType accumulation_type(c10::ScalarType t) {
  return t == c10::kBFloat16 || t == c10::kHalf ? c10::kFloat : t;
}

std::string mlir_element_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "f32";
    case c10::kDouble: return "f64";
    case c10::kHalf: return "f16";
    case c10::kBFloat16: return "bf16";
    case c10::kLong: return "i64";
    case c10::kInt: return "i32";
    case c10::kShort: return "i16";
    case c10::kChar: return "i8";
    case c10::kByte: return "ui8";
    case c10::kBool: return "i1";
    default: throw Unsupported{std::string("dtype ") + c10::toString(t)};
  }
}

std::string mlir_type(const Dims& dims, c10::ScalarType t) {
  std::string s = "tensor<";
  for (int64_t d : dims) s += std::to_string(d) + "x";
  return s + mlir_element_type(t) + ">";
}

std::string ints(const Dims& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string i64_array(const Dims& v) { return v.empty() ? "array<i64>" : "array<i64: " + ints(v) + ">"; }

std::string literal(const c10::Scalar& value, c10::ScalarType t) {
  char buf[40];
  switch (t) {
    case c10::kFloat: {
      const float f = value.to<float>();
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      std::snprintf(buf, sizeof buf, "0x%08" PRIX32, bits);
      return buf;
    }
    case c10::kDouble: {
      const double d = value.to<double>();
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      std::snprintf(buf, sizeof buf, "0x%016" PRIX64, bits);
      return buf;
    }
    case c10::kHalf:
      std::snprintf(buf, sizeof buf, "0x%04X", static_cast<unsigned>(value.to<c10::Half>().x));
      return buf;
    case c10::kBFloat16:
      std::snprintf(buf, sizeof buf, "0x%04X", static_cast<unsigned>(value.to<c10::BFloat16>().x));
      return buf;
    case c10::kBool: return value.to<bool>() ? "true" : "false";
    case c10::kByte: return std::to_string(value.to<uint8_t>());
    default: return std::to_string(value.to<int64_t>());
  }
}

bool is_floating(c10::ScalarType t) { return c10::isFloatingType(t); }

// c10's combine_categories (ATen/native/TypeProperties.cpp): a lower tier changes the result
// only when it is of a higher category.
static c10::ScalarType combine_categories(c10::ScalarType higher, c10::ScalarType lower) {
  if (higher == c10::ScalarType::Undefined) return lower;
  if (lower == c10::ScalarType::Undefined) return higher;
  if (is_floating(higher)) return higher;
  if (higher == c10::kBool || is_floating(lower)) return c10::promoteTypes(higher, lower);
  return higher;
}

c10::ScalarType result_type(const std::vector<const Operand*>& operands) {
  c10::ScalarType tier[3] = {c10::ScalarType::Undefined, c10::ScalarType::Undefined, c10::ScalarType::Undefined};
  for (const Operand* o : operands) {
    c10::ScalarType t = o->dtype;
    // A number counts as the default dtype if it is floating (libtorch's wrapped numbers).
    if (o->tier == Tier::number && is_floating(t)) t = c10::kFloat;
    c10::ScalarType& slot = tier[static_cast<int>(o->tier)];
    slot = slot == c10::ScalarType::Undefined ? t : c10::promoteTypes(slot, t);
  }
  return combine_categories(combine_categories(tier[0], tier[1]), tier[2]);
}

Operand number(const c10::Scalar& value) {
  return {"", {}, value.isFloatingPoint() ? c10::kDouble : c10::kLong, Tier::number, value};
}

Dims broadcast_dims(const Dims& a, const Dims& b) {
  Dims out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const int64_t db = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (da != db && da != 1 && db != 1) throw std::invalid_argument("shapes do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t wrap_dim(int64_t dim, size_t rank) {
  const int64_t r = std::max<int64_t>(static_cast<int64_t>(rank), 1);
  if (dim < -r || dim >= r) throw std::invalid_argument("dimension " + std::to_string(dim) + " out of range");
  return dim < 0 ? dim + r : dim;
}

Operand Builder::op(const std::string& name, const std::vector<Operand>& args, const Dims& dims, c10::ScalarType t,
                    const std::string& attrs, const std::string& region) {
  Operand out{fresh(), dims, t, dims.empty() ? Tier::zero_dim : Tier::dimensioned, std::nullopt};
  body_ << "    " << out.ssa << " = \"" << name << "\"(";
  for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << args[i].ssa;
  body_ << ")";
  if (!region.empty()) body_ << " (" << region << ")";
  if (!attrs.empty()) body_ << " {" << attrs << "}";
  body_ << " : (";
  for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << mlir_type(args[i].dims, args[i].dtype);
  body_ << ") -> " << mlir_type(dims, t) << "\n";
  return out;
}

std::vector<Operand> Builder::op_n(const std::string& name, const std::vector<Operand>& args,
                                   const std::vector<std::pair<Dims, c10::ScalarType>>& results,
                                   const std::string& attrs, const std::string& region) {
  const std::string base = fresh();
  body_ << "    " << base << ":" << results.size() << " = \"" << name << "\"(";
  for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << args[i].ssa;
  body_ << ")";
  if (!region.empty()) body_ << " (" << region << ")";
  body_ << " {" << attrs << "} : (";
  for (size_t i = 0; i < args.size(); ++i) body_ << (i ? ", " : "") << mlir_type(args[i].dims, args[i].dtype);
  body_ << ") -> (";
  std::vector<Operand> outs;
  for (size_t i = 0; i < results.size(); ++i) {
    body_ << (i ? ", " : "") << mlir_type(results[i].first, results[i].second);
    outs.push_back({base + "#" + std::to_string(i), results[i].first, results[i].second, Tier::dimensioned, std::nullopt});
  }
  body_ << ")\n";
  return outs;
}

Operand Builder::splat(const c10::Scalar& value, const Dims& dims, c10::ScalarType t) {
  return op("stablehlo.constant", {}, dims, t, "value = dense<" + literal(value, t) + "> : " + mlir_type(dims, t));
}

Operand Builder::as(const Operand& x, c10::ScalarType t) {
  if (x.constant) {
    Operand c = splat(*x.constant, {}, t);
    c.tier = x.tier;
    return c;
  }
  if (x.dtype == t) return x;
  Operand c = op("stablehlo.convert", {x}, x.dims, t);
  c.tier = x.tier;
  return c;
}

Operand Builder::broadcast_to(const Operand& x, const Dims& dims) {
  Operand v = materialized(x);
  if (v.dims == dims) return v;
  if (v.dims.size() > dims.size()) throw std::invalid_argument("cannot broadcast to fewer dimensions");
  Dims map;
  for (size_t i = 0; i < v.dims.size(); ++i) map.push_back(static_cast<int64_t>(dims.size() - v.dims.size() + i));
  return op("stablehlo.broadcast_in_dim", {v}, dims, v.dtype, "broadcast_dimensions = " + i64_array(map));
}

Operand Builder::reshape(const Operand& x, const Dims& dims) {
  if (x.dims == dims) return x;
  return op("stablehlo.reshape", {x}, dims, x.dtype);
}

Operand Builder::binary(const std::string& name, const Operand& a, const Operand& b, c10::ScalarType t) {
  const Dims dims = broadcast_dims(a.dims, b.dims);
  return op(name, {broadcast_to(as(a, t), dims), broadcast_to(as(b, t), dims)}, dims, t);
}

Operand Builder::compare(const std::string& direction, const Operand& a, const Operand& b, c10::ScalarType t) {
  const Dims dims = broadcast_dims(a.dims, b.dims);
  return op("stablehlo.compare", {broadcast_to(as(a, t), dims), broadcast_to(as(b, t), dims)}, dims, c10::kBool,
            "comparison_direction = #stablehlo<comparison_direction " + direction + ">");
}

Operand Builder::select(const Operand& pred, const Operand& on_true, const Operand& on_false) {
  const Dims dims = broadcast_dims(broadcast_dims(pred.dims, on_true.dims), on_false.dims);
  // A 0-d predicate chooses whole operands; any other is broadcast like the operands.
  const Operand p = pred.dims.empty() ? pred : broadcast_to(pred, dims);
  return op("stablehlo.select", {p, broadcast_to(on_true, dims), broadcast_to(on_false, dims)}, dims, on_true.dtype);
}

Operand Builder::reduce(const Operand& x, const Dims& dims, const std::string& body_op, const c10::Scalar& init) {
  Dims out;
  for (size_t i = 0; i < x.dims.size(); ++i)
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) == dims.end()) out.push_back(x.dims[i]);
  const Operand init_value = splat(init, {}, x.dtype);
  return op("stablehlo.reduce", {x, init_value}, out, x.dtype, "dimensions = " + i64_array(dims),
            combiner(body_op, x.dtype));
}

std::string Builder::combiner(const std::string& body_op, c10::ScalarType t) {
  const std::string s = mlir_type({}, t);
  const std::string a = fresh(), b = fresh(), r = fresh();
  return "{\n    ^bb0(" + a + ": " + s + ", " + b + ": " + s + "):\n      " + r + " = \"" + body_op + "\"(" + a + ", " + b +
         ") : (" + s + ", " + s + ") -> " + s + "\n      \"stablehlo.return\"(" + r + ") : (" + s + ") -> ()\n    }";
}

std::string Builder::nan_combiner(const std::string& body_op, c10::ScalarType t) {
  if (!is_floating(t)) return combiner(body_op, t);
  const std::string s = mlir_type({}, t), p = mlir_type({}, c10::kBool);
  const std::string a = fresh(), b = fresh(), r = fresh(), an = fresh(), bn = fresh(), r1 = fresh(), r2 = fresh();
  auto is_nan = [&](const std::string& out, const std::string& v) {
    return "      " + out + " = \"stablehlo.compare\"(" + v + ", " + v +
           ") {comparison_direction = #stablehlo<comparison_direction NE>} : (" + s + ", " + s + ") -> " + p + "\n";
  };
  auto choose = [&](const std::string& out, const std::string& pred, const std::string& x, const std::string& y) {
    return "      " + out + " = \"stablehlo.select\"(" + pred + ", " + x + ", " + y + ") : (" + p + ", " + s + ", " + s +
           ") -> " + s + "\n";
  };
  return "{\n    ^bb0(" + a + ": " + s + ", " + b + ": " + s + "):\n      " + r + " = \"" + body_op + "\"(" + a + ", " +
         b + ") : (" + s + ", " + s + ") -> " + s + "\n" + is_nan(an, a) + is_nan(bn, b) + choose(r1, bn, b, r) +
         choose(r2, an, a, r1) + "      \"stablehlo.return\"(" + r2 + ") : (" + s + ") -> ()\n    }";
}

Operand Builder::reduce_nan(const Operand& x, const Dims& dims, const std::string& body_op, const c10::Scalar& init) {
  Dims out;
  for (size_t i = 0; i < x.dims.size(); ++i)
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) == dims.end()) out.push_back(x.dims[i]);
  const Operand init_value = splat(init, {}, x.dtype);
  return op("stablehlo.reduce", {materialized(x), init_value}, out, x.dtype, "dimensions = " + i64_array(dims),
            nan_combiner(body_op, x.dtype));
}

Operand Builder::keep_dims(const Operand& reduced, const Dims& full, const Dims& dims) {
  Dims map;
  for (size_t i = 0; i < full.size(); ++i)
    if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) == dims.end()) map.push_back(static_cast<int64_t>(i));
  return op("stablehlo.broadcast_in_dim", {reduced}, full, reduced.dtype, "broadcast_dimensions = " + i64_array(map));
}

Operand Builder::dot(const Operand& a, const Operand& b, const Dims& batch, int64_t lhs_contract, int64_t rhs_contract,
                     c10::ScalarType t) {
  Dims dims;
  for (int64_t d : batch) dims.push_back(a.dims[d]);
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (static_cast<int64_t>(i) != lhs_contract && std::find(batch.begin(), batch.end(), static_cast<int64_t>(i)) == batch.end())
      dims.push_back(a.dims[i]);
  for (size_t i = 0; i < b.dims.size(); ++i)
    if (static_cast<int64_t>(i) != rhs_contract && std::find(batch.begin(), batch.end(), static_cast<int64_t>(i)) == batch.end())
      dims.push_back(b.dims[i]);
  std::string numbers = "dot_dimension_numbers = #stablehlo.dot<";
  if (!batch.empty())
    numbers += "lhs_batching_dimensions = [" + ints(batch) + "], rhs_batching_dimensions = [" + ints(batch) + "], ";
  numbers += "lhs_contracting_dimensions = [" + std::to_string(lhs_contract) + "], rhs_contracting_dimensions = [" +
             std::to_string(rhs_contract) + "]>";
  return op("stablehlo.dot_general", {as(a, t), as(b, t)}, dims, t, numbers);
}

Operand Builder::rounded_as(const Operand& x, c10::ScalarType t) {
  if (x.dtype == t || (t != c10::kBFloat16 && t != c10::kHalf)) return x;
  const bool bf16 = t == c10::kBFloat16;
  return op("stablehlo.reduce_precision", {x}, x.dims, x.dtype,
            std::string("exponent_bits = ") + (bf16 ? "8" : "5") + " : i32, mantissa_bits = " + (bf16 ? "7" : "10") +
                " : i32");
}

Operand Builder::scaled(const Operand& x, const Operand& s) {
  if (s.constant && s.constant->equal(1)) return x;
  return binary("stablehlo.multiply", x, s, x.dtype);
}

Operand Builder::slice(const Operand& x, const Dims& start, const Dims& limit, const Dims& strides) {
  Dims dims(x.dims.size());
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = (limit[i] - start[i] + strides[i] - 1) / strides[i];
  return op("stablehlo.slice", {materialized(x)}, dims, x.dtype,
            "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                ", strides = " + i64_array(strides));
}

}  // namespace fulgur::xla::stablehlo
