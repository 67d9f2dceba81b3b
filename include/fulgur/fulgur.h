#pragma once
// Everything a user of fulgur needs.

#include <fulgur/callbacks/early_stopping.h>
#include <fulgur/callbacks/lr_monitor.h>
#include <fulgur/callbacks/model_checkpoint.h>
#include <fulgur/callbacks/prediction_writer.h>
#include <fulgur/callbacks/progress_bar.h>
#include <fulgur/checkpoint.h>
#include <fulgur/data/data_loader.h>
#include <fulgur/data/mnist.h>
#include <fulgur/data/text.h>
#include <fulgur/data_module.h>
#include <fulgur/lightning_module.h>
#include <fulgur/loggers/csv_logger.h>
#include <fulgur/strategies/strategy.h>
#include <fulgur/trainer.h>
#include <fulgur/xla/backend.h>
#include <fulgur/xla/module_mover.h>
