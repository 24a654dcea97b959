// deepinfer-lab kernels-doc [--write] [--doc docs/kernels.md]
// Prints the op table of docs/kernels.md generated from the kernel registries, or (--write)
// rewrites that block of the file in place. CI checks the file is current (tests/kernels).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/kernels_doc.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace dil::cli {

int cmd_kernels_doc(int argc, char** argv) {
  Args args(argc, argv, {"write"});
  if (!args.has("write")) {
    std::printf("%s\n", kernels_doc_block().c_str());
    return 0;
  }
  const std::string path = args.get("doc", "docs/kernels.md");
  std::ifstream in(path);
  if (!in) DIL_FAIL("cannot read ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string updated = kernels_doc_update(ss.str());
  in.close();
  std::ofstream out(path);
  if (!out) DIL_FAIL("cannot write ", path);
  out << updated;
  std::printf("wrote the kernel table of %s\n", path.c_str());
  return 0;
}

}  // namespace dil::cli
