#include <fulgur/plugins/environments/cluster_environment.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace fulgur {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0) {
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + v +
                                "' must be a non-negative integer");
  }
  return n;
}

int env_port(const char* name, int fallback) {
  const int64_t port = env_int(name, fallback);
  if (port > 65535) {
    throw std::invalid_argument(std::string("environment variable ") + name + "=" + std::to_string(port) +
                                " is not a TCP port; use a value in [1, 65535]");
  }
  return static_cast<int>(port);
}

}  // namespace

bool LightningEnvironment::is_set() { return env("RANK") != nullptr || env("LOCAL_RANK") != nullptr; }

bool LightningEnvironment::creates_processes_externally() const { return is_set(); }

std::string LightningEnvironment::main_address() const {
  const char* v = env("MASTER_ADDR");
  return v ? v : "127.0.0.1";
}

int LightningEnvironment::main_port() const { return env_port("MASTER_PORT", 0); }

int64_t LightningEnvironment::world_size() const { return env_int("WORLD_SIZE", 1); }

int64_t LightningEnvironment::global_rank() const { return env_int("RANK", 0); }

int64_t LightningEnvironment::local_rank() const { return env_int("LOCAL_RANK", 0); }

int64_t LightningEnvironment::node_rank() const { return env_int("NODE_RANK", env_int("GROUP_RANK", 0)); }

bool TorchElasticEnvironment::detect() {
  return env("RANK") && env("GROUP_RANK") && env("LOCAL_RANK") && env("LOCAL_WORLD_SIZE");
}

int64_t TorchElasticEnvironment::node_rank() const { return env_int("GROUP_RANK", 0); }

bool SLURMEnvironment::detect() {
  if (!env("SLURM_NTASKS")) return false;
  const char* job = env("SLURM_JOB_NAME");
  const std::string name = job ? job : "";
  return name != "bash" && name != "interactive";
}

std::string SLURMEnvironment::first_host(const std::string& nodelist) {
  // The first entry of the comma list, commas inside brackets excluded.
  int depth = 0;
  size_t end = 0;
  for (; end < nodelist.size(); ++end) {
    const char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if ((c == ',' || c == ' ') && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  // Each bracketed range keeps its first value: "n[03-05,9]-ib" -> "n03-ib".
  std::string host;
  for (size_t i = 0; i < entry.size(); ++i) {
    if (entry[i] != '[') {
      host += entry[i];
      continue;
    }
    const size_t close = entry.find(']', i);
    if (close == std::string::npos) {
      throw std::invalid_argument("SLURM_NODELIST='" + nodelist + "' has an unclosed '['; expected e.g. node[01-04]");
    }
    const std::string range = entry.substr(i + 1, close - i - 1);
    host += range.substr(0, range.find_first_of(",-"));
    i = close;
  }
  if (host.empty()) throw std::invalid_argument("SLURM_NODELIST='" + nodelist + "' names no host");
  return host;
}

std::string SLURMEnvironment::main_address() const {
  if (const char* v = env("MASTER_ADDR")) return v;
  const char* nodes = env("SLURM_NODELIST");
  if (!nodes) nodes = env("SLURM_JOB_NODELIST");
  if (!nodes) throw std::invalid_argument("SLURM: neither MASTER_ADDR nor SLURM_NODELIST is set; set MASTER_ADDR to node 0's address");
  return first_host(nodes);
}

int SLURMEnvironment::main_port() const {
  if (env("MASTER_PORT")) return env_port("MASTER_PORT", 0);
  const char* job = env("SLURM_JOB_ID");
  if (!job) return 12910;
  const std::string id = job;
  const std::string tail = id.size() > 4 ? id.substr(id.size() - 4) : id;
  char* end = nullptr;
  const long n = std::strtol(tail.c_str(), &end, 10);
  if (*end != '\0' || n < 0) throw std::invalid_argument("SLURM_JOB_ID='" + id + "' must end in digits; set MASTER_PORT");
  return static_cast<int>(15000 + n);
}

int64_t SLURMEnvironment::world_size() const { return env_int("SLURM_NTASKS", 1); }

int64_t SLURMEnvironment::global_rank() const { return env_int("SLURM_PROCID", 0); }

int64_t SLURMEnvironment::local_rank() const { return env_int("SLURM_LOCALID", 0); }

int64_t SLURMEnvironment::node_rank() const { return env_int("SLURM_NODEID", 0); }

std::shared_ptr<ClusterEnvironment> detect_cluster_environment() {
  const char* worker = env("FULGUR_WORKER");
  if (worker && std::string(worker) == "1") return std::make_shared<LightningEnvironment>();
  if (SLURMEnvironment::detect()) return std::make_shared<SLURMEnvironment>();
  if (TorchElasticEnvironment::detect()) return std::make_shared<TorchElasticEnvironment>();
  return std::make_shared<LightningEnvironment>();
}

std::string describe(const ClusterEnvironment& e) {
  return "cluster environment " + e.name() + ": world size " + std::to_string(e.world_size()) + ", global rank " +
         std::to_string(e.global_rank()) + ", local rank " + std::to_string(e.local_rank()) + ", node rank " +
         std::to_string(e.node_rank()) + ", main address " + e.main_address() + ":" + std::to_string(e.main_port());
}

}  // namespace fulgur
