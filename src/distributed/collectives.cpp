// SPDX-License-Identifier: Apache-2.0
// Collectives over c10d's Gloo process group and its stores. Longer than one concern per file:
// every call is checked across ranks (call, shape, dtype, name) and every failure is turned into
// one error naming the call and the ranks missing, which share the class's state.

#include <fulgur/distributed/collectives.h>

#include "distributed/network.h"
#include "distributed/tcp_store.h"
#include "runtime/text.h"
#include "serialize/torch_archive.h"

#include <fulgur/serialization_error.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

namespace fulgur {

using runtime::first_line;

ReduceOp parse_reduce_op(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "mean" || n == "avg") return ReduceOp::kMean;
  if (n == "sum") return ReduceOp::kSum;
  if (n == "max") return ReduceOp::kMax;
  if (n == "min") return ReduceOp::kMin;
  throw std::invalid_argument("reduce_op '" + name + "' is not known; valid: \"mean\" (or \"avg\"), \"sum\", \"max\", \"min\"");
}

namespace {

// What every rank announces before a checked collective: a fixed-size byte
// record, gathered from all ranks, so that ranks disagreeing on the
// collective, the shape, the dtype or the barrier name fail with a message
// instead of corrupting memory or aborting inside Gloo. It holds the first
// kInlineDims dimensions and kInlineName bytes of the name; when some rank has
// more, a second gather carries every rank's full shape and name, so neither
// is limited and all of it is compared.
constexpr int kInlineDims = 8;
constexpr int kInlineName = 64;
struct Meta {
  int64_t op;
  int64_t dtype;
  int64_t ndim;
  int64_t dims[kInlineDims];
  int64_t extra;  // src for broadcasts
  int64_t name_len;
  char name[kInlineName];
};
static_assert(sizeof(Meta) % 8 == 0, "Meta must be a whole number of int64");

enum Op : int64_t { kAllReduce = 1, kAllGather, kBroadcast, kBroadcastObject, kBarrier };

const char* op_name(int64_t op) {
  switch (op) {
    case kAllReduce: return "all_reduce";
    case kAllGather: return "all_gather";
    case kBroadcast: return "broadcast";
    case kBroadcastObject: return "broadcast_object";
    case kBarrier: return "barrier";
  }
  return "unknown collective";
}

// One rank's collective call, whole.
struct Call {
  int64_t op = 0;
  int64_t dtype = 0;
  int64_t extra = 0;
  std::vector<int64_t> dims;
  std::string name;
};

Call make_call(int64_t op, const at::Tensor* t, int64_t extra, const std::string& name) {
  Call c;
  c.op = op;
  c.extra = extra;
  c.name = name;
  if (t) {
    c.dtype = static_cast<int64_t>(t->scalar_type());
    c.dims = t->sizes().vec();
  }
  return c;
}

std::string describe(const Call& c) {
  std::ostringstream os;
  if (c.op == kBarrier) {
    os << "barrier('" << c.name << "')";
    return os.str();
  }
  os << op_name(c.op);
  if (c.op == kBroadcastObject) {
    os << "(src=" << c.extra << ")";
    return os.str();
  }
  os << " of " << c10::toString(static_cast<c10::ScalarType>(c.dtype)) << "[";
  for (size_t i = 0; i < c.dims.size(); ++i) os << (i ? ", " : "") << c.dims[i];
  os << "]";
  if (c.op == kBroadcast) os << " (src=" << c.extra << ")";
  return os.str();
}

bool same(const Call& a, const Call& b) {
  if (a.op != b.op || a.extra != b.extra) return false;
  if (a.op == kBarrier) return a.name == b.name;
  if (a.op == kBroadcastObject) return true;
  return a.dtype == b.dtype && a.dims == b.dims;
}

Meta make_meta(const Call& c) {
  Meta m{};
  m.op = c.op;
  m.dtype = c.dtype;
  m.extra = c.extra;
  m.ndim = static_cast<int64_t>(c.dims.size());
  for (size_t i = 0; i < c.dims.size() && i < kInlineDims; ++i) m.dims[i] = c.dims[i];
  m.name_len = static_cast<int64_t>(c.name.size());
  std::memcpy(m.name, c.name.data(), std::min<size_t>(c.name.size(), kInlineName));
  return m;
}

// The call a Meta describes when it holds all of it (no second gather).
Call from_meta(const Meta& m) {
  Call c;
  c.op = m.op;
  c.dtype = m.dtype;
  c.extra = m.extra;
  c.dims.assign(m.dims, m.dims + std::min<int64_t>(m.ndim, kInlineDims));
  c.name.assign(m.name, std::min<int64_t>(m.name_len, kInlineName));
  return c;
}

bool fits_inline(const Meta& m) { return m.ndim <= kInlineDims && m.name_len <= kInlineName; }

::c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return ::c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return ::c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return ::c10d::ReduceOp::MIN;
  }
  return ::c10d::ReduceOp::SUM;
}

