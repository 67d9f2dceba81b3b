#include "xla/pjrt/plugin_choice.h"

#include "runtime/env.h"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

// Defined by the source file fulgurConfig.cmake adds to programs that find an installed fulgur;
// null in every other program (a weak reference: the static library links without it).
extern "C" const char* fulgur_installed_pjrt_cpu_plugin() __attribute__((weak));

namespace fulgur::xla::pjrt {
namespace {

std::string env_or_empty(const char* name) { return runtime::env_string(name); }

bool exists(const std::string& path) { return !path.empty() && access(path.c_str(), F_OK) == 0; }

std::string venv_pip(const PluginLocations& where) { return where.venv + "/bin/pip install"; }

}  // namespace

PluginEnvironment PluginEnvironment::from_process() {
  return {env_or_empty("PJRT_DEVICE"), env_or_empty("PJRT_LIBRARY_PATH"), env_or_empty("TPU_LIBRARY_PATH")};
}

PluginLocations PluginLocations::built_in() {
  const char* installed = fulgur_installed_pjrt_cpu_plugin ? fulgur_installed_pjrt_cpu_plugin() : nullptr;
  return {FULGUR_PJRT_CPU_PLUGIN, FULGUR_XLA_VENV, FULGUR_XLA_SITE_PACKAGES, installed ? installed : ""};
}

PluginChoice choose_plugin(const PluginEnvironment& env, const PluginLocations& where) {
  const std::string device = env.pjrt_device.empty() ? "CPU" : env.pjrt_device;
  if (device != "CPU" && device != "TPU" && device != "CUDA")
    throw std::invalid_argument("PJRT_DEVICE=" + env.pjrt_device +
                                " is not a PJRT device fulgur knows; allowed: CPU (the default), TPU, CUDA, "
                                "or set PJRT_LIBRARY_PATH to a plugin file");
  if (!env.pjrt_library_path.empty()) return {env.pjrt_device, env.pjrt_library_path};
  if (device == "CPU") {
    if (exists(where.installed_cpu_plugin)) return {device, where.installed_cpu_plugin};
    if (exists(where.cpu_plugin)) return {device, where.cpu_plugin};
    std::string looked = where.installed_cpu_plugin.empty() ? "" : where.installed_cpu_plugin + " (installed package), ";
    throw std::invalid_argument("PJRT_DEVICE=CPU: the XLA CPU plugin is not at " + looked + where.cpu_plugin +
                                " (fulgur's build) and PJRT_LIBRARY_PATH is unset; run scripts/install-deps in "
                                "fulgur's checkout, reinstall fulgur, or set PJRT_LIBRARY_PATH to the plugin file");
  }
  if (device == "TPU") {
    if (!env.tpu_library_path.empty()) return {device, env.tpu_library_path};
    const std::string libtpu = where.site_packages + "/libtpu/libtpu.so";
    if (!exists(libtpu))
      throw std::invalid_argument("PJRT_DEVICE=TPU: libtpu.so not found at " + libtpu + "; on a TPU VM run `" +
                                  venv_pip(where) + " libtpu`, or set TPU_LIBRARY_PATH or PJRT_LIBRARY_PATH");
    return {device, libtpu};
  }
  const std::string cuda = where.site_packages + "/jax_plugins/xla_cuda12/xla_cuda_plugin.so";
  if (!exists(cuda))
    throw std::invalid_argument("PJRT_DEVICE=CUDA: the CUDA plugin is not at " + cuda + "; run `" + venv_pip(where) +
                                " jax-cuda12-pjrt` (it needs CUDA 12), or set PJRT_LIBRARY_PATH");
  return {device, cuda};
}

PluginChoice choose_plugin() { return choose_plugin(PluginEnvironment::from_process(), PluginLocations::built_in()); }

}  // namespace fulgur::xla::pjrt
