// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which local address and interface Gloo binds to in a job across machines.

#include <string>
#include <vector>

namespace fulgur::detail {

struct LocalInterface {
  std::string name;     // e.g. "eth0"
  std::string address;  // e.g. "10.0.0.2"
};

// True for "localhost", 127.0.0.0/8 and ::1.
bool is_loopback_host(const std::string& host);

// The interface (and its address) the kernel would use to reach `host`, an
// IP address or a host name. No packet is sent. Throws std::runtime_error
// naming `host` when it does not resolve or no route reaches it.
LocalInterface interface_toward(const std::string& host);

// The names of this machine's interfaces that have an address, sorted.
std::vector<std::string> interface_names();

// True when something accepts TCP connections at host:port within `timeout_ms`
// (the connection is closed at once). Logs nothing, unlike c10d's retrying connect.
bool accepts_connections(const std::string& host, int port, int timeout_ms);

}  // namespace fulgur::detail
