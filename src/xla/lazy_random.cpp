// SPDX-License-Identifier: Apache-2.0
// Random ops on the lazy device; see <fulgur/xla/random.h> and lazy_random.h.
//
// Each draw is one lazy IR node, fulgur::rng_uniform or fulgur::rng_normal, whose operand is the
// generator's state tensor and whose outputs are the values and the state after the draw; the
// state tensor's IR value becomes that second output. The state is a live lazy tensor, so a step
// mark makes its new value an output of the step's graph and the next graph reads it as device
// data: draws chain through the graphs in the order they were traced, whatever graph runs them
// (a value read early, `loss.item()`, runs its own graph, and the step mark later computes the
// same state again from the same IR).
//
// The nodes lower (TorchScript lowering) to calls of the TorchScript ops of the same names: the
// StableHLO emitter has rules for them (rules/random.cpp, the generator written as StableHLO
// integer ops) and the TorchScript interpreter runs the host kernels below, which compute the
// same function (threefry.h), so a graph kept on TorchScript draws the same bits.
//
// The ops built on a draw are composed of ops the lazy core has nodes for and the emitter
// lowers: native_dropout = (input * (u < 1 - p) * 1 / (1 - p), u < 1 - p) with u uniform in
// float32, as libtorch's CPU kernel draws a bernoulli(1 - p) mask; its backward is the lazy
// core's native_dropout_backward node (grad * mask * scale), so the mask of the forward is the
// mask of the backward. bernoulli = (u < p) in self's dtype; uniform = from + (to - from) * u;
// normal = mean + std * z. A Generator argument is refused: the device has one generator.

#include "xla/lazy_random.h"

#include <fulgur/xla/random.h>

#include "runtime/log.h"
#include "xla/threefry.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/lazy/core/tensor.h>
#include <torch/csrc/lazy/core/tensor_util.h>
#include <torch/csrc/lazy/ts_backend/ts_node.h>
#include <torch/csrc/lazy/ts_backend/ts_node_lowering.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace fulgur::xla {
namespace {

namespace lazy = torch::lazy;

enum class Distribution { uniform, normal };

const lazy::OpKind& kind_of(Distribution d) {
  static const lazy::OpKind uniform = lazy::OpKind::Get("fulgur::rng_uniform");
  static const lazy::OpKind normal = lazy::OpKind::Get("fulgur::rng_normal");
  return d == Distribution::uniform ? uniform : normal;
}

// Outputs: the values (`shape`) and the state after the draw (int64[2]).
class RngNode : public lazy::TsNode {
 public:
  RngNode(const lazy::Value& state, Distribution d, const lazy::Shape& shape)
      : lazy::TsNode(kind_of(d), {state}, std::vector<lazy::Shape>{shape, lazy::Shape(c10::kLong, {2})}, 2,
                     // The values' shape is not an operand's: it goes into the hash.
                     lazy::MHash(shape.sizes().vec(), static_cast<int>(shape.scalar_type()))) {}

  lazy::TSOpVector Lower(std::shared_ptr<torch::jit::GraphFunction> function,
                         lazy::TSLoweringContext* loctx) const override {
    const lazy::Shape& s = shape(0);
    std::vector<torch::jit::NamedValue> args = {
        loctx->GetOutputOp(operand(0)), torch::jit::NamedValue(c10::IValue(s.sizes().vec())),
        torch::jit::NamedValue(c10::IValue(static_cast<int64_t>(s.scalar_type())))};
    return lazy::LowerTSBuiltin(function, op().op, args);
  }
};

// libtorch's default CPU seed, the seed before any seeding (c10::detail::default_rng_seed_val).
constexpr uint64_t kDefaultSeed = 67280421310721ull;

class DeviceGenerator {
 public:
  void seed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    restored_.reset();
    state_.reset();
  }

  void restore(const std::array<int64_t, 2>& state) {
    std::lock_guard<std::mutex> lock(mu_);
    restored_ = state;
    state_.reset();
  }

  at::Tensor state() {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_) return lazy::CreateAtenFromLtcTensor(state_).to(at::kCPU);
    const std::array<int64_t, 2> s = initial();
    return at::tensor(std::vector<int64_t>{s[0], s[1]}, at::kLong);
  }

  // The values of a draw of `shape` on `device`.
  lazy::Value draw(Distribution d, const lazy::Shape& shape, const lazy::BackendDevice& device) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_) {
      const std::array<int64_t, 2> s = initial();
      state_ = lazy::LazyTensor::Create(at::tensor(std::vector<int64_t>{s[0], s[1]}, at::kLong), device);
    }
    TORCH_CHECK(state_->GetDevice() == device, "xla random ops: the device generator is on ", state_->GetDevice().toString(),
                ", a draw asked for ", device.toString(), " (fulgur runs one xla device per process)");
    lazy::NodePtr node = std::make_shared<RngNode>(state_->GetIrValue(), d, shape);
    state_->SetIrValue(lazy::Value(node, 1));
    return lazy::Value(node, 0);
  }

 private:
  // The state of the first draw: a restored one, else (key of the seed and rank, offset 0).
  std::array<int64_t, 2> initial() const {
    if (restored_) return *restored_;
    return {static_cast<int64_t>(random::key_of(seed_, runtime::global_rank())), 0};
  }

  std::mutex mu_;
  uint64_t seed_ = kDefaultSeed;
  std::optional<std::array<int64_t, 2>> restored_;
  lazy::LazyTensorPtr state_;  // the device tensor, from the first draw on
};

