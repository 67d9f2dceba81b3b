// SPDX-License-Identifier: Apache-2.0
// The checked reader of untrusted torch archives (src/serialize/): what it
// rebuilds, what it refuses and how, on archives written by libtorch, by
// Python's torch.save, and crafted here byte by byte.

#include "support.h"

#include "serialize/torch_archive.h"
#include "stored_zip.h"
#include "optim/optim_state.h"

#include <fulgur/checkpoint.h>
#include <fulgur/plugins/io/checkpoint_io.h>
#include <fulgur/serialization_error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

using namespace fulgur;
using fulgur::testing::read_file;
using fulgur::testing::TempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using namespace std::string_literals;

namespace {

using fulgur::testing::stored_zip;

// An archive of one pickle (and optional data records).
std::string archive(const std::string& pickle, std::vector<std::pair<std::string, std::string>> data = {}) {
  data.insert(data.begin(), {"archive/data.pkl", pickle});
  return stored_zip(data);
}

c10::IValue load(const std::string& bytes) {
  return fulgur::detail::load_torch_archive(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test bytes");
}

std::string load_error(const std::string& bytes) {
  try {
    load(bytes);
  } catch (const SerializationError& e) {
    return e.what();
  }
  return "(loaded)";
}

// Pickle pieces. A tensor of 4 floats in storage '0', with a given offset, size and stride.
std::string tensor_pickle(const std::string& offset_size_stride) {
  return std::string("\x80\x02") + "ctorch._utils\n_rebuild_tensor_v2\n(" +
         "(X\x07\0\0\0storage"s + "ctorch\nFloatStorage\n" + "X\x01\0\0\0"s "0" + "X\x03\0\0\0cpu"s + "K\x04" + "tQ" +
         offset_size_stride + "\x89" + "ccollections\nOrderedDict\n)R" + "tR.";
}
const std::string kFourFloats(16, '\0');

std::string le32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

}  // namespace

TEST(Serialize, OwnCheckpointRoundTripsWithItsTypesAndSharedStorage) {
  TempDir dir;
  Checkpoint c = make_dict();
  const auto w = torch::arange(12, torch::kFloat32).reshape({3, 4});
  c.insert("w", w);
  c.insert("w_t", w.t());  // a view: shares w's storage
  c.insert("ids", c10::List<int64_t>({1, 2, 3}));
  c.insert("lr", 0.5);
  c.insert("name", std::string("net"));
  c10::impl::GenericDict by_int(c10::IntType::get(), c10::AnyType::get());
  by_int.insert(int64_t{7}, torch::ones({2}, torch::kInt64));
  c.insert("state", by_int);
  c.insert("pair", c10::ivalue::Tuple::create({0.9, 0.999}));
  TorchCheckpointIO().save_checkpoint(c, dir.path + "/c.ckpt");
  const Checkpoint r = TorchCheckpointIO().load_checkpoint(dir.path + "/c.ckpt");
  EXPECT_TRUE(torch::equal(r.at("w").toTensor(), w));
  EXPECT_TRUE(torch::equal(r.at("w_t").toTensor(), w.t()));
  EXPECT_EQ(r.at("w").toTensor().storage().data(), r.at("w_t").toTensor().storage().data());
  ASSERT_TRUE(r.at("ids").isIntList());
  EXPECT_EQ(r.at("ids").toIntVector(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r.at("lr").toDouble(), 0.5);
  EXPECT_EQ(r.at("name").toStringRef(), "net");
  const auto s = r.at("state").toGenericDict();
  EXPECT_EQ(s.keyType()->kind(), c10::TypeKind::IntType);
  EXPECT_TRUE(torch::equal(s.at(int64_t{7}).toTensor(), torch::ones({2}, torch::kInt64)));
  EXPECT_EQ(r.at("pair").toTupleRef().elements()[1].toDouble(), 0.999);
}

TEST(Serialize, EveryCommittedReproducerGivesANamedErrorOrLoadsWithinBoundedMemory) {
  // Each file is read in a child whose address space is capped 1 GiB above
  // its current size: a crash, an abort or a huge allocation fails the test.
  int files = 0;
  for (const auto& e : fs::directory_iterator(FULGUR_CORPUS_DIR "/checkpoint")) {
    ++files;
    const std::string path = e.path().string();
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::ifstream status("/proc/self/status");
      long vm_kb = 0;
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stol(line.substr(7));
      }
      const rlim_t cap = static_cast<rlim_t>(vm_kb) * 1024 + (rlim_t(1) << 30);
      const rlimit lim{cap, cap};
      ::setrlimit(RLIMIT_AS, &lim);
      try {
        TorchCheckpointIO().load_checkpoint(path);
        ::_exit(0);
      } catch (const SerializationError& err) {
        ::_exit(std::string(err.what()).find(path) != std::string::npos ? 0 : 3);
      } catch (const std::bad_alloc&) {
        ::_exit(4);
      } catch (...) {
        ::_exit(5);
      }
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << path << ": " << (WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                           : "exit " + std::to_string(WEXITSTATUS(st)) +
                                                 " (3: error without the file name, 4: bad_alloc, 5: another error type)");
  }
  EXPECT_GE(files, 8);
}

TEST(Serialize, AFlippedByteInTensorDataIsACrcErrorNamingTheRecord) {
  TempDir dir;
  Checkpoint c = make_dict();
  c.insert("w", torch::arange(1000, torch::kFloat32));
  TorchCheckpointIO().save_checkpoint(c, dir.path + "/c.ckpt");
  std::string bytes = read_file(dir.path + "/c.ckpt");
  const std::string marker(reinterpret_cast<const char*>(torch::arange(1000, torch::kFloat32).data_ptr()) + 400, 16);
  const auto at = bytes.find(marker);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] ^= 0x10;
  std::ofstream(dir.path + "/flipped.ckpt", std::ios::binary) << bytes;
  try {
    TorchCheckpointIO().load_checkpoint(dir.path + "/flipped.ckpt");
    FAIL() << "a corrupt record loaded";
  } catch (const SerializationError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir.path + "/flipped.ckpt"));
    EXPECT_THAT(e.what(), HasSubstr("record 'archive/data/0' is corrupt"));
  }
}

