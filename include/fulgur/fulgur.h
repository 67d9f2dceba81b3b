// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything a user program needs: the Trainer, modules, data, callbacks,
// loggers, every strategy, the registry, the accelerators and plugins
// (precision, checkpoint IO, cluster environments), collectives and the
// device loader. The example data sets are separate: <fulgur/data/mnist.h>
// (load_mnist) and <fulgur/data/text.h> (CharDataset).

#include <fulgur/accelerators/accelerator.h>
#include <fulgur/callbacks/callback.h>
#include <fulgur/callbacks/device_stats_monitor.h>
#include <fulgur/callbacks/early_stopping.h>
#include <fulgur/callbacks/gradient_accumulation_scheduler.h>
#include <fulgur/callbacks/lr_finder.h>
#include <fulgur/callbacks/lr_monitor.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/callbacks/model_summary.h>
#include <fulgur/callbacks/prediction_writer.h>
#include <fulgur/callbacks/progress_bar.h>
#include <fulgur/callbacks/throughput_monitor.h>
#include <fulgur/callbacks/timer.h>
#include <fulgur/callbacks/weight_averaging.h>
#include <fulgur/checkpoint.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/data/device_loader.h>
#include <fulgur/data_module.h>
#include <fulgur/environment.h>
#include <fulgur/distributed/collectives.h>
#include <fulgur/launchers/launcher.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/csv_logger.h>
#include <fulgur/loggers/logger.h>
#include <fulgur/loggers/tensorboard_logger.h>
#include <fulgur/lr_scheduler.h>
#include <fulgur/module_mover.h>
#include <fulgur/plugins/environments/cluster_environment.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/plugins/precision/precision.h>
#include <fulgur/plugins/precision/xla.h>
#include <fulgur/serialization_error.h>
#include <fulgur/strategies/ddp.h>
#include <fulgur/strategies/ddp_comm_hook.h>
#include <fulgur/strategies/parallel.h>
#include <fulgur/strategies/registry.h>
#include <fulgur/strategies/single_device.h>
#include <fulgur/strategies/single_xla.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/strategies/xla.h>
#include <fulgur/trainer.h>
#include <fulgur/version.h>
#include <fulgur/xla/backend.h>
#include <fulgur/xla/random.h>
