// SPDX-License-Identifier: Apache-2.0
// Collectives across real processes (fork, file store, Gloo on loopback).
// Rank r contributes r, so sums are N(N-1)/2.

#include "support.h"

#include "distributed/gradient_sync.h"
#include "xla/step_reducer.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <chrono>
#include <thread>

using namespace fulgur;
using fulgur::testing::run_ranks;

namespace {

void expect_all_ok(const std::vector<fulgur::testing::RankResult>& rs) {
  for (size_t r = 0; r < rs.size(); ++r) EXPECT_TRUE(rs[r].exited_ok()) << "rank " << r << ": " << rs[r].error;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

}  // namespace

TEST(Collectives, AllReduceEveryOp) {
  for (int world : {2, 4}) {
    auto rs = run_ranks(world, [world](Collectives& c) {
      const double r = static_cast<double>(c.rank());
      auto t = torch::full({3}, r);
      c.all_reduce(t, ReduceOp::kSum);
      require(t[0].item<double>() == world * (world - 1) / 2.0, "sum");
      t = torch::full({3}, r);
      c.all_reduce(t, ReduceOp::kMean);
      require(t[1].item<double>() == (world - 1) / 2.0, "mean");
      t = torch::full({1}, r);
      c.all_reduce(t, ReduceOp::kMax);
      require(t.item<double>() == world - 1, "max");
      t = torch::full({1}, r);
      c.all_reduce(t, ReduceOp::kMin);
      require(t.item<double>() == 0, "min");
      auto i = torch::full({1}, c.rank(), torch::kInt64);
      c.all_reduce(i, ReduceOp::kMean);
      require(i.is_floating_point() && i.item<double>() == (world - 1) / 2.0, "integer mean is floating point");
    });
    expect_all_ok(rs);
  }
}

TEST(Collectives, AllGatherStacksAndKeepsZeroDim) {
  auto rs = run_ranks(3, [](Collectives& c) {
    auto g = c.all_gather(torch::full({2, 2}, static_cast<double>(c.rank())));
    require(g.sizes() == c10::IntArrayRef({3, 2, 2}), "shape (world, batch, ...)");
    for (int r = 0; r < 3; ++r) require(g[r][1][1].item<double>() == r, "rank order");
    auto s = c.all_gather(torch::tensor(static_cast<double>(c.rank())));
    require(s.sizes() == c10::IntArrayRef({3}), "0-dim gives (world,)");
  });
  expect_all_ok(rs);
}

TEST(Collectives, BroadcastObjectsOfDifferentSizes) {
  auto rs = run_ranks(2, [](Collectives& c) {
    // Payloads differ in length per rank; rank 1's wins.
    auto d = make_dict();
    d.insert("name", std::string(c.rank() == 1 ? "from rank one, longer" : "r0"));
    d.insert("f16", torch::ones({2}, torch::kFloat16) * c.rank());
    d.insert("i64", torch::tensor(int64_t(7 + c.rank())));
    auto nested = make_dict();
    nested.insert("list", c10::List<int64_t>({1, 2, c.rank()}));
    d.insert("nested", nested);
    auto out = c10::impl::toTypedDict<std::string, c10::IValue>(c.broadcast_object(d, 1).toGenericDict());
    require(out.at("name").toStringRef() == "from rank one, longer", "string");
    require(out.at("f16").toTensor().scalar_type() == torch::kFloat16, "dtype kept");
    require(out.at("f16").toTensor()[0].item<double>() == 1.0, "tensor value");
    require(out.at("i64").toTensor().dim() == 0 && out.at("i64").toTensor().item<int64_t>() == 8, "0-dim stays 0-dim");
    auto l = c10::impl::toTypedDict<std::string, c10::IValue>(out.at("nested").toGenericDict()).at("list").toIntList();
    require(l.get(2) == 1, "nested list");
    auto t = torch::full({4}, static_cast<double>(c.rank()));
    c.broadcast(t, 0);
    require(t.sum().item<double>() == 0, "tensor broadcast");
  });
  expect_all_ok(rs);
}

TEST(Collectives, BadSrcIsRefused) {
  auto rs = run_ranks(2, [](Collectives& c) {
    try {
      c.broadcast_object(c10::IValue(1), 2);
    } catch (const std::invalid_argument& e) {
      require(std::string(e.what()).find("src=2") != std::string::npos, e.what());
      return;
    }
    throw std::runtime_error("no error for src=2");
  });
  expect_all_ok(rs);
}

TEST(Collectives, ShapeMismatchIsAnErrorOnEveryRankWithBothShapes) {
  // Equal byte counts: 4 float32 against 2 float64.
  auto rs = run_ranks(2, [](Collectives& c) {
    auto t = c.rank() == 0 ? torch::ones({4}, torch::kFloat32) : torch::ones({2}, torch::kFloat64);
    c.all_reduce(t, ReduceOp::kSum);
  });
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_FALSE(rs[r].exited_ok());
    EXPECT_TRUE(WIFEXITED(rs[r].status)) << "rank " << r << " must fail cleanly, not abort";
    EXPECT_NE(rs[r].error.find("Float[4]"), std::string::npos) << rs[r].error;
    EXPECT_NE(rs[r].error.find("Double[2]"), std::string::npos) << rs[r].error;
    EXPECT_NE(rs[r].error.find("all_reduce"), std::string::npos) << rs[r].error;
  }
  auto ag = run_ranks(3, [](Collectives& c) { c.all_gather(torch::ones({c.rank() == 2 ? 8 : 4})); });
  for (const auto& r : ag) EXPECT_NE(r.error.find("all_gather"), std::string::npos) << r.error;
}

