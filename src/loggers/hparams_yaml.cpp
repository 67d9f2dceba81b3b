// SPDX-License-Identifier: Apache-2.0
#include "loggers/hparams_yaml.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace fulgur::detail {
namespace {

bool plain_safe(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' || c == '/')) return false;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  // Words a YAML 1.1 reader resolves to a bool or null.
  static const std::array<const char*, 9> kWords = {"true", "false", "yes", "no", "on", "off", "y", "n", "null"};
  return std::none_of(kWords.begin(), kWords.end(), [&](const char* w) { return lower == w; });
}

std::string yaml_string(const std::string& s) {
  if (plain_safe(s)) return s;
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A float that a YAML 1.1 reader (PyYAML) resolves as a float: it needs a
// "." and a signed exponent ("1e-05" would read as a string).
std::string float_text(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  const auto e = s.find('e');
  const std::string mantissa = s.substr(0, e);
  std::string exponent = e == std::string::npos ? "" : s.substr(e + 1);
  if (!exponent.empty() && exponent[0] != '-' && exponent[0] != '+') exponent = "+" + exponent;
  return (mantissa.find('.') == std::string::npos ? mantissa + ".0" : mantissa) + (exponent.empty() ? "" : "e" + exponent);
}

std::string key_text(const c10::IValue& key) {
  if (key.isString()) return yaml_string(key.toStringRef());
  if (key.isInt()) return std::to_string(key.toInt());
  std::ostringstream os;
  os << key;
  return yaml_string(os.str());
}

// The one-line form of a value that is not a non-empty dict or list.
std::string scalar_text(const c10::IValue& v) {
  if (v.isNone()) return "null";
  if (v.isBool()) return v.toBool() ? "true" : "false";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) return float_text(v.toDouble());
  if (v.isString()) return yaml_string(v.toStringRef());
  if (v.isGenericDict()) return "{}";
  if (v.isList() || v.isTuple()) return "[]";
  std::ostringstream os;
  os << v;
  std::string text = os.str();
  text.erase(text.find_last_not_of('\n') + 1);
  return yaml_string(text);
}

std::vector<c10::IValue> items(const c10::IValue& v) {
  if (v.isList()) return v.toListRef().vec();
  if (v.isTuple()) return v.toTupleRef().elements().vec();
  return {};
}

bool is_block(const c10::IValue& v) {
  if (v.isGenericDict()) return !v.toGenericDict().empty();
  return !items(v).empty();
}

void write_node(std::string& out, const c10::IValue& v, int indent);

// What follows a "key:" or a "-": a scalar on the same line, or a block on
// the next lines at `block_indent`.
void write_value(std::string& out, const c10::IValue& v, int block_indent) {
  if (!is_block(v)) {
    out += " " + scalar_text(v) + "\n";
    return;
  }
  out += "\n";
  write_node(out, v, block_indent);
}

// Mapping entries at `indent`; a sequence value's items at the same indent.
void write_mapping(std::string& out, const c10::impl::GenericDict& dict, int indent) {
  for (const auto& kv : dict) {
    out += std::string(indent, ' ') + key_text(kv.key()) + ":";
    write_value(out, kv.value(), kv.value().isGenericDict() ? indent + 2 : indent);
  }
}

void write_node(std::string& out, const c10::IValue& v, int indent) {
  if (v.isGenericDict()) return write_mapping(out, v.toGenericDict(), indent);
  for (const auto& item : items(v)) {
    out += std::string(indent, ' ') + "-";
    write_value(out, item, indent + 2);
  }
}

}  // namespace

std::string hparams_yaml(const c10::Dict<std::string, c10::IValue>& hparams) {
  if (hparams.empty()) return "{}\n";
  std::string out;
  write_mapping(out, c10::impl::toGenericDict(hparams), 0);
  return out;
}

void write_hparams_yaml(const std::string& dir, const c10::Dict<std::string, c10::IValue>& hparams) {
  fs::create_directories(dir);
  const fs::path path = fs::path(dir) / "hparams.yaml";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << hparams_yaml(hparams);
  out.flush();
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace fulgur::detail
