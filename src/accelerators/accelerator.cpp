// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>

#include "runtime/env.h"
#include "runtime/threads.h"
#include "xla/pjrt/client.h"
#include <fulgur/xla/backend.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
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
  if (const char* env = runtime::env_value("XLA_NUM_DEVICES")) {
    int64_t n = 0;
    if (!parse_int(env, &n) || n < 1) {
      throw std::invalid_argument(std::string("XLA_NUM_DEVICES='") + env + "' must be a positive integer");
    }
    return n;
  }
  // A GPU or TPU plugin (or one named by path): its addressable devices, counted in a child
  // process. The CPU plugin: one process per core, each with its own one-device client.
  const char* device = runtime::env_value("PJRT_DEVICE");
  const char* library = runtime::env_value("PJRT_LIBRARY_PATH");
  if ((device && (std::string(device) == "CUDA" || std::string(device) == "TPU")) || (library && *library)) {
    return xla::pjrt::count_addressable_devices_in_child();
  }
  return runtime::available_cores();
}

int64_t XLAAccelerator::max_device_count() const { return std::max(auto_device_count(), runtime::available_cores()); }

c10::Device XLAAccelerator::device(int64_t /*index*/) const { return xla::backend().device(); }

void XLAAccelerator::setup_device(const c10::Device& /*device*/) { xla::backend(); }

void XLAAccelerator::teardown() {
  if (xla::backend_started()) xla::backend().reset();
}

namespace {

struct CudaCount {
  int64_t devices = 0;
  std::string reason;
};

CudaCount count_cuda_devices() {
  // libtorch_cuda registers its CUDAHooks when it is loaded; without it there is no CUDA to ask.
  if (!at::CUDAHooksRegistry()->Has("CUDAHooks")) {
    return {0, "the libtorch fulgur is linked with has no CUDA (no libtorch_cuda); build fulgur against a CUDA "
               "libtorch: cmake -DFULGUR_LIBTORCH=<a CUDA libtorch, or a CUDA torch wheel's site-packages/torch>"};
  }
  // The count initializes the CUDA driver, and a process that forks after that
  // gives its children a CUDA they cannot use: count in a child of our own.
  const pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    try {
      n = static_cast<int>(torch::cuda::device_count());
    } catch (...) {
      n = 0;
    }
    ::_exit(std::min(n, 250));
  }
  if (pid < 0) return {0, std::string("could not start the process that counts CUDA devices: ") + std::strerror(errno)};
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) return {0, "the process that counts CUDA devices died (signal " + std::to_string(WTERMSIG(status)) + ")"};
  const int64_t n = WEXITSTATUS(status);
  if (n > 0) return {n, ""};
  const char* visible = runtime::env_value("CUDA_VISIBLE_DEVICES");
  return {0, std::string("libtorch has CUDA but sees no CUDA device (no NVIDIA driver or GPU answered") +
                 (visible ? std::string(", and CUDA_VISIBLE_DEVICES='") + visible + "'" : std::string()) + ")"};
}

const CudaCount& cuda_count() {
  static const CudaCount count = count_cuda_devices();
  return count;
}

}  // namespace

int64_t cuda_device_count() { return cuda_count().devices; }

std::string cuda_unavailable_reason() { return cuda_count().reason; }

int64_t CUDAAccelerator::max_device_count() const { return cuda_device_count(); }

namespace {

std::mutex cuda_seed_mu;
std::optional<uint64_t> cuda_seed;           // seed_everything's, for devices started later
std::set<c10::DeviceIndex> cuda_started;     // devices setup_device started in this process

void seed_cuda_device(c10::DeviceIndex index, uint64_t seed) {
  at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, index));
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace

void detail::seed_cuda_generators(uint64_t seed) {
  std::lock_guard<std::mutex> lock(cuda_seed_mu);
  cuda_seed = seed;
  for (const c10::DeviceIndex i : cuda_started) seed_cuda_device(i, seed);
}

void CUDAAccelerator::setup_device(const c10::Device& device) {
  if (!device.is_cuda() || device.index() < 0 || device.index() >= cuda_device_count()) {
    throw std::invalid_argument("CUDAAccelerator: device " + device.str() + " is not one of the " +
                                std::to_string(cuda_device_count()) + " visible CUDA devices");
  }
  try {
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw std::runtime_error(
        "CUDA could not start " + device.str() + " in process " + std::to_string(::getpid()) + " (" +
        what.substr(0, what.find('\n')) +
        "). In a worker that fulgur forked, this means the launching process had already started CUDA (a CUDA "
        "tensor, torch::manual_seed, torch::cuda::device_count; fulgur::seed_everything does not), and a forked "
        "process cannot use that CUDA: remove the call before fit, or start the workers with "
        "TrainerOptions().start_method(\"spawn\")");
  }
  std::lock_guard<std::mutex> lock(cuda_seed_mu);
  if (cuda_started.insert(device.index()).second && cuda_seed) seed_cuda_device(device.index(), *cuda_seed);
}

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  if (name == "cpu") return std::make_shared<CPUAccelerator>();
  if (name == "xla") return std::make_shared<XLAAccelerator>();
  if (name == "cuda" || name == "gpu") {
    if (cuda_device_count() == 0) {
      throw std::invalid_argument("accelerator '" + name + "' asks for CUDA devices, but none is visible: " +
                                  cuda_unavailable_reason() + "; use accelerator \"cpu\" or \"xla\"");
    }
    return std::make_shared<CUDAAccelerator>();
  }
  if (name == "auto") {
    if (cuda_device_count() > 0) return std::make_shared<CUDAAccelerator>();
    return std::make_shared<XLAAccelerator>();
  }
  throw std::invalid_argument("accelerator '" + name + "' is not known; valid: \"cpu\", \"cuda\" (or \"gpu\"), \"xla\", \"auto\"");
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
