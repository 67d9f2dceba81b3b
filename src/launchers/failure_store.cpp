// SPDX-License-Identifier: Apache-2.0
#include "launchers/failure_store.h"

#include <fulgur/distributed/collectives.h>

#include "distributed/network.h"
#include "distributed/tcp_store.h"
#include "runtime/text.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace fulgur::detail {
namespace {

// The job's store (see serve_node_store), or an empty pointer while it cannot be reached.
c10::intrusive_ptr<::c10d::Store> node_store(const MultiProcessLauncherOptions& o,
                                             std::chrono::milliseconds connect_timeout = std::chrono::seconds(3)) {
  static c10::intrusive_ptr<::c10d::Store> store;
  if (store) return store;
  ::c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(o.main_port());
  so.isServer = o.node_rank() == 0;
  so.waitWorkers = false;
  if (so.isServer) {
    so.timeout = std::chrono::seconds(60);
    try {
      store = open_tcp_store(o.main_address(), so);
    } catch (const std::exception& e) {
      const std::string msg = runtime::first_line(e.what());
      throw CollectiveError("rendezvous: node 0 cannot serve the store on MASTER_PORT=" + std::to_string(o.main_port()) +
                            " (" + msg + "); choose a free port, the same on every node");
    }
    return store;
  }
  so.timeout = connect_timeout;
  if (!accepts_connections(o.main_address(), o.main_port(), 100)) return {};  // node 0 is not up (or gone)
  try {
    auto client = open_tcp_store(o.main_address(), so);
    // As in the rendezvous (collectives.cpp): a first wait puts the timeout on
    // the client's socket for every later reply, so that a program holding the
    // port (accepts, never answers) cannot hold this launcher in a later call.
    const std::string hello = "fulgur/hello/node-" + std::to_string(o.node_rank());
    client->set(hello, std::vector<uint8_t>{1});
    client->wait({hello});
    store = client;
  } catch (const std::exception&) {
    return {};
  }
  return store;
}

}  // namespace

double failure_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void write_error_record(const std::string& dir, int64_t rank, const std::string& kind, const std::string& message) {
  const std::string path = dir + "/error-" + std::to_string(rank) + ".txt";
  std::ofstream out(path + ".tmp");
  out.precision(17);
  out << failure_time_now() << "\n" << kind << "\n" << message;
  out.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

ErrorRecord read_error_record(const std::string& dir, int64_t rank) {
  ErrorRecord r;
  std::ifstream in(dir + "/error-" + std::to_string(rank) + ".txt");
  if (!in) return r;
  r.present = true;
  std::string line;
  std::getline(in, line);
  r.time = std::atof(line.c_str());
  std::getline(in, r.kind);
  std::stringstream rest;
  rest << in.rdbuf();
  r.message = rest.str();
  return r;
}

void serve_node_store(const MultiProcessLauncherOptions& o) {
  if (o.node_rank() == 0) node_store(o);
}

void report_failure_to_job(const MultiProcessLauncherOptions& o, const std::string& keys, const std::string& what) {
  try {
    auto store = node_store(o);
    if (!store) return;
    const std::string prefix = keys + "/fulgur/";
    if (store->add(prefix + "failures", 1) == 1) {
      const std::string msg = "node " + std::to_string(o.node_rank()) + ": " + what;
      store->set(prefix + "failure", std::vector<uint8_t>(msg.begin(), msg.end()));
    }
  } catch (const std::exception&) {
  }
}

std::string failure_elsewhere(const MultiProcessLauncherOptions& o, const std::string& keys,
                              std::chrono::milliseconds connect_timeout) {
  try {
    auto store = node_store(o, connect_timeout);
    const std::string key = keys + "/fulgur/failure";
    if (!store || !store->check({key})) return "";
    const std::vector<uint8_t> v = store->get(key);
    const std::string msg(v.begin(), v.end());
    return msg.rfind("node " + std::to_string(o.node_rank()) + ":", 0) == 0 ? "" : msg;
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace fulgur::detail
