// SPDX-License-Identifier: Apache-2.0
#include "support.h"

#include <fulgur/data/mnist.h>
#include <fulgur/data/text.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

using namespace fulgur;
using fulgur::testing::TempDir;

TEST(RandomSampler, SequentialAndSeededShuffle) {
  RandomSampler seq(5, false, 0);
  EXPECT_EQ(seq.indices(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  RandomSampler a(100, true, 7), b(100, true, 7);
  EXPECT_EQ(a.indices(), b.indices());
  auto e0 = a.indices();
  a.set_epoch(1);
  EXPECT_NE(a.indices(), e0);
  std::set<int64_t> all(e0.begin(), e0.end());
  EXPECT_EQ(all.size(), 100u);
}

TEST(DistributedSampler, PartitionCoversEverySampleOnceWhenDivisible) {
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < 4; ++r) {
    DistributedSampler s(100, DistributedSampler::Options().num_replicas(4).rank(r).seed(3));
    EXPECT_EQ(s.size(), 25);
    for (auto i : s.indices()) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 100u);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(seen.count(i), 1u);
}

TEST(DistributedSampler, PadsByRepeatingTheStartLikeTorch) {
  // 10 samples on 4 ranks: 12 slots, the first 2 indices of the order repeat.
  std::multiset<int64_t> seen;
  for (int64_t r = 0; r < 4; ++r) {
    DistributedSampler s(10, DistributedSampler::Options().num_replicas(4).rank(r).shuffle(false));
    EXPECT_EQ(s.size(), 3);
    for (auto i : s.indices()) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(seen.count(0), 2u);
  EXPECT_EQ(seen.count(1), 2u);
  EXPECT_EQ(seen.count(9), 1u);
  // Rank 1 takes positions 1, 5, 9 of 0..9 padded with 0, 1.
  DistributedSampler r1(10, DistributedSampler::Options().num_replicas(4).rank(1).shuffle(false));
  EXPECT_EQ(r1.indices(), (std::vector<int64_t>{1, 5, 9}));
}

TEST(DistributedSampler, DropLastCutsTheTail) {
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 4; ++r) {
    DistributedSampler s(10, DistributedSampler::Options().num_replicas(4).rank(r).seed(1).drop_last(true));
    EXPECT_EQ(s.size(), 2);
    for (auto i : s.indices()) EXPECT_TRUE(seen.insert(i).second);
  }
  EXPECT_EQ(seen.size(), 8u);
}

TEST(DistributedSampler, RejectsBadRanks) {
  EXPECT_THROW(DistributedSampler(10, DistributedSampler::Options().num_replicas(0)), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, DistributedSampler::Options().num_replicas(2).rank(2)), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, DistributedSampler::Options().num_replicas(2).rank(-1)), std::invalid_argument);
}

