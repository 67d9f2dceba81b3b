// SPDX-License-Identifier: Apache-2.0
#include "runtime/env_vars.h"

#include <fulgur/environment.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace fulgur::runtime {
namespace {

using F = EnvFormat;

// Set by fulgur's launcher in each worker it starts (src/launchers/worker_env.h).
constexpr const char* kByLauncher = "set by fulgur's launcher in its workers";

const std::vector<EnvVar> kTable = {
    // fulgur's own settings.
    {"FULGUR_LOG_LEVEL", F::kChoice, "debug|info|warning|error|off", "debug, info, warning, error, off", "info",
     "lowest level of fulgur's own messages on stderr"},
    {"FULGUR_MALLOC_POLICY", F::kChoice, "on|1|off|0", "on, 1, off, 0", "on",
     "keep freed memory of big blocks for reuse (mallopt), unless glibc's variables below set malloc's"},
    {"FULGUR_FUSED_OPTIMIZER", F::kChoice, "on|1|off|0", "on, 1, off, 0", "on",
     "one fused loop per parameter for Adam and AdamW steps on the CPU instead of libtorch's ops"},
    {"FULGUR_BIND_ADDRESS", F::kText, nullptr, "an address of this machine", "chosen from MASTER_ADDR",
     "address Gloo binds to on several nodes (before GLOO_SOCKET_IFNAME)"},
    {"FULGUR_XLA_BACKEND", F::kChoice, "pjrt|ts|lazy|eager", "\"pjrt\", \"ts\" (\"lazy\", its old name), \"eager\"",
     "pjrt", "the backend behind xla devices"},
    {"FULGUR_XLA_HOST_KERNELS", F::kChoice, "0|1",
     "\"0\" (XLA's own convolutions), \"1\" (convolutions on the CPU plugin run libtorch's kernels), or unset",
     "libtorch's kernels on the CPU plugin, XLA's own on others", "where the pjrt backend's convolutions run"},
    {"FULGUR_XLA_CACHE_DIR", F::kText, nullptr, "a folder, or \"off\"",
     "<default_root_dir>/.xla_cache in a Trainer's workers; none outside a Trainer",
     "where compiled XLA programs are kept for later processes to load instead of compiling (\"off\": nowhere)"},
    // The launcher's own, in its workers.
    {"FULGUR_WORKER", F::kChoice, "1", "1", kByLauncher, "this process is a worker of fulgur's launcher"},
    {"FULGUR_LAUNCH_DIR", F::kText, nullptr, "a folder", kByLauncher, "the launch's private folder (results, error records)"},
    {"FULGUR_LAUNCH_INDEX", F::kCount, nullptr, "a non-negative integer", kByLauncher,
     "which launch of the parent this is; a spawned worker replays the earlier ones"},
    {"FULGUR_STORE", F::kText, nullptr, "a file path", kByLauncher, "one node: the launch's file store"},
    {"FULGUR_PARENT_STORE", F::kChoice, "1", "1", kByLauncher, "several nodes: node 0's launcher serves the TCP store"},
    {"FULGUR_RESTART_COUNT", F::kCount, nullptr, "a non-negative integer", kByLauncher,
     "which attempt of the launch this is (max_restarts): 0, then the restart's number"},
    // Where a process stands in the job (torchrun's names, also set by fulgur's launcher).
    {"RANK", F::kCount, nullptr, "a non-negative integer", "0", "global rank; set, the processes were started outside"},
    {"LOCAL_RANK", F::kCount, nullptr, "a non-negative integer", "0", "rank on this node; set, the processes were started outside"},
    {"WORLD_SIZE", F::kPositive, nullptr, "a positive integer", "1", "processes in the job"},
    {"LOCAL_WORLD_SIZE", F::kPositive, nullptr, "a positive integer", "the devices of this node",
     "processes on this node (thread counts, the PJRT client)"},
    {"NODE_RANK", F::kCount, nullptr, "a non-negative integer", "GROUP_RANK, else 0", "this machine's rank"},
    {"GROUP_RANK", F::kCount, nullptr, "a non-negative integer", "0", "torchrun's node rank"},
    {"NUM_NODES", F::kPositive, nullptr, "a positive integer", "the Trainer's num_nodes",
     "machines in the job; must equal num_nodes when set"},
    {"MASTER_ADDR", F::kText, nullptr, "a host name or address", "127.0.0.1 (SLURM: the node list's first host)",
     "node 0's address, where the store is served"},
    {"MASTER_PORT", F::kPort, nullptr, "a TCP port, an integer in [0, 65535]",
     "a free port (SLURM: 15000 + the job id's last four digits)", "port of node 0's store"},
    {"GLOO_SOCKET_IFNAME", F::kText, nullptr, "interface names, separated by commas", "the interface to MASTER_ADDR",
     "network interfaces Gloo uses on several nodes"},
    {"TORCHELASTIC_USE_AGENT_STORE", F::kChoice, "True|False", "True, False", "False",
     "torchrun: the workers meet in its agent's store"},
    {"TORCHELASTIC_RESTART_COUNT", F::kCount, nullptr, "a non-negative integer", "0",
     "torchrun: the attempt, whose keys are used in the agent's store"},
    // SLURM.
    {"SLURM_NTASKS", F::kPositive, nullptr, "a positive integer", "not under SLURM", "tasks of the job; set: SLURM's environment"},
    {"SLURM_PROCID", F::kCount, nullptr, "a non-negative integer", "0", "SLURM: the task's global rank"},
    {"SLURM_LOCALID", F::kCount, nullptr, "a non-negative integer", "0", "SLURM: the task's rank on its node"},
    {"SLURM_NODEID", F::kCount, nullptr, "a non-negative integer", "0", "SLURM: the node's rank"},
    {"SLURM_NODELIST", F::kText, nullptr, "a SLURM node list (node[01-04])", "SLURM_JOB_NODELIST",
     "SLURM: the main address is its first host"},
    {"SLURM_JOB_NODELIST", F::kText, nullptr, "a SLURM node list", "none", "SLURM: read when SLURM_NODELIST is unset"},
    {"SLURM_JOB_ID", F::kEndsInDigits, nullptr, "text ending in digits", "none",
     "SLURM: the main port is 15000 + its last four digits"},
    {"SLURM_JOB_NAME", F::kText, nullptr, "text", "none", "SLURM: \"bash\" or \"interactive\" is not a batch job"},
    // Threads.
    {"OMP_NUM_THREADS", F::kThreadCounts, nullptr, "positive integers separated by commas",
     "cores (affinity and cgroup cpu.max) / workers on the node", "threads of each process's intra-op pool (the first number)"},
    {"OMP_WAIT_POLICY", F::kChoice, "ACTIVE|PASSIVE|active|passive", "ACTIVE, PASSIVE (either case)",
     "PASSIVE with several workers on a node", "how idle OpenMP threads wait"},
    // xla devices and the PJRT plugin.
    {"XLA_NUM_DEVICES", F::kPositive, nullptr, "a positive integer",
     "the cores of this process (CPU plugin), else the plugin's devices", "devices(\"auto\") on xla"},
    {"PJRT_DEVICE", F::kChoice, "CPU|TPU|CUDA", "CPU, TPU, CUDA", "CPU", "the PJRT plugin to load"},
    {"PJRT_LIBRARY_PATH", F::kText, nullptr, "a file path", "the plugin PJRT_DEVICE names", "a PJRT plugin file to load instead"},
    {"TPU_LIBRARY_PATH", F::kText, nullptr, "a file path", "the libtpu of fulgur's environment", "libtpu for PJRT_DEVICE=TPU"},
    {"VIRTUAL_ENV", F::kText, nullptr, "a Python virtual environment", "none",
     "an active virtual environment, searched for the PJRT CUDA plugin"},
    {"PATH", F::kText, nullptr, "folders separated by colons", "the system's",
     "the environment of its first python3 is searched for the PJRT CUDA plugin"},
    // One device per rank: TPU hosts (torch_xla's per-process variables; fulgur sets the first six
    // in each worker of a multi-process job, each unless the user did) and CUDA.
    {"TPU_VISIBLE_CHIPS", F::kText, nullptr, "chip indices", "the worker's local rank", "the TPU chips this process owns"},
    {"TPU_CHIPS_PER_PROCESS_BOUNDS", F::kText, nullptr, "a grid x,y,z", "1,1,1", "chips per process"},
    {"TPU_PROCESS_BOUNDS", F::kText, nullptr, "a grid x,y,z", "the host's chips times the hosts", "processes of the job"},
    {"TPU_PROCESS_PORT", F::kPort, nullptr, "a TCP port", "8476 + local rank", "this process's TPU runtime port"},
    {"TPU_PROCESS_ADDRESSES", F::kText, nullptr, "host:port, separated by commas", "every worker's, ports from 8476",
     "the TPU runtime addresses of every process"},
    {"CLOUD_TPU_TASK_ID", F::kCount, nullptr, "a non-negative integer", "worker id * local world size + local rank",
     "this process's task id"},
    {"TPU_CHIPS_PER_HOST_BOUNDS", F::kText, nullptr, "a grid x,y,z", "by the processes per host (1, 2, 4 or 8)",
     "the chip grid of one TPU host"},
    {"TPU_HOST_BOUNDS", F::kText, nullptr, "a grid x,y,z", "1,1,1", "the grid of TPU hosts"},
    {"TPU_WORKER_ID", F::kCount, nullptr, "a non-negative integer", "0", "this TPU host's index"},
    {"TPU_WORKER_HOSTNAMES", F::kText, nullptr, "host names separated by commas", "localhost", "every TPU host"},
    {"CUDA_VISIBLE_DEVICES", F::kText, nullptr, "CUDA device indices or UUIDs separated by commas", "every device",
     "the GPUs accelerator \"cuda\" sees (the CUDA runtime reads it)"},
    {"PJRT_NPROC", F::kPositive, nullptr, "a positive integer", "as OMP_NUM_THREADS", "threads of the CPU plugin's pools"},
    {"XLA_FLAGS", F::kText, nullptr, "XLA's flags", "fulgur's defaults for the CPU plugin",
     "XLA's options; fulgur adds its defaults for the flags it does not name"},
    {"TF_CPP_MIN_LOG_LEVEL", F::kChoice, "0|1|2|3", "0, 1, 2, 3", "1 (warnings and errors)", "XLA's own log level"},
    // The C library and the system.
    {"MALLOC_MMAP_THRESHOLD_", F::kText, nullptr, "glibc's", "unset", "set: fulgur leaves malloc's settings to glibc's variables"},
    {"MALLOC_TRIM_THRESHOLD_", F::kText, nullptr, "glibc's", "unset", "set: as MALLOC_MMAP_THRESHOLD_"},
    {"MALLOC_TOP_PAD_", F::kText, nullptr, "glibc's", "unset", "set: as MALLOC_MMAP_THRESHOLD_"},
    {"GLIBC_TUNABLES", F::kText, nullptr, "glibc's", "unset", "naming glibc.malloc: as MALLOC_MMAP_THRESHOLD_"},
    {"TMPDIR", F::kText, nullptr, "a folder", "/tmp", "where the launcher makes its private folder"},
};

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// s as an integer when it is all digits and not huge.
bool parse_count(const std::string& s, long long* out) {
  if (!all_digits(s) || s.size() > 18) return false;
  *out = std::atoll(s.c_str());
  return true;
}

bool valid(const EnvVar& var, const std::string& v) {
  long long n = 0;
  switch (var.format) {
    case F::kText: return true;
    case F::kCount: return parse_count(v, &n);
    case F::kPositive: return parse_count(v, &n) && n >= 1;
    case F::kPort: return parse_count(v, &n) && n <= 65535;
    case F::kChoice: {
      std::istringstream words(var.choices);
      for (std::string w; std::getline(words, w, '|');)
        if (w == v) return true;
      return false;
    }
    case F::kThreadCounts: {
      std::istringstream parts(v);
      std::string part;
      bool any = false;
      while (std::getline(parts, part, ',')) {
        if (!parse_count(part, &n) || n < 1) return false;
        any = true;
      }
      return any && v.back() != ',';
    }
    case F::kEndsInDigits: return std::isdigit(static_cast<unsigned char>(v.back())) != 0;
  }
  return false;
}

}  // namespace

