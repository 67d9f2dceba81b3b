// SPDX-License-Identifier: Apache-2.0
// torch.save archives read without libtorch's loader (unsafe on hostile files); see
// torch_archive.h. The zip is read by zip_reader.cpp, the pickle by unpickler.cpp and
// pickle_convert.cpp (pickle.h).

#include "serialize/torch_archive.h"

#include "serialize/pickle.h"
#include "serialize/zip_reader.h"

#include <ATen/core/Dict.h>
#include <ATen/core/jit_type.h>

namespace fulgur::detail {

c10::Dict<std::string, c10::IValue> as_str_dict(const c10::IValue& value, const std::string& what) {
  if (!value.isGenericDict() || value.toGenericDict().keyType()->kind() != c10::TypeKind::StringType) {
    throw SerializationError(what + " is a " + value.type()->repr_str() + ", not a dict with string keys");
  }
  const auto dict = value.toGenericDict();
  if (dict.valueType()->kind() == c10::TypeKind::AnyType) return c10::impl::toTypedDict<std::string, c10::IValue>(dict);
  // A dict typed more narrowly (Dict[str, Tensor]): the same entries as Dict[str, Any].
  auto out = c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  for (const auto& kv : dict) out.insert(kv.key().toStringRef(), kv.value());
  return out;
}

c10::IValue load_torch_archive(const uint8_t* data, size_t size, const std::string& source, const ReadLimits& limits) {
  const ZipArchive zip(data, size, source, limits);
  // torch.save names the records "<folder>/data.pkl", "<folder>/data/<key>", ...
  // with one folder for the whole archive ("archive" today, the file's stem in
  // older versions of PyTorch).
  const ZipRecord* pkl = nullptr;
  std::string prefix;
  for (const ZipRecord& r : zip.records()) {
    const auto slash = r.name.find('/');
    if (slash == std::string::npos || r.name.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    if (pkl) throw SerializationError(source + ": two pickles ('" + pkl->name + "' and '" + r.name + "')");
    pkl = &r;
    prefix = r.name.substr(0, slash);
  }
  if (!pkl) throw SerializationError(source + " is not a torch archive: it has no '<folder>/data.pkl' record");
  if (const ZipRecord* order = zip.find(prefix + "/byteorder")) {
    const std::string bo(reinterpret_cast<const char*>(zip.bytes(*order)), order->size);
    if (bo != "little") throw SerializationError(source + ": byte order '" + bo + "' (this reader reads 'little')");
  }
  const pickle::Parsed parsed = pickle::parse_pickle(zip.bytes(*pkl), pkl->size, zip, prefix, limits);
  return pickle::pickle_to_ivalue(parsed, source + ": " + prefix + "/data.pkl", limits);
}

}  // namespace fulgur::detail