// The largest object broadcast_object accepts (checked before allocating).
constexpr int64_t kMaxObjectBytes = int64_t(4) << 30;

class GlooCollectives;

class GlooPending : public PendingReduce {
 public:
  GlooPending(GlooCollectives* owner, c10::intrusive_ptr<::c10d::Work> work, int64_t seq)
      : owner_(owner), work_(std::move(work)), seq_(seq) {}
  void wait() override;

 private:
  GlooCollectives* owner_;
  c10::intrusive_ptr<::c10d::Work> work_;
  int64_t seq_;
};

class GlooCollectives : public Collectives {
 public:
  explicit GlooCollectives(const RendezvousOptions& o) : opts_(o) {
    if (o.world_size() < 1) throw std::invalid_argument("world_size=" + std::to_string(o.world_size()) + " must be >= 1");
    if (o.rank() < 0 || o.rank() >= o.world_size()) {
      throw std::invalid_argument("rank " + std::to_string(o.rank()) + " is outside [0, " + std::to_string(o.world_size()) +
                                  ") for world_size " + std::to_string(o.world_size()));
    }
    const std::string where = o.store_path().empty() ? o.host() + ":" + std::to_string(o.port()) : "file " + o.store_path();
    try {
      if (!o.store_path().empty()) {
        store_ = c10::make_intrusive<::c10d::FileStore>(o.store_path(), static_cast<int>(o.world_size()));
        store_->setTimeout(o.timeout());
      } else {
        ::c10d::TCPStoreOptions so;
        so.port = static_cast<uint16_t>(o.port());
        so.isServer = o.rank() == 0 && !o.store_served_externally();
        so.numWorkers = static_cast<size_t>(o.world_size());
        so.waitWorkers = false;
        so.timeout = o.timeout();
        std::string prefix = o.store_prefix();
        store_ = shared_tcp_store(o.host(), so, prefix);
        store_->setTimeout(o.timeout());
        if (!prefix.empty()) store_ = c10::make_intrusive<::c10d::PrefixStore>(prefix, store_);
      }
      if (!o.store_path().empty() && !o.store_prefix().empty()) {
        store_ = c10::make_intrusive<::c10d::PrefixStore>(o.store_prefix(), store_);
      }
      // A first wait, on a key of this rank's own, puts o.timeout() on the
      // client's socket for every later reply, so that a store that stops
      // answering fails this rank within the timeout (open_tcp_store bounds
      // the construction's own ping).
      const std::string hello = "fulgur/hello/" + std::to_string(o.rank());
      store_->set(hello, std::vector<uint8_t>{1});
      store_->wait({hello});
    } catch (const std::exception& e) {
      const std::string msg = first_line(e.what());
      if (msg.find("in use") != std::string::npos || msg.find("bind") != std::string::npos) {
        throw CollectiveError("rendezvous: cannot serve the store on port " + std::to_string(o.port()) +
                              ": the port is in use by another process (" + msg + "); choose another MASTER_PORT");
      }
      if (msg.find("imeout") != std::string::npos || msg.find("imed out") != std::string::npos) {
        throw CollectiveError("rendezvous: the store at " + where + " did not answer within " +
                              std::to_string(o.timeout().count()) + " ms (" + msg +
                              "); is another program holding that port, or is rank 0 stuck?");
      }
      throw CollectiveError("rendezvous: cannot reach the store at " + where + ": " + msg);
    }
    // Count arrivals and catch duplicate ranks before the Gloo mesh forms.
    const int64_t dup = store_->add("fulgur/rank/" + std::to_string(o.rank()), 1);
    store_->add("fulgur/joined", 1);
    if (dup > 1) {
      throw CollectiveError("rendezvous: rank " + std::to_string(o.rank()) + " joined twice (two processes were given RANK=" +
                            std::to_string(o.rank()) + "); every rank in [0, " + std::to_string(o.world_size()) +
                            ") must be used once");
    }
    connect();
  }

  ~GlooCollectives() override { shutdown(); }

