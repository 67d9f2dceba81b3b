#include "xla/backend.h"

#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace fulgur::xla {
namespace {

class EagerBackend : public Backend {
 public:
  std::string name() const override { return "eager"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void mark_step() override {}
};

std::unique_ptr<Backend>& instance() {
  static std::unique_ptr<Backend> b;
  return b;
}

}  // namespace

std::unique_ptr<Backend> make_lazy_backend();  // lazy_backend.cpp

Backend& backend() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& b = instance();
  if (!b) {
    const char* env = std::getenv("FULGUR_XLA_BACKEND");
    const std::string name = env && *env ? env : "lazy";
    if (name == "eager") {
      b = std::make_unique<EagerBackend>();
    } else if (name == "lazy") {
      b = make_lazy_backend();
    } else {
      throw std::invalid_argument("FULGUR_XLA_BACKEND='" + name + "' is not a backend; valid: \"lazy\", \"eager\"");
    }
  }
  return *b;
}

bool backend_started() { return instance() != nullptr; }

void mark_step() {
  if (backend_started()) instance()->mark_step();
}

}  // namespace fulgur::xla
