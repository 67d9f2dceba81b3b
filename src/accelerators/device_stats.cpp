// SPDX-License-Identifier: Apache-2.0
// Accelerator::get_device_stats: the host's statistics from /proc, and an xla device's from its
// PJRT plugin.
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/xla/backend.h>

#include <cstdint>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>

namespace fulgur {
namespace {

// "Key:   value kB" lines of /proc/meminfo and /proc/self/status, in bytes.
std::map<std::string, double> read_kb_fields(const char* path) {
  std::map<std::string, double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream rest(line.substr(colon + 1));
    double value = 0;
    std::string unit;
    if (!(rest >> value)) continue;
    rest >> unit;
    out[line.substr(0, colon)] = unit == "kB" ? value * 1024 : value;
  }
  return out;
}

// The busy share of all cores since the previous call (since boot at the first), from the
// first line of /proc/stat: user nice system idle iowait irq softirq steal ...; idle and
// iowait are not busy. The counters move in clock ticks (usually 10 ms): a call before the
// next tick gives the previous share again.
std::mutex cpu_mu;
double last_total = 0, last_idle = 0, last_percent = 0;

bool cpu_percent(double* out) {
  std::ifstream in("/proc/stat");
  std::string cpu;
  if (!(in >> cpu) || cpu != "cpu") return false;
  double total = 0, idle = 0, v = 0;
  for (int i = 0; i < 8 && in >> v; ++i) {
    total += v;
    if (i == 3 || i == 4) idle += v;
  }
  std::lock_guard<std::mutex> lock(cpu_mu);
  const double dt = total - last_total, di = idle - last_idle;
  if (dt > 0) {
    last_total = total;
    last_idle = idle;
    last_percent = 100.0 * (dt - di) / dt;
  }
  *out = last_percent;
  return true;
}

std::map<std::string, double> host_stats() {
  std::map<std::string, double> stats;
  double busy = 0;
  if (cpu_percent(&busy)) stats["cpu_percent"] = busy;
  const auto mem = read_kb_fields("/proc/meminfo");
  const auto get = [](const std::map<std::string, double>& m, const char* k) {
    const auto it = m.find(k);
    return it == m.end() ? -1.0 : it->second;
  };
  const double total = get(mem, "MemTotal"), available = get(mem, "MemAvailable");
  if (total > 0 && available >= 0) stats["cpu_vm_percent"] = 100.0 * (total - available) / total;
  const double swap = get(mem, "SwapTotal"), swap_free = get(mem, "SwapFree");
  if (swap >= 0 && swap_free >= 0) stats["cpu_swap_percent"] = swap > 0 ? 100.0 * (swap - swap_free) / swap : 0.0;
  const auto status = read_kb_fields("/proc/self/status");
  if (const double rss = get(status, "VmRSS"); rss >= 0) stats["process_rss_bytes"] = rss;
  if (const double hwm = get(status, "VmHWM"); hwm >= 0) stats["process_peak_rss_bytes"] = hwm;
  return stats;
}

}  // namespace

std::map<std::string, double> Accelerator::get_device_stats(const c10::Device&) const { return host_stats(); }

std::map<std::string, double> XLAAccelerator::get_device_stats(const c10::Device&) const {
  std::map<std::string, double> stats;
  if (xla::backend_started()) {
    for (const auto& [k, v] : xla::backend().device_memory_stats()) stats[k] = static_cast<double>(v);
  }
  return stats.empty() ? host_stats() : stats;
}

}  // namespace fulgur
