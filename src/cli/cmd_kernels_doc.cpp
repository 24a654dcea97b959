// deepinfer-lab kernels-doc [--write] [--doc docs/kernels.md]
// Prints the op table of docs/kernels.md generated from the kernel registries, or (--write)
// rewrites that block of the file in place. CI checks the file is current (tests/kernels).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/kernels_doc.h"
#include "cli/commands.h"
#include "core/check.h"

namespace dil::cli {
namespace {

struct KernelsDocOptions {
  bool write = false;
  std::string doc = "docs/kernels.md";
};

int run_kernels_doc(const KernelsDocOptions& o) {
  if (!o.write) {
    std::printf("%s\n", kernels_doc_block().c_str());
    return 0;
  }
  std::ifstream in(o.doc);
  if (!in) DIL_FAIL("cannot read ", o.doc);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string updated = kernels_doc_update(ss.str());
  in.close();
  std::ofstream out(o.doc);
  if (!out) DIL_FAIL("cannot write ", o.doc);
  out << updated;
  std::printf("wrote the kernel table of %s\n", o.doc.c_str());
  return 0;
}

}  // namespace

void add_kernels_doc(CLI::App& top, std::vector<Declared>* out) {
  auto o = std::make_shared<KernelsDocOptions>();
  CLI::App* c = top.add_subcommand(
      "kernels-doc", "print (or --write into docs/kernels.md) the op table generated from the kernel registries");
  add_switch(c, "--write", o->write, "rewrite the generated block of --doc in place instead of printing it");
  c->add_option("--doc", o->doc, "the markdown file holding the generated block");
  out->push_back({c, [o](const ProgramArgs&) { return run_kernels_doc(*o); }});
}

}  // namespace dil::cli