// Never destroyed: its lazy tensor must not outlive the lazy core at exit.
DeviceGenerator& generator() {
  static DeviceGenerator* g = new DeviceGenerator;
  return *g;
}

void refuse_generator(const std::optional<at::Generator>& gen, const char* op) {
  TORCH_CHECK(!gen.has_value() || !gen->defined(), op,
              " on an xla device with a Generator argument: xla devices draw from the device generator only (seed it "
              "with fulgur::seed_everything or fulgur::xla::manual_seed)");
}

// A draw of `sizes` in `dtype` on self's device, as a lazy tensor.
at::Tensor draw(Distribution d, const at::Tensor& like, at::IntArrayRef sizes, at::ScalarType dtype, const char* op) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16, op,
              " on an xla device: draws floating types (float32, float64, float16, bfloat16), not ",
              c10::toString(dtype));
  const lazy::BackendDevice device = lazy::atenDeviceToBackendDevice(like.device());
  lazy::Value v = generator().draw(d, lazy::Shape(dtype, sizes), device);
  return lazy::CreateAtenFromLtcTensor(lazy::LazyTensor::Create(std::move(v), device));
}

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if ((train.has_value() && !*train) || input.numel() == 0) {
    // Nothing dropped: a mask of ones (zeros_like and a comparison, ops the emitter lowers).
    return {input.clone(), at::eq(at::zeros_like(input), 0)};
  }
  const at::Tensor u = draw(Distribution::uniform, input, input.sizes(), at::kFloat, "dropout");
  const at::Tensor mask = at::lt(u, 1.0 - p);
  // libtorch's kernel: scale 0 for p = 1 (every element dropped), not 1/0.
  const double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  return {at::mul(at::mul(input, mask), scale), mask};
}

at::Tensor bernoulli(const at::Tensor& self, std::optional<at::Generator> gen) {
  refuse_generator(gen, "bernoulli");
  const at::Tensor u = draw(Distribution::uniform, self, self.sizes(), at::kFloat, "bernoulli");
  return at::lt(u, self).to(self.scalar_type());
}

at::Tensor bernoulli_p(const at::Tensor& self, double p, std::optional<at::Generator> gen) {
  refuse_generator(gen, "bernoulli");
  TORCH_CHECK(p >= 0 && p <= 1, "bernoulli expects p to be in [0, 1], but got p=", p);
  const at::Tensor u = draw(Distribution::uniform, self, self.sizes(), at::kFloat, "bernoulli");
  return at::lt(u, p).to(self.scalar_type());
}

at::Tensor bernoulli_tensor(const at::Tensor& self, const at::Tensor& p, std::optional<at::Generator> gen) {
  refuse_generator(gen, "bernoulli_");
  const at::Tensor u = draw(Distribution::uniform, self, self.sizes(), at::kFloat, "bernoulli_");
  return at::lt(u, p).to(self.scalar_type());
}

at::Tensor lazy_uniform(const at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  refuse_generator(gen, "uniform_");
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
  at::Tensor u = draw(Distribution::uniform, self, self.sizes(), self.scalar_type(), "uniform_");
  if (from == 0 && to == 1) return u;
  return at::add(at::mul(u, to - from), from);
}

at::Tensor lazy_normal(const at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  refuse_generator(gen, "normal_");
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  at::Tensor z = draw(Distribution::normal, self, self.sizes(), self.scalar_type(), "normal_");
  if (std != 1) z = at::mul(z, std);
  if (mean != 0) z = at::add(z, mean);
  return z;
}

// The in-place forms, for a lazy tensor outside functionalization (rand_like and randn_like
// call uniform_ and normal_ on the unwrapped tensor empty_like made): libtorch's lazy core
// replaces such a tensor's value with its own draw otherwise. Functionalization turns the
// in-place op of a wrapped tensor into the functional one above.
at::Tensor& assign(at::Tensor& self, const at::Tensor& value) {
  lazy::TryGetLtcTensor(self)->SetInPlaceIrValue(lazy::TryGetLtcTensor(value)->GetIrValue());
  return self;
}

at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  return assign(self, lazy_uniform(self, from, to, std::move(gen)));
}

at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  return assign(self, lazy_normal(self, mean, std, std::move(gen)));
}

at::Tensor& bernoulli_p_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  return assign(self, bernoulli_p(self, p, std::move(gen)));
}

at::Tensor& bernoulli_tensor_(at::Tensor& self, const at::Tensor& p, std::optional<at::Generator> gen) {
  return assign(self, bernoulli_tensor(self, p, std::move(gen)));
}

// --- The host kernels of the TorchScript ops -------------------------------------------------

