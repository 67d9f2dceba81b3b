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

}  // namespace

bool LightningEnvironment::is_set() { return env("RANK") != nullptr || env("LOCAL_RANK") != nullptr; }

bool LightningEnvironment::creates_processes_externally() const { return is_set(); }

std::string LightningEnvironment::main_address() const {
  const char* v = env("MASTER_ADDR");
  return v ? v : "127.0.0.1";
}

int LightningEnvironment::main_port() const { return static_cast<int>(env_int("MASTER_PORT", 0)); }

int64_t LightningEnvironment::world_size() const { return env_int("WORLD_SIZE", 1); }

int64_t LightningEnvironment::global_rank() const { return env_int("RANK", 0); }

int64_t LightningEnvironment::local_rank() const { return env_int("LOCAL_RANK", 0); }

int64_t LightningEnvironment::node_rank() const { return env_int("NODE_RANK", env_int("GROUP_RANK", 0)); }

std::shared_ptr<ClusterEnvironment> detect_cluster_environment() { return std::make_shared<LightningEnvironment>(); }

}  // namespace fulgur