TEST(Serialize, ATensorIsCheckedAgainstItsStorageBeforeItExists) {
  const auto data = std::vector<std::pair<std::string, std::string>>{{"archive/data/0", kFourFloats}};
  // offset 0, size (2, 2), stride (2, 1): the whole storage, fine.
  const auto ok = load(archive(tensor_pickle("K\x00" "K\x02K\x02\x86" "K\x02K\x01\x86"s), data));
  EXPECT_EQ(ok.toTensor().sizes(), (std::vector<int64_t>{2, 2}));
  // offset 2^30.
  EXPECT_THAT(load_error(archive(tensor_pickle("J" + le32(1u << 30) + "K\x02K\x02\x86" "K\x02K\x01\x86"), data)),
              HasSubstr("reaches element 1073741827 of a storage of 4 elements"));
  // A stride reaching past the storage.
  EXPECT_THAT(load_error(archive(tensor_pickle("K\x00" "K\x02K\x02\x86" "K\x03K\x01\x86"s), data)),
              HasSubstr("reaches element 4 of a storage of 4 elements"));
  // Strides that overflow int64.
  EXPECT_THAT(load_error(archive(tensor_pickle("K\x00" "K\x02K\x02\x86" "\x8a\x08"s + std::string(7, '\xff') + "\x7f" "K\x01\x86"), data)),
              HasSubstr("overflows int64"));
  // A record shorter than its storage claims (4 floats = 16 bytes).
  EXPECT_THAT(load_error(archive(tensor_pickle("K\x00" "K\x02K\x02\x86" "K\x02K\x01\x86"s), {{"archive/data/0", std::string(12, '\0')}})),
              HasSubstr("claims 4 elements of 4 bytes, its record has 12 bytes"));
  // No record at all.
  EXPECT_THAT(load_error(archive(tensor_pickle("K\x00" "K\x02K\x02\x86" "K\x02K\x01\x86"s))),
              HasSubstr("has no record 'archive/data/0'"));
}