TEST(Collectives, DifferentCollectivesAreDetected) {
  auto rs = run_ranks(2, [](Collectives& c) {
    auto t = torch::ones({2});
    if (c.rank() == 0) {
      c.all_reduce(t, ReduceOp::kSum);
    } else {
      c.broadcast(t, 0);
    }
  });
  for (const auto& r : rs) {
    EXPECT_NE(r.error.find("all_reduce"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("broadcast"), std::string::npos) << r.error;
  }
}

TEST(Collectives, BarrierNamesMustAgree) {
  auto ok = run_ranks(3, [](Collectives& c) { c.barrier("epoch-end"); });
  expect_all_ok(ok);
  auto rs = run_ranks(2, [](Collectives& c) { c.barrier(c.rank() == 0 ? "save" : "load"); });
  for (const auto& r : rs) {
    EXPECT_NE(r.error.find("barrier('save')"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("barrier('load')"), std::string::npos) << r.error;
  }
}

// 64 bytes in common, then "A" or "B": the names differ only after byte 63.
TEST(Collectives, BarrierNamesDifferingAfterByte63AreAMismatch) {
  const std::string common(64, 'n');
  auto rs = run_ranks(2, [&](Collectives& c) { c.barrier(common + (c.rank() == 0 ? "A" : "B")); });
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_FALSE(rs[r].exited_ok()) << "rank " << r << " passed a barrier whose name differs from rank "
                                    << (1 - r) << "'s";
    EXPECT_NE(rs[r].error.find("barrier('" + common + "A')"), std::string::npos) << rs[r].error;
    EXPECT_NE(rs[r].error.find("barrier('" + common + "B')"), std::string::npos) << rs[r].error;
  }
  // The same long name on every rank is one barrier.
  expect_all_ok(run_ranks(3, [&](Collectives& c) { c.barrier(common + common + "end"); }));
}

TEST(Collectives, BarrierTimeoutNamesTheBarrier) {
  auto rs = run_ranks(
      2,
      [](Collectives& c) {
        c.barrier("first");
        if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
        c.barrier("late-barrier");
      },
      30, std::chrono::milliseconds(1500));
  EXPECT_NE(rs[0].error.find("timed out"), std::string::npos) << rs[0].error;
  EXPECT_NE(rs[0].error.find("did not arrive: [1]"), std::string::npos) << rs[0].error;
  for (const auto& r : rs) EXPECT_NE(r.error.find("barrier('late-barrier')"), std::string::npos) << r.error;
}

// Tensors of more than 8 dimensions: equal shapes reduce; shapes that differ
// give every rank, at once, the same error naming each rank's full shape.
TEST(Collectives, NineDimensionalTensorsReduceAndTheirMismatchesNameRankAndShape) {
  const std::vector<int64_t> nine{1, 1, 1, 1, 1, 1, 1, 1, 2};
  expect_all_ok(run_ranks(2, [&](Collectives& c) {
    auto t = torch::full(nine, static_cast<double>(c.rank() + 1));
    c.all_reduce(t, ReduceOp::kSum);
    require(t.sizes() == c10::IntArrayRef(nine) && t.eq(3.0).all().item<bool>(), "9-dim sum is 1 + 2");
    auto g = c.all_gather(torch::full(nine, static_cast<double>(c.rank())));
    require(g.dim() == 10 && g[1].eq(1.0).all().item<bool>(), "9-dim all_gather");
  }));
  const auto start = std::chrono::steady_clock::now();
  // Rank 1 alone passes 9 dimensions (the last one differs from rank 0's too).
  auto rs = run_ranks(
      2,
      [&](Collectives& c) {
        auto t = c.rank() == 1 ? torch::ones({1, 1, 1, 1, 1, 1, 1, 1, 3}) : torch::ones({1, 1, 1, 1, 1, 1, 1, 1});
        c.all_reduce(t, ReduceOp::kSum);
      },
      60, std::chrono::milliseconds(10000));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 8.0)
      << "every rank must learn of the bad shape at once, not after the 10 s timeout";
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_TRUE(WIFEXITED(rs[r].status) && !rs[r].exited_ok()) << "rank " << r;
    EXPECT_EQ(rs[r].error, rs[0].error) << "rank " << r << " got another error than rank 0";
    EXPECT_NE(rs[r].error.find("rank 1 called all_reduce of Float[1, 1, 1, 1, 1, 1, 1, 1, 3]"), std::string::npos)
        << rs[r].error;
    EXPECT_NE(rs[r].error.find("rank 0 called all_reduce of Float[1, 1, 1, 1, 1, 1, 1, 1]"), std::string::npos)
        << rs[r].error;
  }
}

