#pragma once
// CSVLogger in Lightning's layout:
//   <root_dir>/<name>/version_<N>/metrics.csv
//   <root_dir>/<name>/version_<N>/hparams.yaml

#include <fulgur/loggers/logger.h>

#include <optional>
#include <vector>

namespace fulgur {

class CSVLogger : public Logger {
 public:
  // version: fixed N, or the next free one in <root_dir>/<name>.
  explicit CSVLogger(std::string root_dir, std::string name = "lightning_logs",
                     std::optional<int64_t> version = std::nullopt);
  std::string name() const override { return name_; }
  std::string version() override;
  std::string log_dir() override;
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  void log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) override;
  // Rewrites metrics.csv with every row so far, columns sorted, "step" last
  // (a new metric adds a column, as Lightning does).
  void save() override;
  void finalize(const std::string& status) override;
  const std::string& root_dir() const { return root_dir_; }
  // Fixes the version (the launcher uses it to adopt rank 0's choice).
  void set_version(int64_t version) { version_ = version; }

 private:
  std::string root_dir_;
  std::string name_;
  std::optional<int64_t> version_;
  std::vector<std::map<std::string, double>> rows_;
};

}  // namespace fulgur
