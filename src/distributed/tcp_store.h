// SPDX-License-Identifier: Apache-2.0
#pragma once
// c10d's TCPStore, opened so that a client never waits without end.
//
// A client TCPStore pings the server from its constructor and reads the reply with no timeout:
// a program that accepts connections on the port but never answers (another program holding
// MASTER_PORT) would hold the caller forever. open_tcp_store runs a client's construction on a
// thread of its own and gives up after the store's timeout; the abandoned thread stays blocked
// until that program closes the connection (the caller fails, and usually exits, meanwhile).

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

namespace fulgur::detail {

// A server (opts.isServer) is made directly: binding fails at once. A client that has no answer
// within opts.timeout plus a second throws std::runtime_error saying it timed out, naming
// host:port.
c10::intrusive_ptr<::c10d::TCPStore> open_tcp_store(const std::string& host, const ::c10d::TCPStoreOptions& opts);

}  // namespace fulgur::detail
