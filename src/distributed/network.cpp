// SPDX-License-Identifier: Apache-2.0
#include "distributed/network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace fulgur::detail {
namespace {

std::string numeric_address(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  const void* raw = sa->sa_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
                                             : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  return ::inet_ntop(sa->sa_family, raw, buf, sizeof(buf)) ? buf : "";
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

LocalInterface interface_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    throw std::runtime_error("MASTER_ADDR='" + host + "' does not resolve: " + ::gai_strerror(rc));
  }
  // A connected UDP socket makes the kernel choose the source address; no packet is sent.
  std::string local;
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai && local.empty(); ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage mine{};
    socklen_t len = sizeof(mine);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &len) == 0) {
      local = numeric_address(reinterpret_cast<sockaddr*>(&mine));
    } else {
      last_error = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (local.empty()) throw std::runtime_error("no route from this machine to MASTER_ADDR='" + host + "': " + last_error);

  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) throw std::runtime_error(std::string("getifaddrs failed: ") + std::strerror(errno));
  LocalInterface out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    if (numeric_address(i->ifa_addr) == local) {
      out = {i->ifa_name, local};
      break;
    }
  }
  ::freeifaddrs(ifs);
  if (out.name.empty()) {
    throw std::runtime_error("the address " + local + " that reaches MASTER_ADDR='" + host +
                             "' belongs to no interface; name one with GLOO_SOCKET_IFNAME");
  }
  return out;
}

std::vector<std::string> interface_names() {
  std::vector<std::string> names;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return names;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end()) names.push_back(i->ifa_name);
  }
  ::freeifaddrs(ifs);
  std::sort(names.begin(), names.end());
  return names;
}

bool accepts_connections(const std::string& host, int port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* ai = found; ai && !ok; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      ok = ::poll(&p, 1, timeout_ms) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

}  // namespace fulgur::detail
