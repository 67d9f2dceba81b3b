// SPDX-License-Identifier: Apache-2.0
// Not a PJRT plugin: a library whose GetPjrtApi() returns a function table with no functions,
// of the version and size given at build time (FAKE_MAJOR, FAKE_MINOR, FAKE_TABLE_END: the
// last PJRT_Api entry the table claims to have). For the loader's checks in test_pjrt.

#include <pjrt_c_api.h>

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = [] {
    PJRT_Api a{};
    a.struct_size = PJRT_STRUCT_SIZE(PJRT_Api, FAKE_TABLE_END);
    a.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    a.pjrt_api_version.major_version = FAKE_MAJOR;
    a.pjrt_api_version.minor_version = FAKE_MINOR;
    return a;
  }();
  return &api;
}
