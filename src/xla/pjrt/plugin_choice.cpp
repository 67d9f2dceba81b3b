// SPDX-License-Identifier: Apache-2.0
#include "xla/pjrt/plugin_choice.h"

#include "runtime/env.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
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
  std::vector<std::string> others;
  auto add = [&](const std::string& pattern) {
    glob_t g{};
    if (::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g) == 0) {
      std::vector<std::string> found(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      std::sort(found.rbegin(), found.rend());  // the newest Python first
      others.insert(others.end(), found.begin(), found.end());
    }
    ::globfree(&g);
  };
  if (const std::string venv = env_or_empty("VIRTUAL_ENV"); !venv.empty()) add(venv + "/lib/python3*/site-packages");
  // The environment of the first python3 on PATH (an activated or a listed virtual environment).
  const std::string path = env_or_empty("PATH");
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (!dir.empty() && exists(dir + "/python3")) {
      add(dir + "/../lib/python3*/site-packages");
      break;
    }
    start = end + 1;
  }
  // The environment whose torch fulgur was built with.
  if (const std::string torch_site = FULGUR_LIBTORCH_SITE_PACKAGES; !torch_site.empty()) others.push_back(torch_site);
  add("/usr/local/lib/python3*/dist-packages");
  add("/usr/local/lib/python3*/site-packages");
  add("/usr/lib/python3/dist-packages");
  return {FULGUR_PJRT_CPU_PLUGIN, FULGUR_XLA_VENV, FULGUR_XLA_SITE_PACKAGES, installed ? installed : "", others};
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
  // jax-cuda13-pjrt, then jax-cuda12-pjrt, in each folder in turn.
  std::vector<std::string> folders{where.site_packages};
  folders.insert(folders.end(), where.other_site_packages.begin(), where.other_site_packages.end());
  std::string looked;
  for (const auto& folder : folders) {
    for (const char* package : {"xla_cuda13", "xla_cuda12"}) {
      const std::string cuda = folder + "/jax_plugins/" + package + "/xla_cuda_plugin.so";
      if (exists(cuda)) return {device, cuda};
      looked += (looked.empty() ? "" : ", ") + cuda;
    }
  }
  throw std::invalid_argument("PJRT_DEVICE=CUDA: no CUDA plugin found (looked at " + looked + "); run `" +
                              venv_pip(where) + " jax-cuda13-pjrt` (CUDA 13) or `jax-cuda12-pjrt` (CUDA 12), or set "
                              "PJRT_LIBRARY_PATH to the plugin file");
}

PluginChoice choose_plugin() { return choose_plugin(PluginEnvironment::from_process(), PluginLocations::built_in()); }

}  // namespace fulgur::xla::pjrt
