// docs/kernels.md's op table is the registries' (kernels_doc_block): regenerate it with
// `deepinfer-lab kernels-doc --write` after changing src/kernels/*/registry.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "backend/kernels_doc.h"

TEST(KernelsDoc, CheckedInTableIsCurrent) {
  std::ifstream in(std::string(DIL_SOURCE_DIR) + "/docs/kernels.md");
  ASSERT_TRUE(in) << "docs/kernels.md";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string cur = dil::kernels_doc_current(ss.str());
  ASSERT_FALSE(cur.empty()) << "docs/kernels.md has no kernel-registry block";
  EXPECT_EQ(cur, dil::kernels_doc_block()) << "docs/kernels.md is stale: run `deepinfer-lab kernels-doc --write`";
}
