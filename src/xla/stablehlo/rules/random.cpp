// SPDX-License-Identifier: Apache-2.0
// Random rules: the device generator's draws (fulgur::rng_uniform, fulgur::rng_normal: state ->
// values, new state; src/xla/lazy_random.cpp makes them) and dropout's backward.
//
// A draw is Threefry-2x32 (src/xla/threefry.h, the host function it must equal bit for bit)
// written as StableHLO integer ops on i32 words (add and multiply wrap, shift_right_logical
// shifts in zeros), element i from counter offset + i under the state's key, not
// stablehlo.rng_bit_generator: the TorchScript interpreter runs the same function on the host for
// a graph kept there, tests compare XLA's bits with it, and every plugin draws the same numbers
// (rng_bit_generator's bits are the plugin's choice; the pinned CPU plugin compiles it and
// stablehlo.rng too). XLA expands rng_bit_generator into integer ops of this kind itself.

#include "xla/stablehlo/lowering.h"
#include "xla/threefry.h"

#include <cmath>

namespace fulgur::xla::stablehlo {
namespace {

int64_t element_count(const Dims& dims) {
  int64_t k = 1;
  for (int64_t d : dims) k *= d;
  return k;
}

// An i32 constant with the bits of `v`.
Operand word(LoweringContext& cx, uint32_t v) { return cx.splat(static_cast<int64_t>(static_cast<int32_t>(v)), {}, c10::kInt); }

Operand rotl(LoweringContext& cx, const Operand& x, int r) {
  const Operand left = cx.binary("stablehlo.shift_left", x, word(cx, static_cast<uint32_t>(r)), c10::kInt);
  const Operand right = cx.binary("stablehlo.shift_right_logical", x, word(cx, static_cast<uint32_t>(32 - r)), c10::kInt);
  return cx.binary("stablehlo.or", left, right, c10::kInt);
}

// threefry2x32_20 of 0-d key words and counter words of any shape, as random::threefry2x32.
std::pair<Operand, Operand> threefry(LoweringContext& cx, const Operand& k0, const Operand& k1, const Operand& c0,
                                     const Operand& c1) {
  const Operand ks[3] = {k0, k1,
                         cx.binary("stablehlo.xor", cx.binary("stablehlo.xor", word(cx, random::kParity), k0, c10::kInt),
                                   k1, c10::kInt)};
  Operand x0 = cx.binary("stablehlo.add", c0, ks[0], c10::kInt);
  Operand x1 = cx.binary("stablehlo.add", c1, ks[1], c10::kInt);
  for (int group = 0; group < 5; ++group) {
    for (int r = 0; r < 4; ++r) {
      x0 = cx.binary("stablehlo.add", x0, x1, c10::kInt);
      x1 = rotl(cx, x1, random::kRotations[(group % 2) * 4 + r]);
      x1 = cx.binary("stablehlo.xor", x1, x0, c10::kInt);
    }
    x0 = cx.binary("stablehlo.add", x0, ks[(group + 1) % 3], c10::kInt);
    const Operand inject = cx.binary("stablehlo.add", ks[(group + 2) % 3], word(cx, static_cast<uint32_t>(group + 1)), c10::kInt);
    x1 = cx.binary("stablehlo.add", x1, inject, c10::kInt);
  }
  return {x0, x1};
}

// The low and high 32-bit words of i64 values (a convert to i32 keeps the low bits).
std::pair<Operand, Operand> split_words(LoweringContext& cx, const Operand& x) {
  const Operand high = cx.binary("stablehlo.shift_right_logical", x, cx.splat(32, {}, c10::kLong), c10::kLong);
  return {cx.as(x, c10::kInt), cx.as(high, c10::kInt)};
}

struct Draw {
  Operand x0, x1;    // the two words of each element, flat
  Operand new_state; // (key, offset + n)
};

// The words of a draw of `n` elements from the state operand (i64[2]: key, offset).
Draw draw(LoweringContext& cx, const Operand& state, int64_t n) {
  const Operand key = cx.reshape(cx.slice(state, {0}, {1}, {1}), {});
  const Operand offset = cx.reshape(cx.slice(state, {1}, {2}, {1}), {});
  const Operand iota = cx.op("stablehlo.iota", {}, {n}, c10::kLong, "iota_dimension = 0 : i64");
  const Operand counter = cx.add(iota, offset);
  const auto [k0, k1] = split_words(cx, key);
  const auto [c0, c1] = split_words(cx, counter);
  const auto [x0, x1] = threefry(cx, k0, k1, c0, c1);
  const Operand next = cx.add(offset, cx.splat(n, {}, c10::kLong));
  const Operand state_out = cx.op("stablehlo.concatenate", {cx.reshape(key, {1}), cx.reshape(next, {1})}, {2}, c10::kLong,
                                  "dimension = 0 : i64");
  return {x0, x1, state_out};
}

// Uniform numbers in [0, 1) in float32 from words: the top `digits` bits times 2^-digits, as
// random::uniform_from_word.
Operand uniform_from_words(LoweringContext& cx, const Operand& w, int digits) {
  const Operand bits = cx.binary("stablehlo.shift_right_logical", w, word(cx, static_cast<uint32_t>(32 - digits)), c10::kInt);
  return cx.mul(cx.as(bits, c10::kFloat), cx.splat(1.0 / static_cast<double>(1u << digits), {}, c10::kFloat));
}

int digits_of(c10::ScalarType t) {
  if (t == c10::kBFloat16) return 8;
  if (t == c10::kHalf) return 11;
  return 24;
}

void check_state(LoweringContext& cx, const Node* n) {
  const Operand& s = cx.in(n, 0);
  if (s.dtype != c10::kLong || s.dims != Dims{2}) throw Unsupported{"state of type " + mlir_type(s.dims, s.dtype)};
}

// (state, size, dtype) -> (uniform values in [0, 1), new state).
void rng_uniform(LoweringContext& cx, const Node* n) {
  check_state(cx, n);
  const Dims dims = cx.out_dims(n, 0);
  const c10::ScalarType t = cx.out_dtype(n, 0);
  const Draw d = draw(cx, cx.in(n, 0), element_count(dims));
  cx.set(n, 0, cx.as(cx.reshape(uniform_from_words(cx, d.x0, digits_of(t)), dims), t));
  cx.set(n, 1, d.new_state);
}

// (state, size, dtype) -> (standard normal values, new state): Box-Muller's cosine half,
// sqrt(-2 log(1 - u1)) cos(2 pi u2), in float64 for float64 and in float32 otherwise.
void rng_normal(LoweringContext& cx, const Node* n) {
  check_state(cx, n);
  const Dims dims = cx.out_dims(n, 0);
  const c10::ScalarType t = cx.out_dtype(n, 0);
  const c10::ScalarType ct = t == c10::kDouble ? c10::kDouble : c10::kFloat;
  const Draw d = draw(cx, cx.in(n, 0), element_count(dims));
  const Operand u1 = cx.as(uniform_from_words(cx, d.x0, 24), ct);
  const Operand u2 = cx.as(uniform_from_words(cx, d.x1, 24), ct);
  const Operand log = cx.unary("stablehlo.log", cx.sub(cx.splat(1, {}, ct), u1));
  const Operand radius = cx.unary("stablehlo.sqrt", cx.mul(cx.splat(-2, {}, ct), log));
  const Operand angle = cx.mul(u2, cx.splat(2 * M_PI, {}, ct));
  const Operand z = cx.mul(radius, cx.unary("stablehlo.cosine", angle));
  cx.set(n, 0, cx.as(cx.reshape(z, dims), t));
  cx.set(n, 1, d.new_state);
}

// (grad, mask, scale): grad * mask * scale, as libtorch's kernel.
void native_dropout_backward(LoweringContext& cx, const Node* n) {
  const c10::ScalarType t = cx.out_dtype(n);
  const Operand masked = cx.binary("stablehlo.multiply", cx.in(n, 0), cx.in(n, 1), t);
  cx.set(n, 0, cx.binary("stablehlo.multiply", masked, cx.in(n, 2), t));
}

}  // namespace

void add_random_rules(RuleTable& table) {
  table.add("fulgur::rng_uniform", rng_uniform, "XlaOps.DeviceGeneratorDrawsTheHostThreefryBits");
  table.add("fulgur::rng_normal", rng_normal, "XlaOps.DeviceGeneratorDrawsTheHostThreefryBits");
  table.add("aten::native_dropout_backward", native_dropout_backward,
            "XlaOps.DropoutKeepsOneMinusPScalesAndItsBackwardUsesTheSameMask");
}

}  // namespace fulgur::xla::stablehlo