TEST(DataLoader, BatchesInOrderWithDropLast) {
  auto x = torch::arange(10).to(torch::kFloat32).unsqueeze(1);
  auto ds = std::make_shared<TensorDataset>(x, torch::arange(10));
  DataLoader keep(ds, DataLoaderOptions(4));
  EXPECT_EQ(keep.num_batches(), 3);
  auto s = keep.open();
  std::vector<int64_t> sizes;
  std::vector<int64_t> firsts;
  while (auto b = s->next()) {
    sizes.push_back(b->data.size(0));
    firsts.push_back(b->target[0].item<int64_t>());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(firsts, (std::vector<int64_t>{0, 4, 8}));
  DataLoader drop(ds, DataLoaderOptions(4).drop_last(true));
  EXPECT_EQ(drop.num_batches(), 2);
}

TEST(DataLoader, WorkersYieldTheSameBatchesAsInline) {
  auto ds = fulgur::testing::regression_data(203);
  DataLoader inline_loader(ds, DataLoaderOptions(16).shuffle(true).seed(5));
  DataLoader threaded(ds, DataLoaderOptions(16).shuffle(true).seed(5).num_workers(2));
  auto a = inline_loader.open();
  auto b = threaded.open();
  int n = 0;
  while (auto x = a->next()) {
    auto y = b->next();
    ASSERT_TRUE(y.has_value());
    EXPECT_TRUE(torch::equal(x->data, y->data));
    ++n;
  }
  EXPECT_FALSE(b->next().has_value());
  EXPECT_EQ(n, 13);
}

TEST(DataLoader, SkipResumesInsideAnEpoch) {
  auto ds = fulgur::testing::regression_data(40);
  DataLoader loader(ds, DataLoaderOptions(8).shuffle(true).seed(1));
  loader.set_epoch(3);
  auto full = loader.open();
  full->next();
  full->next();
  auto third = full->next();
  auto skipped = loader.open(2)->next();
  EXPECT_TRUE(torch::equal(third->data, skipped->data));
}

TEST(DataLoader, RejectsBadOptions) {
  auto ds = fulgur::testing::regression_data(4);
  EXPECT_THROW(DataLoader(ds, DataLoaderOptions(0)), std::invalid_argument);
  EXPECT_THROW(DataLoader(ds, DataLoaderOptions(1).num_workers(-1)), std::invalid_argument);
  EXPECT_THROW(DataLoader(nullptr, DataLoaderOptions(1)), std::invalid_argument);
}

TEST(Mnist, ReadsTheRealFiles) {
  auto test = load_mnist(fulgur::testing::mnist_dir(), Split::kTest);
  ASSERT_EQ(test->size(), 10000);
  EXPECT_EQ(test->data().sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  // The first test image is a 7 (LeCun's file).
  EXPECT_EQ(test->target()[0].item<int64_t>(), 7);
  EXPECT_NEAR(test->data().mean().item<double>(), 0.0, 0.1);
}

TEST(Mnist, TruncatedFileNamesTheFile) {
  TempDir dir;
  const std::string src = fulgur::testing::mnist_dir();
  for (const char* f : {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::filesystem::copy_file(src + "/" + f, dir.path + "/" + f);
  }
  std::filesystem::resize_file(dir.path + "/t10k-images-idx3-ubyte", 1000);
  try {
    load_mnist(dir.path, Split::kTest);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("t10k-images-idx3-ubyte is truncated"), std::string::npos) << e.what();
  }
}

TEST(Mnist, MissingFolderSaysHowToGetTheData) {
  try {
    load_mnist("/nonexistent/mnist", Split::kTrain);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("install-deps"), std::string::npos) << e.what();
  }
}

namespace {

// Writes `bytes` as <dir>/train-images-idx3-ubyte (and copies the real
// labels beside it); returns what load_mnist threw.
std::string train_images_error(const std::string& dir, const std::string& bytes) {
  std::ofstream(dir + "/train-images-idx3-ubyte", std::ios::binary) << bytes;
  std::filesystem::copy_file(fulgur::testing::mnist_dir() + "/train-labels-idx1-ubyte", dir + "/train-labels-idx1-ubyte",
                             std::filesystem::copy_options::overwrite_existing);
  try {
    load_mnist(dir, Split::kTrain);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

}  // namespace

// Issue 16, item 4: a 16-byte header claiming 10^7 images of 28 x 28 (7.8 GB)
// is refused from the file size, before any allocation.
TEST(Mnist, HeaderClaimingGigabytesIsRefusedFromTheFileSize) {
  TempDir dir;
  const std::string error = train_images_error(dir.path, be32(2051) + be32(10'000'000) + be32(28) + be32(28));
  EXPECT_NE(error.find(dir.path + "/train-images-idx3-ubyte is truncated"), std::string::npos) << error;
  EXPECT_NE(error.find("10000000 x 28 x 28 = 7840000000 bytes of data"), std::string::npos) << error;
  EXPECT_NE(error.find("the file has 16 bytes"), std::string::npos) << error;
}

// Dimensions whose product overflows int64: the 16 bytes of the audit's
// reproducer idx_overflow_header.train-images-idx3-ubyte.
TEST(Mnist, OverflowingDimensionsAreRefusedNamingTheFile) {
  TempDir dir;
  const std::string error = train_images_error(dir.path, be32(2051) + be32(10'000'000) + be32(10'000'000) + be32(10'000'000));
  EXPECT_NE(error.find(dir.path + "/train-images-idx3-ubyte has a bad header: its dimensions 10000000 x 10000000 x "
                                  "10000000 overflow a 64-bit size; the file has 16 bytes"),
            std::string::npos)
      << error;
}

TEST(Mnist, EmptyOrShortFileIsTooShort) {
  TempDir dir;
  std::string error = train_images_error(dir.path, "");
  EXPECT_NE(error.find("train-images-idx3-ubyte is too short for an IDX file: 0 bytes"), std::string::npos) << error;
  error = train_images_error(dir.path, be32(2051) + be32(1));
  EXPECT_NE(error.find("train-images-idx3-ubyte is too short for its header: 8 bytes, 3 dimensions take 16"),
            std::string::npos)
      << error;
  error = train_images_error(dir.path, be32(2051) + be32(1) + be32(2) + be32(2) + "abcdef");
  EXPECT_NE(error.find("train-images-idx3-ubyte has 2 bytes after the data its header describes (1 x 2 x 2 = 4 bytes)"),
            std::string::npos)
      << error;
}

// The text reader sizes its buffer from the file system: a folder or a
// device is refused rather than read until memory runs out.
TEST(CharDataset, FromFileRefusesWhatIsNotARegularFile) {
  TempDir dir;
  for (const std::string& path : {dir.path, std::string("/dev/zero")}) {
    try {
      CharDataset::from_file(path, 8);
      FAIL() << path << " was read";
    } catch (const std::runtime_error& e) {
      ASSERT_NE(std::string(e.what()).find("CharDataset: " + path + " is not a regular file"), std::string::npos) << e.what();
    }
  }
  std::ofstream(dir.path + "/t.txt") << "abcabcabd";
  EXPECT_EQ(CharDataset::from_file(dir.path + "/t.txt", 3)->size(), 6);
}

TEST(CharDataset, WindowsAndTargetsShiftByOne) {
  CharDataset ds("abcabcabd", 3);
  EXPECT_EQ(ds.vocab_size(), 4);
  EXPECT_EQ(ds.size(), 6);
  auto b = ds.get_batch({0, 2});
  EXPECT_EQ(ds.decode(b.data[0]), "abc");
  EXPECT_EQ(ds.decode(b.target[0]), "bca");
  EXPECT_EQ(ds.decode(b.data[1]), "cab");
  EXPECT_NEAR(CharDataset("aabb", 1).unigram_entropy(), std::log(2.0), 1e-9);
}
