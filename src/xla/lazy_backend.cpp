#include "xla/backend.h"

namespace fulgur::xla {
namespace {

// Placeholder until the torch::lazy backend lands: xla devices run eagerly.
class PendingLazyBackend : public Backend {
 public:
  std::string name() const override { return "eager"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void mark_step() override {}
};

}  // namespace

std::unique_ptr<Backend> make_lazy_backend() { return std::make_unique<PendingLazyBackend>(); }

}  // namespace fulgur::xla
