#include <fulgur/loggers/csv_logger.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur {
namespace {

std::string scalar_text(const c10::IValue& v) {
  std::ostringstream os;
  os << std::setprecision(std::numeric_limits<double>::max_digits10);
  if (v.isString()) {
    os << '"' << v.toStringRef() << '"';
  } else if (v.isDouble()) {
    os << v.toDouble();
  } else if (v.isInt()) {
    os << v.toInt();
  } else if (v.isBool()) {
    os << (v.toBool() ? "true" : "false");
  } else if (v.isNone()) {
    os << "null";
  } else {
    os << '"' << v.tagKind() << '"';
  }
  return os.str();
}

}  // namespace

CSVLogger::CSVLogger(std::string root_dir, std::string name, std::optional<int64_t> version)
    : root_dir_(std::move(root_dir)), name_(std::move(name)), version_(version) {}

std::string CSVLogger::version() {
  if (!version_) {
    int64_t next = 0;
    std::error_code ec;
    const fs::path dir = fs::path(root_dir_) / name_;
    if (fs::is_directory(dir, ec)) {
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("version_", 0) != 0) continue;
        try {
          next = std::max<int64_t>(next, std::stoll(n.substr(8)) + 1);
        } catch (...) {
        }
      }
    }
    version_ = next;
  }
  return std::to_string(*version_);
}

std::string CSVLogger::log_dir() { return (fs::path(root_dir_) / name_ / ("version_" + version())).string(); }

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  auto row = metrics;
  row["step"] = static_cast<double>(step);
  rows_.push_back(std::move(row));
}

void CSVLogger::log_hyperparams(const c10::Dict<std::string, c10::IValue>& hparams) {
  fs::create_directories(log_dir());
  std::ofstream out(fs::path(log_dir()) / "hparams.yaml");
  if (hparams.empty()) {
    out << "{}\n";
    return;
  }
  for (const auto& kv : hparams) out << kv.key() << ": " << scalar_text(kv.value()) << "\n";
}

void CSVLogger::save() {
  if (rows_.empty()) return;
  fs::create_directories(log_dir());
  std::set<std::string> keys;
  for (const auto& r : rows_)
    for (const auto& kv : r) keys.insert(kv.first);
  keys.erase("step");
  std::vector<std::string> cols(keys.begin(), keys.end());
  cols.push_back("step");
  const fs::path path = fs::path(log_dir()) / "metrics.csv";
  const fs::path tmp = fs::path(log_dir()) / ".metrics.csv.tmp";
  {
    std::ofstream out(tmp);
    out << std::setprecision(std::numeric_limits<double>::max_digits10);
    for (size_t i = 0; i < cols.size(); ++i) out << (i ? "," : "") << cols[i];
    out << "\n";
    for (const auto& r : rows_) {
      for (size_t i = 0; i < cols.size(); ++i) {
        if (i) out << ",";
        auto it = r.find(cols[i]);
        if (it == r.end()) continue;
        if (cols[i] == "step" || cols[i] == "epoch") {
          out << static_cast<int64_t>(it->second);
        } else {
          out << it->second;
        }
      }
      out << "\n";
    }
    if (!out) throw std::runtime_error("CSVLogger: cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

void CSVLogger::finalize(const std::string& /*status*/) { save(); }

}  // namespace fulgur