// A src out of range on one rank only: every rank hears of it at once.
TEST(Collectives, BadSrcOnOneRankIsAnErrorOnEveryRank) {
  const auto start = std::chrono::steady_clock::now();
  auto rs = run_ranks(
      2,
      [](Collectives& c) {
        auto t = torch::ones({2});
        c.broadcast(t, c.rank() == 1 ? 5 : 0);
      },
      60, std::chrono::milliseconds(10000));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 8.0);
  for (const auto& r : rs) {
    EXPECT_NE(r.error.find("(src=0)"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("(src=5)"), std::string::npos) << r.error;
  }
}

TEST(Collectives, HungRankTimesOutNamingCollectiveAndRank) {
  const auto start = std::chrono::steady_clock::now();
  auto rs = run_ranks(
      3,
      [](Collectives& c) {
        if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
        auto t = torch::ones({1});
        c.all_reduce(t, ReduceOp::kSum);
      },
      30, std::chrono::milliseconds(1500));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 15);
  for (int r : {0, 2}) {
    EXPECT_NE(rs[r].error.find("all_reduce"), std::string::npos) << rs[r].error;
    EXPECT_NE(rs[r].error.find("timed out"), std::string::npos) << rs[r].error;
    EXPECT_NE(rs[r].error.find("did not arrive: [1]"), std::string::npos) << rs[r].error;
  }
}

TEST(Collectives, PeerExitFailsTheOthersFast) {
  const auto start = std::chrono::steady_clock::now();
  auto rs = run_ranks(
      2,
      [](Collectives& c) {
        auto t = torch::ones({1});
        c.all_reduce(t, ReduceOp::kSum);
        if (c.rank() == 1) ::_exit(3);
        c.all_reduce(t, ReduceOp::kSum);
        c.all_reduce(t, ReduceOp::kSum);
      },
      30, std::chrono::milliseconds(20000));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 10) << "rank 0 must not wait for the 20 s timeout";
  EXPECT_FALSE(rs[0].exited_ok());
  EXPECT_TRUE(WIFEXITED(rs[0].status)) << "rank 0 must fail with an error, not die of signal "
                                       << (WIFSIGNALED(rs[0].status) ? WTERMSIG(rs[0].status) : 0);
  EXPECT_NE(rs[0].error.find("all_reduce"), std::string::npos) << rs[0].error;
}

