#include <fulgur/accelerators/accelerator.h>

#include "runtime/threads.h"
#include <fulgur/xla/backend.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fulgur {
namespace {

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return false;
  try {
    *out = std::stoll(s);
  } catch (...) {
    return false;
  }
  return true;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

int64_t CPUAccelerator::max_device_count() const { return runtime::available_cores(); }

c10::Device CPUAccelerator::device(int64_t /*index*/) const { return c10::Device(c10::kCPU); }

void CPUAccelerator::setup_device(const c10::Device& device) {
  if (!device.is_cpu()) throw std::invalid_argument("CPUAccelerator: device " + device.str() + " is not a cpu device");
}

int64_t XLAAccelerator::auto_device_count() const {
  if (const char* env = std::getenv("XLA_NUM_DEVICES"); env && *env) {
    int64_t n = 0;
    if (!parse_int(env, &n) || n < 1) {
      throw std::invalid_argument(std::string("XLA_NUM_DEVICES='") + env + "' must be a positive integer");
    }
    return n;
  }
  return runtime::available_cores();
}

int64_t XLAAccelerator::max_device_count() const { return std::max(auto_device_count(), runtime::available_cores()); }

c10::Device XLAAccelerator::device(int64_t /*index*/) const { return xla::backend().device(); }

void XLAAccelerator::setup_device(const c10::Device& /*device*/) { xla::backend(); }

void XLAAccelerator::teardown() {
  if (xla::backend_started()) xla::backend().reset();
}

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  if (name == "cpu") return std::make_shared<CPUAccelerator>();
  if (name == "xla" || name == "auto") return std::make_shared<XLAAccelerator>();
  throw std::invalid_argument("accelerator '" + name + "' is not known; valid: \"cpu\", \"xla\", \"auto\"");
}

std::vector<int64_t> parse_devices(const std::string& spec_in, const Accelerator& accelerator) {
  const std::string spec = trim(spec_in);
  const int64_t available = accelerator.max_device_count();
  const std::string allowed = "; allowed: \"auto\", a count 1.." + std::to_string(available) +
                              ", or distinct indices in [0, " + std::to_string(available) + ") like \"0,1\"";
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("devices='" + spec_in + "' " + why + " (accelerator " + accelerator.name() + ")" +
                                 allowed);
  };
  std::vector<int64_t> out;
  if (spec == "auto") {
    const int64_t n = accelerator.auto_device_count();
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  if (spec.find(',') == std::string::npos) {
    int64_t n = 0;
    if (!parse_int(spec, &n)) throw bad("is not a number, a list or \"auto\"");
    if (n == 0) throw bad("asks for zero devices");
    if (n < 0) throw bad("is negative");
    if (n > available) throw bad("asks for more devices than exist (" + std::to_string(available) + ")");
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  std::stringstream ss(spec);
  std::string item;
  std::set<int64_t> seen;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    int64_t i = 0;
    if (!parse_int(item, &i)) throw bad("has '" + item + "', which is not an index");
    if (i < 0 || i >= available) throw bad("has index " + item + ", which does not exist");
    if (!seen.insert(i).second) throw bad("names device " + item + " twice");
    out.push_back(i);
  }
  if (out.empty()) throw bad("names no device");
  return out;
}

}  // namespace fulgur
