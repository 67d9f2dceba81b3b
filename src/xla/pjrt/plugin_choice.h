// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which PJRT plugin file a process loads, with torch_xla's names:
//   PJRT_DEVICE=CPU (the default)  the CPU plugin pinned in scripts/requirements-xla.txt: the copy
//                                  an installed fulgur records (its package's lib/fulgur/pjrt, for
//                                  programs built with find_package(fulgur)), else the one this
//                                  build was configured with (the checkout's .venv/xla)
//   PJRT_DEVICE=TPU                libtpu.so: TPU_LIBRARY_PATH, else the `libtpu` pip package
//                                  in fulgur's virtual environment
//   PJRT_DEVICE=CUDA               xla_cuda_plugin.so of the `jax-cuda13-pjrt` or `jax-cuda12-pjrt`
//                                  pip package (in that order), looked for in fulgur's virtual
//                                  environment, then the active one ($VIRTUAL_ENV), the one of
//                                  the first python3 on PATH, the one whose torch fulgur was
//                                  built with, then the system's Python packages
//                                  (/usr/local/lib/python3*/dist-packages and site-packages,
//                                  /usr/lib/python3/dist-packages)
//   PJRT_LIBRARY_PATH=<file>       that plugin file instead, whatever PJRT_DEVICE says
// The CPU plugin is tested in CI; the CUDA one by scripts/device-check on a GPU machine.

#include <string>
#include <vector>

namespace fulgur::xla::pjrt {

struct PluginEnvironment {
  std::string pjrt_device;        // PJRT_DEVICE; empty = CPU
  std::string pjrt_library_path;  // PJRT_LIBRARY_PATH; empty = unset
  std::string tpu_library_path;   // TPU_LIBRARY_PATH; empty = unset

  // The variables of this process.
  static PluginEnvironment from_process();
};

// Where fulgur's build found things (CMake: FULGUR_PJRT_CPU_PLUGIN, FULGUR_XLA_VENV,
// FULGUR_XLA_SITE_PACKAGES), and where an installed fulgur put its CPU plugin.
struct PluginLocations {
  std::string cpu_plugin;     // the pinned CPU plugin file
  std::string venv;           // fulgur's virtual environment (.venv/xla)
  std::string site_packages;  // its site-packages
  // The pinned CPU plugin's copy in an installed package: fulgurConfig.cmake compiles its path
  // into each program that finds the package (fulgur_installed_pjrt_cpu_plugin); empty otherwise.
  std::string installed_cpu_plugin = "";
  // More site-packages folders where a GPU plugin may be, searched after `site_packages`.
  std::vector<std::string> other_site_packages = {};

  static PluginLocations built_in();
};

struct PluginChoice {
  std::string device;  // "CPU", "TPU", "CUDA", or empty: a PJRT_LIBRARY_PATH plugin of no named device
  std::string path;    // the plugin file
};

// Throws std::invalid_argument for an unknown PJRT_DEVICE (naming the value and the allowed
// ones) and for a named device whose plugin is not installed (saying how to install it). A
// PJRT_LIBRARY_PATH file is not checked here; Plugin::load reports a missing file.
PluginChoice choose_plugin(const PluginEnvironment& env, const PluginLocations& locations);

// choose_plugin(PluginEnvironment::from_process(), PluginLocations::built_in()).
PluginChoice choose_plugin();

}  // namespace fulgur::xla::pjrt