// The cause of the test above's rare failure under load: rank 0 died of SIGPIPE writing to
// the peer that had exited. After create, SIGPIPE is ignored (as in Python) so the write fails
// with an error instead.
TEST(Collectives, CreateIgnoresSigpipeSoAGonePeerIsAnError) {
  auto rs = run_ranks(1, [](Collectives&) {
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    if (now.sa_handler != SIG_IGN) throw std::runtime_error("SIGPIPE is not ignored after Collectives::create");
    ::raise(SIGPIPE);  // would kill the process with the default disposition
  });
  EXPECT_TRUE(rs[0].exited_ok()) << rs[0].error << " status " << rs[0].status;
}

TEST(Collectives, WorldSizeMismatchReportsHowManyJoined) {
  // Three processes for a world of four: every rank gets "3/4 joined".
  fulgur::testing::TempDir dir;
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    if (pid_t pid = fork(); pid == 0) {
      at::set_num_threads(1);
      auto o = RendezvousOptions()
          .rank(r)
          .world_size(4)
          .store_path(dir.path + "/store")
          .timeout(std::chrono::milliseconds(1500));
      try {
        Collectives::create(o);
      } catch (const CollectiveError& e) {
        _exit(std::string(e.what()).find("3/4 joined") != std::string::npos ? 0 : 2);
      }
      _exit(1);
    } else {
      pids.push_back(pid);
    }
  }
  for (auto pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
}

