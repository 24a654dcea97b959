#include "cli/shared_options.h"

#include "backend/backend.h"
#include "core/check.h"

namespace dil::cli {
namespace {

// The numerics modes of every command, in the order --help lists them: one line per mode.
struct NumericsMode {
  const char* name;
  const char* help;
};
constexpr NumericsMode kNumericsModes[] = {
    {"reference", "no quantization simulation (compare with float64 references)"},
    {"official", "the official inference code's quantization with f32 activations (the verification oracle)"},
    {"fast", "the official quantization with BF16 activations and tensor-core arithmetic (production)"},
};

std::string modes_list() {
  std::string s;
  for (const auto& m : kNumericsModes) s += std::string(s.empty() ? "" : "|") + m.name;
  return s;
}

std::string numerics_help() {
  std::string s = "numerics:";
  for (const auto& m : kNumericsModes) s += std::string(s.back() == ':' ? " " : "; ") + m.name + " = " + m.help;
  return s;
}

// Only the listed modes: parse_numerics may know more than the CLI offers, never fewer.
void parse_listed_numerics(const std::string& s) {
  for (const auto& m : kNumericsModes)
    if (s == m.name) return (void)parse_numerics(s);
  DIL_FAIL("unknown numerics mode '", s, "' (expected ", modes_list(), ")");
}

}  // namespace


CLI::Validator parsed_by(std::function<void(const std::string&)> parse) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& v) -> std::string {
        try {
          parse(v);
          return "";
        } catch (const dil::Error& e) {
          return e.what();
        }
      },
      "");
}

CLI::Option* add_numerics_option(CLI::App* app, Numerics& field) {
  return app
      ->add_option_function<std::string>(
          "--numerics", [&field](const std::string& s) { field = parse_numerics(s); }, numerics_help())
      ->default_str(dil::numerics_name(field))
      ->type_name(modes_list())
      ->check(parsed_by(parse_listed_numerics));
}

CLI::Option* add_numerics_option(CLI::App* app, std::string& field) {
  bool listed = false;
  for (const auto& m : kNumericsModes) listed = listed || field == m.name;
  DIL_CHECK(listed, "default numerics mode '", field, "' is not in kNumericsModes");
  return app->add_option("--numerics", field, numerics_help())->type_name(modes_list())->check(parsed_by(parse_listed_numerics));
}

CLI::Option* add_device_option(CLI::App* app, std::string& field) {
  return app->add_option("--device", field, "backend: cpu (the reference) or cuda (sm_90a)")
      ->type_name("cpu|cuda")
      ->check(parsed_by([](const std::string& s) { parse_backend_kind(s); }));
}

void add_launch_options(CLI::App* app, LaunchRequest& req, bool with_nproc) {
  if (with_nproc)
    app->add_option("--nproc", req.nproc, "ranks (processes, one GPU each) on this machine")->check(CLI::PositiveNumber);
  app->add_option("--nnodes", req.nnodes, "machines in the job")->check(CLI::PositiveNumber);
  app->add_option("--node-rank", req.node_rank, "this machine's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  app->add_option("--master-addr", req.master_addr, "rank 0's host for the TCP bootstrap")
      ->default_str("$MASTER_ADDR or 127.0.0.1");
  app->add_option("--master-port", req.master_port, "rank 0's bootstrap port")
      ->default_str("$MASTER_PORT, else a free port on one machine, else 29500")
      ->check(CLI::Range(0, 65535).description("0-65535"));
  app->add_option("--dist-timeout", req.timeout_s, "seconds a host message between ranks may take")
      ->check(CLI::PositiveNumber);
}

}  // namespace dil::cli
