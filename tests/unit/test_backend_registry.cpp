// Note [Backends as plug-ins] (src/backend/registry.h): the plug-ins a build compiled register themselves
// before main, the base finds them by name and names none, an unknown name is an error listing those it
// has, and each backend's host kernels (Note [Host kernels] in backend/backend.h) compute on cpu and do
// nothing on meta.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/meta/meta_backend.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/units.h"
#include "ops/attention_block.h"

namespace fp {

TEST(BackendRegistry, EveryBuiltPlugInIsRegisteredInOrder) {
  std::vector<std::string> names;
  for (const BackendEntry* e : backends_registered()) {
    names.push_back(e->name);
    EXPECT_FALSE(e->summary.empty()) << e->name;
  }
  std::vector<std::string> want{"cpu", "meta"};
#if FLATPEAK_HAVE_CUDA
  want.push_back("cuda");
#endif
  EXPECT_EQ(names, want);
  EXPECT_EQ(&backend_get("cpu").kernels(), &ops::kernels_cpu());
  EXPECT_EQ(&backend_get("meta").kernels(), &ops::kernels_meta());
  EXPECT_EQ(backend_find("tpu"), nullptr);
}

TEST(BackendRegistry, CreatesByNameAndAnUnknownNameListsTheBuiltOnes) {
  EXPECT_EQ(backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes)->name(), "cpu");
  EXPECT_EQ(backend_create("meta", kUnlimitedBytes, kUnlimitedBytes)->name(), "meta");
  try {
    backend_create("tpu", kUnlimitedBytes, kUnlimitedBytes);
    FAIL() << "no error for an unknown backend";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown device 'tpu'"), std::string::npos) << what;
    EXPECT_NE(e.hint().find("--device cpu"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("--device meta"), std::string::npos) << e.hint();
  }
}

TEST(BackendRegistry, HostKernelsComputeOnCpuAndNothingOnMeta) {
  const std::vector<float> x{1.0f, -2.5f, 3.0f};
  for (const char* name : {"cpu", "meta"}) {
    auto be = backend_create(name, kUnlimitedBytes, kUnlimitedBytes);
    std::vector<bf16> h(x.size());
    std::vector<float> back(x.size(), 7.0f);
    be->host_kernels().copy(Buf(h.data()), CBuf(x.data()), static_cast<int64_t>(x.size()));
    be->host_kernels().copy(Buf(back.data()), CBuf(h.data()), static_cast<int64_t>(x.size()));
    if (be->computes())
      EXPECT_EQ(back, x) << name;  // the three values are bf16-exact
    else
      EXPECT_EQ(back, std::vector<float>(x.size(), 7.0f)) << name;
  }
}

TEST(BackendRegistry, MetaAnswersTheHostQueriesAsCpu) {
  std::vector<int32_t> q(130), k(130);
  for (int i = 0; i < 130; ++i) q[i] = k[i] = i;
  const ops::AttentionSpec a = ops::attention_block_spec(q.data(), k.data(), 1, 130, 130, 1, 1, 1, 1, 1.0f, 0, nullptr);
  const int64_t cpu_pairs = ops::kernels_cpu().attention_block_tile_pairs(a);
  EXPECT_EQ(ops::kernels_meta().attention_block_tile_pairs(a), cpu_pairs);
  EXPECT_EQ(cpu_pairs, 6);  // 3 x 3 tiles of 64, causal: the lower triangle with its diagonal
  EXPECT_EQ(ops::kernels_meta().rmsnorm_backward_workspace(100, 7),
            ops::kernels_cpu().rmsnorm_backward_workspace(100, 7));
}

}  // namespace fp