TEST(Serialize, AGlobalThatIsNotATensorRebuildIsRefusedAndNothingRuns) {
  TempDir dir;
  const std::string marker = dir.path + "/ran";
  const std::string cmd = "touch " + marker;
  const std::string pickle = std::string("\x80\x02") + "cos\nsystem\n" + "X" + le32(cmd.size()) + cmd + "\x85R.";
  EXPECT_THAT(load_error(archive(pickle)), HasSubstr("global 'os.system' is refused"));
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_THAT(load_error(archive("\x80\x02" "cbuiltins\neval\n)R.")), HasSubstr("'builtins.eval' is refused"));
  // A known global called the wrong way.
  EXPECT_THAT(load_error(archive("\x80\x02" "ccollections\nOrderedDict\n(K\x01tR.")), HasSubstr("takes 0 arguments, got 1"));
}

TEST(Serialize, MalformedPicklesGiveNamedErrors) {
  EXPECT_THAT(load_error(archive("\x80\x02" "b.")), HasSubstr("stack underflow"));  // build_underflow.ckpt's pickle
  EXPECT_THAT(load_error(archive("\x80\x02" "j\xff\xff\xff\x7f.")), HasSubstr("memo slot 2147483647 was never set"));
  EXPECT_THAT(load_error(archive("\x80\x02" "X\xff\xff\xff\x7f" "abc.")), HasSubstr("a string of 2147483647 bytes"));
  EXPECT_THAT(load_error(archive("\x80\x06.")), HasSubstr("pickle protocol 6"));
  EXPECT_THAT(load_error(archive("\x80\x02}(K\x01u.")), HasSubstr("odd number of items"));
  EXPECT_THAT(load_error(archive("\x80\x02]q\x00h\x00" "a."s)), HasSubstr("a list contains itself"));
  EXPECT_THAT(load_error(archive("\x80\x02K\x01K\x02.")), HasSubstr("2 values on the stack"));
  EXPECT_THAT(load_error(archive("\x80\x02" "K\x01")), HasSubstr("truncated"));
  EXPECT_THAT(load_error(archive("\x80\x02\xff.")), HasSubstr("opcode 0xff"));
  EXPECT_THAT(load_error(archive("\x80\x02}(K\x01K\x02X\x01\0\0\0aK\x03u."s)), HasSubstr("keys are both str and int"));
  // 100,000 lists, each inside the one before: refused by depth, with no recursion on the way.
  std::string deep = "\x80\x02";
  for (int i = 0; i < 100000; ++i) deep += "]";
  for (int i = 0; i < 99999; ++i) deep += "a";
  EXPECT_THAT(load_error(archive(deep + ".")), HasSubstr("nest deeper than 512 (ReadLimits::max_depth)"));
  // Sharing is kept, not multiplied: 64 levels of [x, x] are 64 lists, not 2^64.
  std::string shared = "\x80\x02K\x07";
  for (int i = 0; i < 64; ++i) shared += "2\x86";
  EXPECT_TRUE(load(archive(shared + ".")).isTuple());
}

