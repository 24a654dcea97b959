// Temporary: replaced by cmd_inspect.cpp / cmd_logits.cpp / cmd_generate.cpp.
#include "cli/commands.h"
#include "core/check.h"
namespace dil::cli {
int cmd_inspect(int, char**) { DIL_FAIL("inspect: not built yet"); }
int cmd_logits(int, char**) { DIL_FAIL("logits: not built yet"); }
int cmd_generate(int, char**) { DIL_FAIL("generate: not built yet"); }
}  // namespace dil::cli
