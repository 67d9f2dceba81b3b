// SPDX-License-Identifier: Apache-2.0
#pragma once
// A PJRT plugin: a shared library whose `GetPjrtApi()` returns the function table of the
// PJRT C API (pjrt_c_api.h, installed with the pinned CPU plugin; see docs/ARCHITECTURE.md,
// "The PJRT runtime"). Loading checks the table before anything is called through it.

#include <map>
#include <stdexcept>
#include <string>

struct PJRT_Api;
struct PJRT_Error;

namespace fulgur::xla::pjrt {

// A plugin that cannot be loaded, is not a usable PJRT plugin, or a PJRT call that failed.
// what() names the call (or the loading step), the plugin file and the cause, which for a
// failed call is the plugin's own message.
class PjrtError : public std::runtime_error {
 public:
  PjrtError(std::string call, std::string plugin, std::string cause);
  const std::string& call() const { return call_; }
  const std::string& plugin() const { return plugin_; }
  const std::string& cause() const { return cause_; }

 private:
  std::string call_, plugin_, cause_;
};

class Plugin {
 public:
  // The plugin at `path`, loaded once per process and kept loaded for its lifetime: dlopen,
  // dlsym("GetPjrtApi"), the API major version must equal the one fulgur is built against and
  // the function table must hold every function fulgur calls, then PJRT_Plugin_Initialize and
  // PJRT_Plugin_Attributes. Throws PjrtError (a failed load is not remembered, so a later call
  // tries again). Thread-safe.
  static const Plugin& load(const std::string& path);

  const std::string& path() const { return path_; }
  const PJRT_Api* api() const { return api_; }
  int major_version() const { return major_; }
  int minor_version() const { return minor_; }
  // The plugin's attributes (`xla_version`, `stablehlo_current_version`, ...), each value as
  // text (lists joined by '.', as StableHLO versions are written).
  const std::map<std::string, std::string>& attributes() const { return attributes_; }

  // Whether the plugin lets a program call host functions by name: it has PJRT's FFI extension
  // with handler registration (XLA:CPU and XLA:GPU plugins do).
  bool can_register_ffi_handlers() const;
  // Registers `handler` (an xla::ffi::Handler, see ffi_abi.h) as the target `name` of
  // stablehlo.custom_call ops with api_version 4 on `platform` ("cpu"), for every program the
  // plugin compiles after this. Throws PjrtError naming `name` if the plugin cannot (no FFI
  // extension) or refuses (a version it does not accept, another handler of that name).
  void register_ffi_handler(const std::string& name, void* handler, const std::string& platform) const;

  // Destroys `error` and throws PjrtError naming `call`, this plugin and the plugin's message
  // (with its status code); does nothing if `error` is null.
  void check(PJRT_Error* error, const char* call) const;

  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

 private:
  Plugin(std::string path, const PJRT_Api* api);

  std::string path_;
  const PJRT_Api* api_;
  int major_ = 0, minor_ = 0;
  std::map<std::string, std::string> attributes_;
};

}  // namespace fulgur::xla::pjrt