TEST(Serialize, ZipStructureIsChecked) {
  const std::string good = archive("\x80\x02K\x05.");
  EXPECT_EQ(load(good).toInt(), 5);
  EXPECT_THAT(load_error(good.substr(0, good.size() - 30)), HasSubstr("no end-of-central-directory record"));
  EXPECT_THAT(load_error(std::string(10, 'x')), HasSubstr("only 10 bytes"));
  EXPECT_THAT(load_error(stored_zip({{"archive/version", "3\n"}})), HasSubstr("no '<folder>/data.pkl' record"));
  // Two central entries for one record's bytes (a zip bomb's trick): refused.
  std::string two = stored_zip({{"archive/data.pkl", "\x80\x02K\x05."}, {"archive/data/0", kFourFloats}});
  const auto last_central = two.rfind(std::string("PK\x01\x02", 4));
  two.replace(last_central + 42, 4, le32(0));  // the second entry points at the first record's header
  const std::string error = load_error(two);
  EXPECT_TRUE(error.find("overlap") != std::string::npos || error.find("names another record") != std::string::npos) << error;
  std::string compressed = good;
  compressed[compressed.rfind(std::string("PK\x01\x02", 4)) + 10] = 8;  // method 8, deflate
  EXPECT_THAT(load_error(compressed), HasSubstr("is compressed (method 8)"));
}

TEST(Serialize, TheValueLimitIsNamed) {
  std::string many = "\x80\x02(";
  for (int i = 0; i < 1000; ++i) many += "N";
  many += "l.";
  fulgur::detail::ReadLimits limits;
  limits.max_values = 100;
  const std::string bytes = archive(many);
  try {
    fulgur::detail::load_torch_archive(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "limited", limits);
    FAIL();
  } catch (const SerializationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("more than 100 values (ReadLimits::max_values)"));
  }
  EXPECT_EQ(load(bytes).toList().size(), 1000u);
}

TEST(Serialize, AnOptimizerArchiveIsRefusedWithoutLoadingIt) {
  torch::nn::Linear lin(2, 2);
  torch::optim::Adam adam(lin->parameters());
  Checkpoint state = make_dict();
  state.insert("fulgur_archive", torch::zeros({64}, torch::kUInt8));
  try {
    fulgur::detail::load_optimizer_state_dict(adam, state, "checkpoint x.ckpt, optimizer 0");
    FAIL();
  } catch (const SerializationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint x.ckpt, optimizer 0"));
    EXPECT_THAT(e.what(), HasSubstr("runs TorchScript"));
  }
}

TEST(Serialize, OptimizerStatesRoundTripAndAnotherKindIsNamed) {
  torch::manual_seed(1);
  torch::nn::Linear lin(3, 2);
  auto step = [&](torch::optim::Optimizer& opt) {
    opt.zero_grad();
    lin(torch::randn({4, 3})).pow(2).sum().backward();
    opt.step();
  };
  torch::optim::RMSprop rms(lin->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.9).centered(true));
  step(rms);
  step(rms);
  const c10::IValue saved = fulgur::detail::optimizer_state_dict(rms);
  torch::optim::RMSprop again(lin->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.9).centered(true));
  fulgur::detail::load_optimizer_state_dict(again, saved, "here");
  const auto& a = static_cast<torch::optim::RMSpropParamState&>(*again.state().begin()->second);
  const auto& b = static_cast<torch::optim::RMSpropParamState&>(
      *rms.state().at(again.state().begin()->first));
  EXPECT_EQ(a.step(), 2);
  EXPECT_TRUE(torch::equal(a.square_avg(), b.square_avg()));
  EXPECT_TRUE(torch::equal(a.grad_avg(), b.grad_avg()));
  EXPECT_TRUE(torch::equal(a.momentum_buffer(), b.momentum_buffer()));

  torch::optim::SGD sgd(lin->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  step(sgd);
  torch::optim::Adam adam(lin->parameters());
  try {
    fulgur::detail::load_optimizer_state_dict(adam, fulgur::detail::optimizer_state_dict(sgd), "checkpoint y.ckpt, optimizer 0");
    FAIL();
  } catch (const SerializationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint y.ckpt, optimizer 0, parameter 0: the state has no 'step' (it has: momentum_buffer)"));
  }
  EXPECT_TRUE(adam.state().empty());  // nothing half-loaded
}

