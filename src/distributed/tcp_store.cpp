// SPDX-License-Identifier: Apache-2.0
#include "distributed/tcp_store.h"

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

namespace fulgur::detail {

c10::intrusive_ptr<::c10d::TCPStore> open_tcp_store(const std::string& host, const ::c10d::TCPStoreOptions& opts) {
  if (opts.isServer) return c10::make_intrusive<::c10d::TCPStore>(host, opts);
  // Shared with the thread, which may outlive this call.
  auto result = std::make_shared<std::promise<c10::intrusive_ptr<::c10d::TCPStore>>>();
  std::future<c10::intrusive_ptr<::c10d::TCPStore>> done = result->get_future();
  std::thread([host, opts, result] {
    try {
      result->set_value(c10::make_intrusive<::c10d::TCPStore>(host, opts));
    } catch (...) {
      result->set_exception(std::current_exception());
    }
  }).detach();
  const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(opts.timeout) + std::chrono::seconds(1);
  if (done.wait_for(limit) != std::future_status::ready) {
    throw std::runtime_error("timed out after " + std::to_string(limit.count()) + " ms: " + host + ":" +
                             std::to_string(opts.port) + " accepted the connection but never answered as a store");
  }
  return done.get();
}

}  // namespace fulgur::detail