TEST(Collectives, RankOutOfRangeAndPortInUse) {
  auto o = RendezvousOptions()
      .rank(4)
      .world_size(4)
      .store_path("/tmp/unused");
  EXPECT_THROW(Collectives::create(o), std::invalid_argument);
  // Hold a port, then ask the store to serve on it.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  auto t = RendezvousOptions()
      .rank(0)
      .world_size(2)
      .host("127.0.0.1")
      .port(port)
      .timeout(std::chrono::milliseconds(1000));
  try {
    Collectives::create(t);
    FAIL() << "expected the port to be refused";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(port)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  close(fd);
}

// DDPStrategy's bucket reducer with gradient accumulation: the first
// micro-batch (sync off) uses both parameters, the last one only `a`. `b`
// must contribute what it accumulated, as in PyTorch DDP, not zeros; every
// gradient ends as the mean over ranks.
TEST(BucketReducer, ParameterUnusedInTheLastMicroBatchKeepsItsAccumulatedGradient) {
  expect_all_ok(run_ranks(2, [](Collectives& c) {
    const double r = static_cast<double>(c.rank()) + 1.0;
    auto a = torch::zeros({3}, torch::requires_grad());
    auto b = torch::zeros({2}, torch::requires_grad());
    auto reducer = fulgur::detail::make_bucket_reducer({a, b}, std::shared_ptr<Collectives>(&c, [](Collectives*) {}));
    reducer->set_enabled(false);
    ((a * r).sum() + (b * (10.0 * r)).sum()).backward();  // a: r, b: 10 r
    reducer->set_enabled(true);
    (a * r).sum().backward();  // a: 2 r, b untouched
    reducer->finalize();
    // Ranks hold r = 1 and 2: a = mean(2, 4) = 3, b = mean(10, 20) = 15.
    require(torch::allclose(a.grad(), torch::full({3}, 3.0)), "a.grad = 3, got " + std::to_string(a.grad()[0].item<double>()));
    require(torch::allclose(b.grad(), torch::full({2}, 15.0)), "b.grad = 15, got " + std::to_string(b.grad()[0].item<double>()));
  }));
}

// XLAStrategy's step reducer on three ranks: rank r's gradients are r + 1,
// and a parameter without a gradient counts as zeros. A 16-byte buffer cap
// makes two buffers (filled in reverse order): `unused` and `b` (2 floats
// each) share one, `a` (3) has its own.
// Disabled (accumulating), finalize leaves the local gradients alone.
TEST(StepReducer, GradientsBecomeTheMeanOverRanksAndMissingOnesCountAsZero) {
  expect_all_ok(run_ranks(3, [](Collectives& c) {
    const double r = static_cast<double>(c.rank()) + 1.0;
    auto a = torch::zeros({3}, torch::requires_grad());
    auto b = torch::zeros({2}, torch::requires_grad());
    auto unused = torch::zeros({2}, torch::requires_grad());
    auto reducer = fulgur::detail::make_step_reducer({a, b, unused}, std::shared_ptr<Collectives>(&c, [](Collectives*) {}), 16);
    ((a * r).sum() + (b * (10.0 * r)).sum()).backward();
    reducer->set_enabled(false);
    reducer->finalize();
    require(torch::allclose(a.grad(), torch::full({3}, r)), "disabled: a.grad stays r");
    reducer->set_enabled(true);
    reducer->finalize();
    // r = 1, 2, 3: a = mean(1, 2, 3) = 2, b = mean(10, 20, 30) = 20, unused = 0.
    require(torch::allclose(a.grad(), torch::full({3}, 2.0)), "a.grad = 2, got " + std::to_string(a.grad()[0].item<double>()));
    require(torch::allclose(b.grad(), torch::full({2}, 20.0)), "b.grad = 20, got " + std::to_string(b.grad()[0].item<double>()));
    require(unused.grad().defined() && torch::allclose(unused.grad(), torch::zeros({2})), "unused.grad = 0");
  }));
}

// Issue 35, item 4: DDP's bf16_compress_hook in both reducers on 2 ranks. Rank r's gradient
// is g_r (a seeded draw every rank can redo); the wire carries bf16(g_r), Gloo sums in
// bfloat16, and the mean is taken in float32, so every gradient is
// bf16(bf16(g_0) + bf16(g_1)) / 2: within bfloat16's rounding of the exact mean, not within
// float32's, and the same bits on both ranks.
TEST(CommHook, Bf16CompressAveragesTheBfloat16SumAndRanksAgreeBitForBit) {
  expect_all_ok(run_ranks(2, [](Collectives& c) {
    auto draw = [](int64_t seed) { return torch::randn({1000}, torch::Generator(at::detail::createCPUGenerator(seed))); };
    const at::Tensor g0 = draw(100), g1 = draw(101);
    auto round = [](const at::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
    const at::Tensor expected = round(round(g0) + round(g1)) / 2;
    const at::Tensor exact = (g0 + g1) / 2;
    const auto group = std::shared_ptr<Collectives>(&c, [](Collectives*) {});
    fulgur::detail::BucketOptions bucket_options;
    bucket_options.comm_hook = DDPCommHook::kBf16Compress;
    bucket_options.first_bucket_bytes = 1024;  // two buckets: 256 floats of `b`, then `a`
    for (const std::string which : {"bucket", "step"}) {
      auto a = torch::zeros({600}, torch::requires_grad());
      auto b = torch::zeros({400}, torch::requires_grad());
      auto reducer = which == "bucket" ? fulgur::detail::make_bucket_reducer({a, b}, group, bucket_options)
                                       : fulgur::detail::make_step_reducer({a, b}, group, 2048, DDPCommHook::kBf16Compress);
      const at::Tensor g = c.rank() == 0 ? g0 : g1;
      ((a * g.narrow(0, 0, 600)).sum() + (b * g.narrow(0, 600, 400)).sum()).backward();
      reducer->finalize();
      const at::Tensor got = torch::cat({a.grad(), b.grad()});
      require(torch::equal(got, expected), which + ": gradients are the mean of the bfloat16 sum");
      // Three roundings of at most 2^-9 each, relative to |g_0| + |g_1| (the sum may cancel).
      require(((got - exact).abs() <= (g0.abs() + g1.abs()) / 256).all().item<bool>(),
              which + ": within bfloat16's precision of the exact mean");
      require(!torch::allclose(got, exact, 1e-5, 1e-7), which + ": not the float32 mean (the hook acted)");
      const at::Tensor all = c.all_gather(got);
      require(torch::equal(all[0], all[1]), which + ": both ranks hold the same bits");
    }
  }));
}