// Issue 32, C12: the GUIDE's optimizer table. Adagrad's state round-trips as plain tensors in
// Python's layout, like RMSprop's above; an optimizer outside the table (LBFGS) is refused when
// saved and when restored, the error naming its type and the ones fulgur knows.
TEST(Serialize, AdagradRoundTripsAndAnOptimizerOutsideTheTableIsRefusedNamingIt) {
  torch::manual_seed(2);
  torch::nn::Linear lin(3, 2);
  auto step = [&](torch::optim::Optimizer& opt) {
    opt.zero_grad();
    lin(torch::randn({4, 3})).pow(2).sum().backward();
    opt.step();
  };
  torch::optim::Adagrad adagrad(lin->parameters(), torch::optim::AdagradOptions(0.1).lr_decay(0.01));
  step(adagrad);
  step(adagrad);
  const c10::IValue saved = fulgur::detail::optimizer_state_dict(adagrad);
  const auto state = saved.toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(state.size(), 2u);
  for (const auto& entry : state) EXPECT_TRUE(entry.value().toGenericDict().at("sum").isTensor());
  torch::optim::Adagrad again(lin->parameters(), torch::optim::AdagradOptions(0.1).lr_decay(0.01));
  fulgur::detail::load_optimizer_state_dict(again, saved, "here");
  for (const auto& [key, value] : adagrad.state()) {
    const auto& a = static_cast<torch::optim::AdagradParamState&>(*again.state().at(key));
    const auto& b = static_cast<torch::optim::AdagradParamState&>(*value);
    EXPECT_EQ(a.step(), 2);
    EXPECT_TRUE(torch::equal(a.sum(), b.sum()));
  }

  torch::optim::LBFGS lbfgs(lin->parameters(), torch::optim::LBFGSOptions(0.1));
  try {
    fulgur::detail::optimizer_state_dict(lbfgs);
    FAIL() << "an LBFGS state was saved";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot checkpoint an optimizer of type"));
    EXPECT_THAT(e.what(), HasSubstr("LBFGS"));
    EXPECT_THAT(e.what(), HasSubstr("Adagrad"));
  }
  try {
    fulgur::detail::load_optimizer_state_dict(lbfgs, saved, "checkpoint z.ckpt, optimizer 0");
    FAIL() << "an LBFGS state was restored";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint z.ckpt, optimizer 0: cannot restore an optimizer of type"));
    EXPECT_THAT(e.what(), HasSubstr("LBFGS"));
  }
}

TEST(Serialize, ALightningStyleCheckpointSavedByPythonLoads) {
  TempDir dir;
  const std::string script = R"(
import collections, sys, torch
torch.manual_seed(3)
lin = torch.nn.Linear(3, 2)
opt = torch.optim.Adam(lin.parameters(), lr=0.01)
for _ in range(2):
    opt.zero_grad(); lin(torch.randn(4, 3)).pow(2).sum().backward(); opt.step()
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5)
ck = {
  'epoch': 1, 'global_step': 2, 'pytorch-lightning_version': '2.6.0',
  'state_dict': collections.OrderedDict((k, v) for k, v in lin.state_dict().items()),
  'loops': {'fit_loop': {'epoch_progress': {'current': {'completed': 1}}}},
  'callbacks': {"ModelCheckpoint{'monitor': None}": {'best_model_path': ''}},
  'optimizer_states': [opt.state_dict()],
  'lr_schedulers': [sched.state_dict()],
  'hyper_parameters': {'lr': 0.01, 'layers': [3, 2], 'name': 'lin', 'scale': None},
}
torch.save(ck, sys.argv[1])
print(repr(float(opt.state_dict()['state'][0]['exp_avg'].flatten()[0])))
)";
  std::ofstream(dir.path + "/make.py") << script;
  ASSERT_EQ(std::system(("/usr/bin/python3 " + dir.path + "/make.py " + dir.path + "/py.ckpt > " + dir.path +
                         "/out.txt 2>&1").c_str()), 0)
      << read_file(dir.path + "/out.txt");
  const Checkpoint ck = TorchCheckpointIO().load_checkpoint(dir.path + "/py.ckpt");
  EXPECT_EQ(ck.at("global_step").toInt(), 2);
  EXPECT_EQ(ck.at("hyper_parameters").toGenericDict().at("layers").toIntVector(), (std::vector<int64_t>{3, 2}));
  torch::nn::Linear lin(3, 2);
  load_from_checkpoint(*lin, dir.path + "/py.ckpt");
  torch::optim::Adam adam(lin->parameters(), torch::optim::AdamOptions(0.01));
  fulgur::detail::load_optimizer_state_dict(adam, ck.at("optimizer_states").toList().get(0), "python checkpoint");
  const auto& st = static_cast<torch::optim::AdamParamState&>(
      *adam.state().at(fulgur::detail::optimizer_state_key(lin->weight)));
  EXPECT_EQ(st.step(), 2);
  EXPECT_NEAR(st.exp_avg().flatten()[0].item<double>(), std::stod(read_file(dir.path + "/out.txt")), 1e-7);
}