  int64_t rank() const override { return opts_.rank(); }
  int64_t world_size() const override { return opts_.world_size(); }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check(make_call(kAllReduce, &tensor, 0, ""));
    at::Tensor cpu = staged(tensor);
    if (op == ReduceOp::kMean && !cpu.is_floating_point()) cpu = cpu.to(torch::kFloat64);
    std::vector<at::Tensor> ts{cpu};
    ::c10d::AllreduceOptions ao;
    ao.reduceOp = to_c10d(op);
    run("all_reduce", [&] { return pg_->allreduce(ts, ao); });
    if (op == ReduceOp::kMean) cpu.div_(static_cast<double>(opts_.world_size()));
    if (op == ReduceOp::kMean && !tensor.is_floating_point()) {
      tensor = cpu.to(tensor.device());
    } else if (!cpu.is_same(tensor)) {
      tensor.copy_(cpu.to(tensor.device()));
    }
  }

  std::unique_ptr<PendingReduce> all_reduce_async(at::Tensor& tensor, ReduceOp op) override {
    if (!tensor.device().is_cpu()) throw std::invalid_argument("all_reduce_async needs a CPU tensor, got " + tensor.device().str());
    if (op == ReduceOp::kMean) throw std::invalid_argument("all_reduce_async: Gloo has no mean; use kSum and divide");
    if (opts_.debug()) check(make_call(kAllReduce, &tensor, 0, "async"));
    ensure_alive("all_reduce");
    std::vector<at::Tensor> ts{tensor};
    ::c10d::AllreduceOptions ao;
    ao.reduceOp = to_c10d(op);
    const int64_t seq = ++seq_;
    return std::make_unique<GlooPending>(this, pg_->allreduce(ts, ao), seq);
  }

  at::Tensor all_gather(const at::Tensor& tensor) override {
    check(make_call(kAllGather, &tensor, 0, ""));
    at::Tensor cpu = staged(tensor).contiguous();
    std::vector<std::vector<at::Tensor>> out(1);
    for (int64_t r = 0; r < opts_.world_size(); ++r) out[0].push_back(torch::empty_like(cpu));
    std::vector<at::Tensor> in{cpu};
    run("all_gather", [&] { return pg_->allgather(out, in); });
    return torch::stack(out[0]).to(tensor.device());
  }

  void broadcast(at::Tensor& tensor, int64_t src) override {
    // After the check, which compares src: a src out of range on one rank is
    // then an error on every rank.
    check(make_call(kBroadcast, &tensor, src, ""));
    check_src(src, "broadcast");
    broadcast_unchecked(tensor, src);
  }

  c10::IValue broadcast_object(const c10::IValue& value, int64_t src) override {
    check(make_call(kBroadcastObject, nullptr, src, ""));
    check_src(src, "broadcast_object");
    std::vector<char> bytes;
    if (opts_.rank() == src) bytes = torch::pickle_save(value);
    auto len = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
    broadcast_unchecked(len, src);
    const int64_t n = len.item<int64_t>();
    if (n < 0 || n > kMaxObjectBytes) {
      throw CollectiveError("broadcast_object: rank " + std::to_string(src) + " announced " + std::to_string(n) +
                            " bytes, outside [0, " + std::to_string(kMaxObjectBytes) + "]");
    }
    auto payload = torch::empty({n}, torch::kUInt8);
    if (opts_.rank() == src) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
    broadcast_unchecked(payload, src);
    if (opts_.rank() == src) return value;
    try {
      return detail::load_torch_archive(static_cast<const uint8_t*>(payload.data_ptr()), static_cast<size_t>(n),
                                        "the broadcast_object payload of rank " + std::to_string(src));
    } catch (const SerializationError& e) {
      throw CollectiveError("broadcast_object: the " + std::to_string(n) + " bytes from rank " + std::to_string(src) +
                            " do not decode: " + first_line(e.what()));
    }
  }

  void barrier(const std::string& name) override { check(make_call(kBarrier, nullptr, 0, name)); }

  void shutdown() override {
    pg_.reset();
    store_.reset();
    dead_ = "the process group was shut down";
  }

  [[noreturn]] void fail(const std::string& what, int64_t seq, const std::exception& e) {
    const std::string cause = first_line(e.what());
    const bool timeout = cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
    // Closing this rank's connections first makes the live ranks that wait on
    // it fail too, so that they report in time and only the lost ones are named.
    pg_.reset();
    std::string missing = missing_ranks();
    std::ostringstream os;
    os << what << " (collective #" << seq << ") ";
    if (timeout) {
      os << "timed out after " << opts_.timeout().count() << " ms";
    } else {
      os << "failed: a peer left or broke the connection";
    }
    os << "; " << missing << "; cause: " << cause;
    const std::string remote = first_failure_elsewhere();
    if (!remote.empty()) os << "; first failure in the job: " << remote;
    os << ". The process group is closed and will not be reused.";
    dead_ = os.str();
    throw CollectiveError(dead_);
  }

 private:

  // One TCP store per address for the life of the process: the later groups
  // of a process (fit, then test) meet in the same store, under "group-<k>/"
  // added to `prefix`, while rank 0 keeps serving it. A store that rank 0
  // closed after the first group would break the others' connections.
  static c10::intrusive_ptr<::c10d::Store> shared_tcp_store(const std::string& host, const ::c10d::TCPStoreOptions& so,
                                                           std::string& prefix) {
    static std::map<std::string, std::pair<c10::intrusive_ptr<::c10d::Store>, int>> stores;
    if (so.port == 0) return detail::open_tcp_store(host, so);  // a new free port each time
    const std::string key = host + ":" + std::to_string(so.port) + (so.isServer ? "/server" : "/client");
    auto& [store, groups] = stores[key];
    if (!store) store = detail::open_tcp_store(host, so);
    if (++groups > 1) prefix += (prefix.empty() ? "" : "/") + std::string("group-") + std::to_string(groups);
    return store;
  }

  // Single node or a loopback main address: 127.0.0.1. Otherwise the
  // address given, the interfaces named, or the interface reaching the store.
  std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices() const {
    using PG = ::c10d::ProcessGroupGloo;
    const bool single_node = !opts_.store_path().empty();
    std::string what;
    try {
      if (!opts_.bind_address().empty() && !single_node) {
        what = "FULGUR_BIND_ADDRESS='" + opts_.bind_address() + "'";
        return {PG::createDeviceForHostname(opts_.bind_address())};
      }
      if (!opts_.socket_ifname().empty() && !single_node) {
        const std::vector<std::string> known = detail::interface_names();
        std::vector<std::shared_ptr<::gloo::transport::Device>> out;
        std::stringstream names(opts_.socket_ifname());
        for (std::string name; std::getline(names, name, ',');) {
          if (std::find(known.begin(), known.end(), name) == known.end()) {
            std::string list;
            for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
            throw std::invalid_argument("GLOO_SOCKET_IFNAME='" + opts_.socket_ifname() + "': this machine has no interface '" +
                                        name + "' with an address; interfaces: " + list);
          }
          what = "GLOO_SOCKET_IFNAME interface '" + name + "'";
          out.push_back(PG::createDeviceForInterface(name));
        }
        return out;
      }
      if (single_node || detail::is_loopback_host(opts_.host())) {
        what = "127.0.0.1";
        return {PG::createDeviceForHostname("127.0.0.1")};
      }
      const detail::LocalInterface iface = detail::interface_toward(opts_.host());
      what = "interface " + iface.name + " (" + iface.address + ", the one reaching MASTER_ADDR='" + opts_.host() + "')";
      return {PG::createDeviceForHostname(iface.address)};
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::exception& e) {
      if (what.empty()) throw CollectiveError(std::string("rendezvous: cannot choose Gloo's interface: ") + first_line(e.what()));
      throw CollectiveError("rendezvous: Gloo cannot bind to " + what + ": " + first_line(e.what()));
    }
  }

  void connect() {
    auto prefixed = c10::make_intrusive<::c10d::PrefixStore>("fulgur/pg", store_);
    auto go = ::c10d::ProcessGroupGloo::Options::create(opts_.timeout());
    // PyTorch's default (ProcessGroupGloo.Options: 2). With one worker thread a
    // call on a machine whose cores were all busy waited several times longer for
    // the same bytes (bench/RESULTS.md, the "Gloo threads" rows); concurrent
    // calls stay correct, as each has its own tag.
    go->threads = 2;
    go->devices = gloo_devices();
    try {
      pg_ = c10::make_intrusive<::c10d::ProcessGroupGloo>(prefixed, static_cast<int>(opts_.rank()),
                                                          static_cast<int>(opts_.world_size()), go);
    } catch (const std::exception& e) {
      int64_t joined = -1;
      try {
        joined = store_->add("fulgur/joined", 0);
      } catch (...) {
      }
      std::ostringstream os;
      os << "rendezvous failed after " << opts_.timeout().count() << " ms: ";
      if (joined >= 0) os << joined << "/" << opts_.world_size() << " joined";
      else os << "the store did not answer";
      os << " (rank " << opts_.rank() << ", world_size " << opts_.world_size() << "); check WORLD_SIZE and that every rank "
         << "was started; cause: " << first_line(e.what());
      throw CollectiveError(os.str());
    }
  }

  void ensure_alive(const std::string& what) {
    if (!dead_.empty()) throw CollectiveError(what + ": " + dead_);
  }

  void check_src(int64_t src, const char* what) {
    if (src < 0 || src >= opts_.world_size()) {
      throw std::invalid_argument(std::string(what) + ": src=" + std::to_string(src) + " is outside [0, " +
                                  std::to_string(opts_.world_size()) + ")");
    }
  }

  // Gloo takes dense CPU tensors only: other devices are staged through the CPU.
  static at::Tensor staged(const at::Tensor& t) { return t.device().is_cpu() ? t : t.to(torch::kCPU); }

  template <typename F>
  void run(const std::string& what, F&& start) {
    ensure_alive(what);
    const int64_t seq = ++seq_;
    try {
      start()->wait();
    } catch (const std::exception& e) {
      fail(what, seq, e);
    }
  }

  void broadcast_unchecked(at::Tensor& tensor, int64_t src) {
    at::Tensor cpu = staged(tensor).contiguous();
    std::vector<at::Tensor> ts{cpu};
    ::c10d::BroadcastOptions bo;
    bo.rootRank = static_cast<int>(src);
    run("broadcast", [&] { return pg_->broadcast(ts, bo); });
    if (!cpu.is_same(tensor)) tensor.copy_(cpu.to(tensor.device()));
  }

  // Gathers every rank's call; throws the same error on every rank if they
  // differ. Failures of the gather itself name the call (a barrier by name).
  void check(const Call& mine) {
    const std::string label = mine.op == kBarrier ? describe(mine) : op_name(mine.op);
    if (opts_.debug()) std::cerr << "[fulgur debug] rank " << opts_.rank() << ": " << describe(mine) << std::endl;
    if (opts_.world_size() == 1) return;
    const Meta meta = make_meta(mine);
    const std::vector<at::Tensor> metas = gather_bytes(label, &meta, sizeof(Meta));
    std::vector<Meta> all(opts_.world_size());
    for (int64_t r = 0; r < opts_.world_size(); ++r) std::memcpy(&all[r], metas[r].data_ptr(), sizeof(Meta));
    std::vector<Call> calls;
    if (std::all_of(all.begin(), all.end(), fits_inline)) {
      for (const auto& m : all) calls.push_back(from_meta(m));
    } else {
      calls = gather_full_calls(label, mine, all);
    }
    for (int64_t r = 1; r < opts_.world_size(); ++r) {
      if (same(calls[0], calls[r])) continue;
      std::ostringstream os;
      os << "ranks disagree on the collective: rank 0 called " << describe(calls[0]) << ", rank " << r << " called "
         << describe(calls[r]);
      if (calls[0].op == calls[r].op && calls[0].op != kBarrier && calls[0].op != kBroadcastObject) {
        os << " (every rank must pass the same shape and dtype)";
      }
      throw CollectiveError(os.str());
    }
  }

  // Every rank's `n` bytes at `data` (n is the same on every rank).
  std::vector<at::Tensor> gather_bytes(const std::string& label, const void* data, size_t n) {
    const int64_t words = static_cast<int64_t>((n + 7) / 8);
    auto in = torch::zeros({words}, torch::kInt64);
    std::memcpy(in.data_ptr(), data, n);
    std::vector<std::vector<at::Tensor>> out(1);
    for (int64_t r = 0; r < opts_.world_size(); ++r) out[0].push_back(torch::empty({words}, torch::kInt64));
    std::vector<at::Tensor> ins{in};
    run(label, [&] { return pg_->allgather(out, ins); });
    return out[0];
  }

  // The second gather, when some rank's shape or name did not fit in its
  // Meta: each rank sends all its dimensions, then all of its name, padded to
  // the size every rank computes from the Metas.
  std::vector<Call> gather_full_calls(const std::string& label, const Call& mine, const std::vector<Meta>& all) {
    size_t longest = 0;
    for (const auto& m : all) {
      if (m.ndim < 0 || m.name_len < 0) throw CollectiveError(label + ": a rank sent a corrupt collective record");
      longest = std::max(longest, static_cast<size_t>(m.ndim) * 8 + static_cast<size_t>(m.name_len));
    }
    std::vector<char> buf(std::max<size_t>(longest, 1));
    std::memcpy(buf.data(), mine.dims.data(), mine.dims.size() * 8);
    std::memcpy(buf.data() + mine.dims.size() * 8, mine.name.data(), mine.name.size());
    const std::vector<at::Tensor> full = gather_bytes(label, buf.data(), buf.size());
    std::vector<Call> calls;
    for (int64_t r = 0; r < opts_.world_size(); ++r) {
      Call c = from_meta(all[r]);
      const char* p = static_cast<const char*>(full[r].data_ptr());
      c.dims.resize(all[r].ndim);
      std::memcpy(c.dims.data(), p, c.dims.size() * 8);
      c.name.assign(p + c.dims.size() * 8, all[r].name_len);
      calls.push_back(std::move(c));
    }
    return calls;
  }

  // After a failure: ranks that report within a short wait are alive and
  // arrived; the others are named.
  // A group fails once, but ranks may fail in neighbouring collectives (one
  // finished #32 while another still waited in it), so marks carry no number.
  std::string missing_ranks() {
    if (!store_) return "ranks that did not arrive: unknown";
    try {
      const std::string prefix = "fulgur/failed/";
      store_->set(prefix + std::to_string(opts_.rank()), std::vector<uint8_t>{1});
      const auto deadline = std::chrono::steady_clock::now() +
                            std::min<std::chrono::milliseconds>(opts_.timeout(), std::chrono::milliseconds(1500));
      std::vector<int64_t> missing;
      while (true) {
        missing.clear();
        for (int64_t r = 0; r < opts_.world_size(); ++r)
          if (!store_->check({prefix + std::to_string(r)})) missing.push_back(r);
        if (missing.empty() || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      std::ostringstream os;
      os << "ranks that did not arrive: [";
      for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
      os << "]" << nodes_of(missing);
      return os.str();
    } catch (const std::exception&) {
      if (opts_.store_path().empty() && opts_.store_served_externally()) {
        return "ranks that did not arrive: unknown (the store at " + opts_.host() + ":" + std::to_string(opts_.port()) +
               ", served by the launcher of node 0, does not answer: node 0 has stopped)";
      }
      return "ranks that did not arrive: unknown (the store is gone)";
    }
  }

  // The nodes that hold these ranks: " (node 1)", " (nodes 0, 1)"; empty on one node.
  std::string nodes_of(const std::vector<int64_t>& ranks) const {
    const int64_t per = opts_.local_world_size();
    if (per <= 0 || per >= opts_.world_size() || ranks.empty()) return "";
    std::vector<int64_t> nodes;
    for (int64_t r : ranks)
      if (std::find(nodes.begin(), nodes.end(), r / per) == nodes.end()) nodes.push_back(r / per);
    std::ostringstream os;
    os << (nodes.size() == 1 ? " (node " : " (nodes ");
    for (size_t i = 0; i < nodes.size(); ++i) os << (i ? ", " : "") << nodes[i];
    os << ")";
    return os.str();
  }

  // What the launcher of the node that failed first wrote to the store (see
  // MultiProcessLauncher); empty if nothing was written.
  std::string first_failure_elsewhere() {
    if (!store_ || !opts_.store_path().empty()) return "";
    try {
      if (!store_->check({"fulgur/failure"})) return "";
      const std::vector<uint8_t> v = store_->get("fulgur/failure");
      return std::string(v.begin(), v.end());
    } catch (const std::exception&) {
      return "";
    }
  }

  RendezvousOptions opts_;
  c10::intrusive_ptr<::c10d::Store> store_;
  c10::intrusive_ptr<::c10d::ProcessGroupGloo> pg_;
  int64_t seq_ = 0;
  std::string dead_;
};

void GlooPending::wait() {
  try {
    work_->wait();
  } catch (const std::exception& e) {
    owner_->fail("gradient all_reduce", seq_, e);
  }
}

// Gloo's write to the socket of a peer that has gone raises SIGPIPE: with the default
// disposition that killed the rank outright (signal 13: no error, no word of which peer left;
// Collectives.PeerExitFailsTheOthersFast under load) instead of failing its collective with
// Gloo's connection error. Python, and so every Lightning process, ignores SIGPIPE from
// startup; a process that has set its own handler keeps it.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO))
    ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

std::shared_ptr<Collectives> Collectives::create(const RendezvousOptions& options) {
  ignore_sigpipe_unless_handled();
  return std::make_shared<GlooCollectives>(options);
}

}  // namespace fulgur