// The significand bits a uniform number of `dtype` takes (at most 24: it is made in float32).
int digits_of(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return 8;
  if (dtype == at::kHalf) return 11;
  return 24;
}

std::pair<uint64_t, uint64_t> key_and_offset(const at::Tensor& state) {
  TORCH_CHECK(state.scalar_type() == at::kLong && state.numel() == 2,
              "fulgur::rng_*: the state must be 2 int64s (key, offset), got ", state.sizes(), " ",
              c10::toString(state.scalar_type()));
  const at::Tensor s = state.contiguous();
  return {static_cast<uint64_t>(s.data_ptr<int64_t>()[0]), static_cast<uint64_t>(s.data_ptr<int64_t>()[1])};
}

at::Tensor next_state(uint64_t key, uint64_t offset, int64_t n) {
  return at::tensor(std::vector<int64_t>{static_cast<int64_t>(key), static_cast<int64_t>(offset + static_cast<uint64_t>(n))},
                    at::kLong);
}

std::tuple<at::Tensor, at::Tensor> rng_uniform_host(const at::Tensor& state, at::IntArrayRef size, at::ScalarType dtype) {
  const auto [key, offset] = key_and_offset(state);
  at::Tensor out = at::empty(size, at::kFloat);
  float* p = out.data_ptr<float>();
  const int digits = digits_of(dtype);
  for (int64_t i = 0; i < out.numel(); ++i)
    p[i] = random::uniform_from_word(random::words(key, offset, static_cast<uint64_t>(i)).first, digits);
  return {out.to(dtype), next_state(key, offset, out.numel())};
}

template <class T>
void normals(uint64_t key, uint64_t offset, T* p, int64_t n) {
  const T two_pi = static_cast<T>(2 * M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const auto [w0, w1] = random::words(key, offset, static_cast<uint64_t>(i));
    const T u1 = static_cast<T>(random::uniform_from_word(w0, 24));
    const T u2 = static_cast<T>(random::uniform_from_word(w1, 24));
    p[i] = std::sqrt(static_cast<T>(-2) * std::log(static_cast<T>(1) - u1)) * std::cos(u2 * two_pi);
  }
}

std::tuple<at::Tensor, at::Tensor> rng_normal_host(const at::Tensor& state, at::IntArrayRef size, at::ScalarType dtype) {
  const auto [key, offset] = key_and_offset(state);
  at::Tensor out;
  if (dtype == at::kDouble) {
    out = at::empty(size, at::kDouble);
    normals(key, offset, out.data_ptr<double>(), out.numel());
  } else {
    out = at::empty(size, at::kFloat);
    normals(key, offset, out.data_ptr<float>(), out.numel());
  }
  return {out.to(dtype), next_state(key, offset, out.numel())};
}

// Drops the dispatcher's warning that a kernel replaces libtorch's (the replacement is meant).
class QuietWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

}  // namespace

void manual_seed(uint64_t seed) { generator().seed(seed); }

at::Tensor rng_state() { return generator().state(); }

void set_rng_state(const at::Tensor& state) {
  if (!state.defined() || state.scalar_type() != at::kLong || state.numel() != 2)
    throw std::invalid_argument("xla::set_rng_state: the state must be 2 int64s (key, offset) as rng_state() gives, got " +
                                (state.defined() ? c10::str(state.sizes(), " ", c10::toString(state.scalar_type()))
                                                 : std::string("an undefined tensor")));
  const at::Tensor s = state.to(at::kCPU).contiguous();
  generator().restore({s.data_ptr<int64_t>()[0], s.data_ptr<int64_t>()[1]});
}

namespace detail {

void install_lazy_random_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static torch::Library defs(torch::Library::FRAGMENT, "fulgur", std::nullopt, __FILE__, __LINE__);
    defs.def("rng_uniform(Tensor state, int[] size, ScalarType dtype) -> (Tensor, Tensor)");
    defs.def("rng_normal(Tensor state, int[] size, ScalarType dtype) -> (Tensor, Tensor)");
    static torch::Library host(torch::Library::IMPL, "fulgur", c10::DispatchKey::CPU, __FILE__, __LINE__);
    host.impl("rng_uniform", TORCH_FN(rng_uniform_host));
    host.impl("rng_normal", TORCH_FN(rng_normal_host));
    QuietWarnings quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::Lazy, __FILE__, __LINE__);
    lib.impl("native_dropout", TORCH_FN(native_dropout));
    lib.impl("bernoulli", TORCH_FN(bernoulli));
    lib.impl("bernoulli.p", TORCH_FN(bernoulli_p));
    lib.impl("bernoulli.Tensor", TORCH_FN(bernoulli_tensor));
    lib.impl("uniform", TORCH_FN(lazy_uniform));
    lib.impl("normal_functional", TORCH_FN(lazy_normal));
    lib.impl("uniform_", TORCH_FN(uniform_));
    lib.impl("normal_", TORCH_FN(normal_));
    lib.impl("bernoulli_.float", TORCH_FN(bernoulli_p_));
    lib.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_tensor_));
  });
}

}  // namespace detail
}  // namespace fulgur::xla
