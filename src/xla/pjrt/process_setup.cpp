// SPDX-License-Identifier: Apache-2.0
// What a process settles around its PJRT client without holding one (client.h): the devices a
// client would see, counted in a child process, and torch_xla's per-process TPU variables.
#include "xla/pjrt/client.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fulgur::xla::pjrt {

int64_t count_addressable_devices_in_child() {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(std::string("counting the PJRT devices: pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string answer;
    try {
      answer = "ok " + std::to_string(process_client().addressable_devices());
    } catch (const std::exception& e) {
      answer = std::string("error ") + e.what();
    }
    const ssize_t n = ::write(fds[1], answer.data(), answer.size());
    ::_exit(n == static_cast<ssize_t>(answer.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    throw std::runtime_error(std::string("counting the PJRT devices: fork: ") + std::strerror(errno));
  }
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (answer.rfind("ok ", 0) == 0) return std::stoll(answer.substr(3));
  throw std::runtime_error("counting the PJRT devices for devices=\"auto\": " +
                           (answer.empty() ? std::string("the counting process died") : answer.substr(6)));
}

namespace {

std::vector<int64_t> parse_grid(const std::string& text, const char* name) {
  std::vector<int64_t> dims;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, end - start);
    int64_t v = 0;
    bool ok = !part.empty() && part.size() < 10;
    for (char c : part) ok = ok && c >= '0' && c <= '9';
    if (ok) v = std::stoll(part);
    if (!ok || v < 1)
      throw std::invalid_argument(std::string(name) + "='" + text + "' is not a grid of three positive counts like 2,2,1");
    dims.push_back(v);
    start = end + 1;
  }
  if (dims.size() != 3)
    throw std::invalid_argument(std::string(name) + "='" + text + "' is not a grid of three positive counts like 2,2,1");
  return dims;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> tpu_process_environment(
    int64_t local_rank, int64_t local_world_size, const std::function<const char*(const char*)>& env) {
  std::vector<std::pair<std::string, std::string>> out;
  auto set = [&](const char* name, const std::string& value) {
    if (!env(name)) out.emplace_back(name, value);
  };
  std::vector<int64_t> chips;
  if (const char* v = env("TPU_CHIPS_PER_HOST_BOUNDS")) {
    chips = parse_grid(v, "TPU_CHIPS_PER_HOST_BOUNDS");
  } else if (local_world_size == 1 || local_world_size == 2 || local_world_size == 4 || local_world_size == 8) {
    chips = local_world_size == 1   ? std::vector<int64_t>{1, 1, 1}
            : local_world_size == 2 ? std::vector<int64_t>{1, 2, 1}
            : local_world_size == 4 ? std::vector<int64_t>{2, 2, 1}
                                    : std::vector<int64_t>{2, 4, 1};
  } else {
    throw std::invalid_argument("a TPU host with " + std::to_string(local_world_size) +
                                " processes has no default chip grid (1, 2, 4 or 8 processes have one); set "
                                "TPU_CHIPS_PER_HOST_BOUNDS, e.g. 2,2,1");
  }
  const std::vector<int64_t> hosts = env("TPU_HOST_BOUNDS") ? parse_grid(env("TPU_HOST_BOUNDS"), "TPU_HOST_BOUNDS")
                                                            : std::vector<int64_t>{1, 1, 1};
  const int64_t worker = env("TPU_WORKER_ID") ? std::stoll(env("TPU_WORKER_ID")) : 0;
  constexpr int64_t kBasePort = 8476;
  std::string addresses;
  const std::string hostnames = env("TPU_WORKER_HOSTNAMES") ? env("TPU_WORKER_HOSTNAMES") : "localhost";
  size_t start = 0;
  while (start <= hostnames.size()) {
    const size_t end = std::min(hostnames.find(',', start), hostnames.size());
    const std::string host = hostnames.substr(start, end - start);
    for (int64_t r = 0; r < local_world_size; ++r)
      addresses += (addresses.empty() ? "" : ",") + host + ":" + std::to_string(kBasePort + r);
    start = end + 1;
  }
  set("TPU_VISIBLE_CHIPS", std::to_string(local_rank));
  set("TPU_CHIPS_PER_PROCESS_BOUNDS", "1,1,1");
  set("TPU_PROCESS_BOUNDS", std::to_string(chips[0] * hosts[0]) + "," + std::to_string(chips[1] * hosts[1]) + "," +
                                std::to_string(chips[2] * hosts[2]));
  set("TPU_PROCESS_PORT", std::to_string(kBasePort + local_rank));
  set("TPU_PROCESS_ADDRESSES", addresses);
  set("CLOUD_TPU_TASK_ID", std::to_string(worker * local_world_size + local_rank));
  return out;
}

}  // namespace fulgur::xla::pjrt
