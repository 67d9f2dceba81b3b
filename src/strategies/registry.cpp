// SPDX-License-Identifier: Apache-2.0
#include <fulgur/accelerators/accelerator.h>
#include <fulgur/plugins/precision/xla.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/strategies/single_xla.h>
#include <fulgur/strategies/xla.h>

#include <algorithm>

#include <stdexcept>

namespace fulgur {

DDPCommHook parse_ddp_comm_hook(const std::string& name) {
  if (name == "none") return DDPCommHook::kNone;
  if (name == "bf16_compress_hook" || name == "bf16") return DDPCommHook::kBf16Compress;
  throw std::invalid_argument("ddp_comm_hook '" + name + "' is not known; valid: \"none\", \"bf16_compress_hook\" (or \"bf16\")");
}

std::vector<std::string> strategy_names() { return {"auto", "single_device", "single_xla", "ddp", "xla", "xla_debug"}; }

std::shared_ptr<Strategy> make_strategy(const StrategyRequest& req) {
  auto names = strategy_names();
  if (std::find(names.begin(), names.end(), req.strategy()) == names.end()) {
    std::string valid;
    for (const auto& n : names) valid += (valid.empty() ? "\"" : ", \"") + n + "\"";
    throw std::invalid_argument("strategy '" + req.strategy() + "' is not known; valid: " + valid);
  }
  const std::string precision = validate_precision(req.precision());
  const bool xla_strategy = req.strategy() == "xla" || req.strategy() == "xla_debug" || req.strategy() == "single_xla";
  std::string acc_name = req.accelerator();
  if (acc_name == "auto") {
    // Lightning's order: a GPU when there is one; else the xla devices, which every
    // machine has, unless a CPU strategy was named.
    if (xla_strategy) {
      acc_name = "xla";
    } else if (cuda_device_count() > 0) {
      acc_name = "cuda";
    } else {
      acc_name = req.strategy() == "ddp" || req.strategy() == "single_device" ? "cpu" : "xla";
    }
  }
  auto accelerator = make_accelerator(acc_name);
  if (xla_strategy && accelerator->name() != "xla") {
    throw std::invalid_argument("strategy '" + req.strategy() + "' runs on xla devices but accelerator is '" +
                                req.accelerator() + "'; use accelerator \"xla\" (or \"auto\"), or strategy \"ddp\" on cpu");
  }
  const std::vector<int64_t> devices = parse_devices(req.devices(), *accelerator);
  const int64_t n = static_cast<int64_t>(devices.size());
  std::string name = req.strategy();
  if (name == "auto") {
    if (accelerator->name() == "xla") {
      name = n > 1 || req.num_nodes() > 1 ? "xla" : "single_xla";
    } else {
      name = n > 1 || req.num_nodes() > 1 ? "ddp" : "single_device";
    }
  }
  if ((name == "single_device" || name == "single_xla") && n != 1) {
    throw std::invalid_argument("strategy '" + name + "' uses one device but devices='" + req.devices() + "' gives " +
                                std::to_string(n) + "; use strategy \"ddp\" or \"xla\" for several");
  }
  if (precision == "16-mixed" && accelerator->name() != "cuda") {
    throw std::invalid_argument("precision '16-mixed' is float16 autocast, which runs on CUDA devices (as in Lightning), "
                                "but accelerator is '" + accelerator->name() +
                                "'; use accelerator \"cuda\", or \"bf16-mixed\" for mixed precision on " +
                                accelerator->name());
  }
  if ((name == "single_device" || name == "single_xla") && req.max_restarts() != 0) {
    throw std::invalid_argument("max_restarts=" + std::to_string(req.max_restarts()) + " starts the worker processes of a job again, but strategy '" +
                                name + "' runs in this process and starts none; use strategy \"ddp\" (or \"xla\") with devices 1 "
                                "for restarts of one worker, or max_restarts 0");
  }
  if ((name == "single_device" || name == "single_xla") && req.ddp_comm_hook() != DDPCommHook::kNone) {
    throw std::invalid_argument("a ddp_comm_hook encodes the gradient all-reduce between processes, but strategy '" + name +
                                "' runs one process and reduces nothing; use strategy \"ddp\" or \"xla\" on several "
                                "devices, or ddp_comm_hook none");
  }
  if (name == "single_device") {
    if (accelerator->name() == "xla") return std::make_shared<SingleDeviceXLAStrategy>(nullptr, std::make_shared<XLAPrecision>(precision));
    return std::make_shared<SingleDeviceStrategy>(accelerator->device(devices.front()), accelerator, nullptr,
                                                  std::make_shared<Precision>(precision));
  }
  if (name == "single_xla") return std::make_shared<SingleDeviceXLAStrategy>(nullptr, std::make_shared<XLAPrecision>(precision));
  const auto po = ParallelOptions()
                      .timeout(req.collective_timeout())
                      .num_nodes(req.num_nodes())
                      .start_method(req.start_method())
                      .max_restarts(req.max_restarts())
                      .use_distributed_sampler(req.use_distributed_sampler())
                      .debug(name == "xla_debug")
                      .ddp_comm_hook(req.ddp_comm_hook());
  if (name == "ddp") {
    if (accelerator->name() != "cpu" && accelerator->name() != "cuda") {
      throw std::invalid_argument("strategy 'ddp' runs on cpu and cuda devices; for xla devices use strategy \"xla\"");
    }
    return std::make_shared<DDPStrategy>(accelerator, devices, nullptr, std::make_shared<Precision>(precision), po);
  }
  return std::make_shared<XLAStrategy>(devices, nullptr, std::make_shared<XLAPrecision>(precision), po);
}

}  // namespace fulgur
