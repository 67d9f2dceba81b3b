// SPDX-License-Identifier: Apache-2.0
#include <fulgur/loggers/tensorboard_logger.h>

#include "loggers/event_file.h"
#include "loggers/hparams_yaml.h"
#include "loggers/next_version.h"
#include "loggers/prefix.h"
#include "loggers/protobuf_writer.h"

#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

// The HParams plugin's messages (tensorboard/plugins/hparams/{api,plugin_data}.proto):
//   HParamsPluginData: version = 1 (0, left out), experiment = 2, session_start_info = 3, session_end_info = 4
//   Experiment: time_created_secs = 3, hparam_infos = 4, metric_infos = 5
//   HParamInfo: name = 1, type = 4 (DataType: STRING 1, BOOL 2, FLOAT64 3)
//   MetricInfo: name = 1 (MetricName: tag = 2)
//   SessionStartInfo: hparams = 1 (map<string, google.protobuf.Value>), start_time_secs = 5
//   google.protobuf.Value: number_value = 2, string_value = 3, bool_value = 4
//   SessionEndInfo: status = 1 (STATUS_SUCCESS 1), end_time_secs = 2
constexpr const char* kHParamsPlugin = "hparams";
enum DataType { kString = 1, kBool = 2, kFloat64 = 3 };

struct HParam {
  std::string name;
  DataType type;
  double number = 0;
  std::string text;
  bool flag = false;
};

void flatten(const std::string& prefix, const c10::impl::GenericDict& dict, std::vector<HParam>& out);

void add_hparam(const std::string& name, const c10::IValue& v, std::vector<HParam>& out) {
  if (v.isNone()) return;
  if (v.isGenericDict()) return flatten(name + "/", v.toGenericDict(), out);
  HParam p{name, kString, 0.0, "", false};
  if (v.isBool()) {
    p.type = kBool;
    p.flag = v.toBool();
  } else if (v.isInt() || v.isDouble()) {
    p.type = kFloat64;
    p.number = v.isInt() ? static_cast<double>(v.toInt()) : v.toDouble();
  } else if (v.isString()) {
    p.text = v.toStringRef();
  } else {
    std::ostringstream os;
    os << v;
    p.text = os.str();
  }
  out.push_back(std::move(p));
}

void flatten(const std::string& prefix, const c10::impl::GenericDict& dict, std::vector<HParam>& out) {
  for (const auto& kv : dict) {
    const c10::IValue& key = kv.key();
    std::ostringstream name;
    name << prefix;
    if (key.isString()) {
      name << key.toStringRef();
    } else {
      name << key;
    }
    add_hparam(name.str(), kv.value(), out);
  }
}

std::string plugin_data(int field, const std::string& message) {
  detail::ProtobufWriter data;
  data.bytes(field, message);
  return data.str();
}

}  // namespace

using detail::now_seconds;

TensorBoardLogger::TensorBoardLogger(TensorBoardLoggerOptions options) : options_(std::move(options)) {}

TensorBoardLogger::TensorBoardLogger(std::string root_dir, std::string name, std::optional<int64_t> version)
    : TensorBoardLogger(TensorBoardLoggerOptions(std::move(root_dir)).name(std::move(name)).version(version)) {}

TensorBoardLogger::~TensorBoardLogger() = default;

std::string TensorBoardLogger::version() {
  if (!options_.version()) options_.version(detail::next_version((fs::path(options_.root_dir()) / options_.name()).string()));
  return std::to_string(*options_.version());
}

std::string TensorBoardLogger::log_dir() {
  return (fs::path(options_.root_dir()) / options_.name() / ("version_" + version())).string();
}

detail::EventFile& TensorBoardLogger::file() {
  if (!file_) file_ = std::make_unique<detail::EventFile>(log_dir());
  return *file_;
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  std::vector<detail::SummaryValue> values;
  for (const auto& [k, v] : detail::with_prefix(metrics, options_.prefix()))
    values.push_back({k, static_cast<float>(v), "", ""});
  file().write_summary(step, values);
}

void TensorBoardLogger::log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) {
  detail::write_hparams_yaml(log_dir(), hparams);
  std::vector<HParam> params;
  for (const auto& kv : hparams) add_hparam(kv.key(), kv.value(), params);

  detail::ProtobufWriter experiment;
  experiment.fixed_double(3, now_seconds());
  detail::ProtobufWriter start;
  for (const auto& p : params) {
    detail::ProtobufWriter info;
    info.bytes(1, p.name);
    info.varint(4, p.type);
    experiment.bytes(4, info.str());
    detail::ProtobufWriter value;
    if (p.type == kFloat64) value.fixed_double(2, p.number);
    if (p.type == kString) value.bytes(3, p.text);
    if (p.type == kBool) value.varint(4, p.flag);
    detail::ProtobufWriter entry;
    entry.bytes(1, p.name);
    entry.bytes(2, value.str());
    start.bytes(1, entry.str());
  }
  if (options_.default_hp_metric()) {
    detail::ProtobufWriter metric_name;
    metric_name.bytes(2, "hp_metric");
    detail::ProtobufWriter metric;
    metric.bytes(1, metric_name.str());
    experiment.bytes(5, metric.str());
  }
  start.fixed_double(5, now_seconds());
  detail::ProtobufWriter end;
  end.varint(1, 1);
  end.fixed_double(2, now_seconds());

  if (options_.default_hp_metric()) log_metrics({{"hp_metric", -1.0}}, 0);
  file().write_summary(0, {{"_hparams_/experiment", std::nullopt, kHParamsPlugin, plugin_data(2, experiment.str())}});
  file().write_summary(0, {{"_hparams_/session_start_info", std::nullopt, kHParamsPlugin, plugin_data(3, start.str())}});
  file().write_summary(0, {{"_hparams_/session_end_info", std::nullopt, kHParamsPlugin, plugin_data(4, end.str())}});
}

void TensorBoardLogger::save() {}

void TensorBoardLogger::finalize(const std::string& /*status*/) { file_.reset(); }

}  // namespace fulgur