const std::vector<EnvVar>& environment_variables() { return kTable; }

const EnvVar& environment_variable(const char* name) {
  for (const auto& v : kTable)
    if (std::strcmp(v.name, name) == 0) return v;
  throw std::logic_error(std::string("fulgur reads the environment variable ") + name +
                         ", which its table (src/runtime/env_vars.cpp) does not list");
}

std::string environment_value_error(const EnvVar& var, const std::string& value) {
  if (value.empty() || valid(var, value)) return "";
  return std::string(var.name) + "='" + value + "' is not valid: " + var.allowed + " (unset: " + var.unset + ")";
}

void validate_environment() {
  for (const auto& var : kTable) {
    const char* v = std::getenv(var.name);
    if (!v) continue;
    const std::string error = environment_value_error(var, v);
    if (!error.empty()) throw std::invalid_argument(error);
  }
}

std::string environment_table_markdown() {
  std::ostringstream out;
  out << "| variable | allowed | unset | what fulgur does with it |\n|---|---|---|---|\n";
  for (const auto& v : kTable) {
    out << "| `" << v.name << "` | " << v.allowed << " | " << v.unset << " | " << v.doc << " |\n";
  }
  return out.str();
}

}  // namespace fulgur::runtime

namespace fulgur {

std::string environment_help(const std::vector<std::string>& names) {
  size_t width = 0;
  for (const auto& n : names) width = std::max(width, n.size());
  std::ostringstream out;
  for (const auto& n : names) {
    const runtime::EnvVar* row = nullptr;
    for (const auto& v : runtime::environment_variables())
      if (n == v.name) row = &v;
    if (!row) throw std::invalid_argument("environment_help: fulgur reads no variable '" + n + "'");
    // The table's cells are Markdown; the terminal gets them without backticks.
    std::string line = std::string(row->doc) + " (unset: " + row->unset + ")";
    line.erase(std::remove(line.begin(), line.end(), '`'), line.end());
    out << "  " << n << std::string(width - n.size() + 2, ' ') << line << "\n";
  }
  return out.str();
}

}  // namespace fulgur