// Issue 16, item 1: an older fulgur stored an unknown optimizer's state as a
// libtorch archive, which resuming handed to torch::jit::load: TorchScript in
// the checkpoint was compiled and its __setstate__ ran. A checkpoint whose
// optimizer state is such an archive, made by Python from a scripted module
// whose __setstate__ prints a marker, is refused on resume and prints nothing.
TEST(Serialize, ResumingACheckpointThatCarriesTorchScriptRefusesItWithoutRunningIt) {
  TempDir dir;
  const std::string script = R"(
import sys, torch
from typing import Tuple
class Payload(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.x = 1
    @torch.jit.export
    def __getstate__(self) -> Tuple[int, bool]:
        return (self.x, self.training)
    @torch.jit.export
    def __setstate__(self, s: Tuple[int, bool]) -> None:
        print("FULGUR_SETSTATE_RAN")
        self.x = s[0]
        self.training = s[1]
torch.jit.save(torch.jit.script(Payload()), sys.argv[1])
)";
  std::ofstream(dir.path + "/make.py") << script;
  ASSERT_EQ(std::system(("/usr/bin/python3 " + dir.path + "/make.py " + dir.path + "/payload.pt > " + dir.path +
                         "/out.txt 2>&1").c_str()), 0)
      << read_file(dir.path + "/out.txt");
  const std::string payload = read_file(dir.path + "/payload.pt");
  ASSERT_GT(payload.size(), 100u);

  auto options = TrainerOptions().accelerator("cpu").devices(1).default_root_dir(dir.path).enable_progress_bar(false)
                     .enable_checkpointing(false).logger(false).num_sanity_val_steps(0);
  auto data = std::make_shared<DataLoader>(fulgur::testing::regression_data(32), DataLoaderOptions(8));
  fulgur::testing::TinyRegression m;
  Trainer t(options.max_steps(2));
  t.fit(m, data);
  t.save_checkpoint(dir.path + "/good.ckpt");
  Checkpoint c = TorchCheckpointIO().load_checkpoint(dir.path + "/good.ckpt");
  Checkpoint archive_state = make_dict();
  auto bytes = torch::empty({static_cast<int64_t>(payload.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), payload.data(), payload.size());
  archive_state.insert("fulgur_archive", bytes);
  c10::impl::GenericList states(c10::AnyType::get());
  states.push_back(archive_state);
  c.insert_or_assign("optimizer_states", states);
  const std::string hostile = dir.path + "/hostile.ckpt";
  TorchCheckpointIO().save_checkpoint(c, hostile);

  fulgur::testing::TinyRegression m2;
  Trainer t2(options.max_steps(4));
  ::testing::internal::CaptureStdout();
  std::string error;
  try {
    t2.fit(m2, data, nullptr, hostile);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(error, HasSubstr(hostile));
  EXPECT_THAT(error, HasSubstr("runs TorchScript"));
  EXPECT_EQ(out.find("FULGUR_SETSTATE_RAN"), std::string::npos) << out;
}
