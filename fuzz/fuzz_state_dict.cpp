// libFuzzer target: a state_dict saved by Python's torch.save, loaded into a
// module (fulgur::load_from_checkpoint's path, from bytes). Any input must
// load or throw a std::exception; a crash, a sanitizer report or an
// allocation larger than the input is a bug.

#include "serialize/torch_archive.h"

#include <fulgur/checkpoint.h>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static torch::nn::Linear model(3, 2);
  try {
    const c10::IValue v = fulgur::detail::load_torch_archive(data, size, "fuzz input");
    if (!v.isGenericDict() || v.toGenericDict().keyType()->kind() != c10::TypeKind::StringType) return 0;
    auto sd = fulgur::make_dict();
    for (const auto& kv : v.toGenericDict()) sd.insert(kv.key().toStringRef(), kv.value());
    fulgur::load_state_dict(*model, sd, true, "fuzz input");
  } catch (const std::exception&) {
  }
  return 0;
}
