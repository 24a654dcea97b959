#include "cli/app.h"

#include <cstdio>
#include <iostream>
#include <map>
#include <set>

#include "core/check.h"

namespace dil::cli {
namespace {

// The help format (every option on one line, its default or "(required)" at the end) and the
// requirements declared with require(). Requirements live here because the formatter is the
// one object CLI11 shares between an app and all its subcommands (no global registry).
class HouseStyle : public CLI::Formatter {
 public:
  HouseStyle() { column_width(40); }

  std::string make_option(const CLI::Option* opt, bool is_positional) const override {
    std::string left = "  " + make_option_name(opt, is_positional) + make_option_opts(opt);
    if (left.size() + 1 < column_width_) left.resize(column_width_, ' ');
    else left += "  ";
    return left + make_option_desc(opt) + "\n";
  }
  // The type only; the default goes at the end of the description.
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (opt->get_expected_min() > 0 && !opt->get_type_name().empty()) out += " " + opt->get_type_name();
    if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
    auto list = [&out](const char* what, const std::set<CLI::Option*>& opts) {
      if (opts.empty()) return;
      out += std::string(" ") + what + ":";
      for (const CLI::Option* o : opts) out += " " + o->get_name();
    };
    list("Needs", opt->get_needs());
    list("Excludes", opt->get_excludes());
    return out;
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string d = opt->get_description();
    const std::string note = default_note(opt);
    if (!note.empty()) d += (d.empty() ? "" : " ") + note;
    return d;
  }

  // "(default: X)", "(required)", "(required: one of --a, --b)", or "" (--help).
  std::string default_note(const CLI::Option* opt) const {
    auto r = required_.find(opt);
    if (r != required_.end()) return "(" + r->second + ")";
    if (opt->get_expected_min() == 0) return opt->get_default_str().empty() ? "" : "(default: " + opt->get_default_str() + ")";
    return "(default: " + (opt->get_default_str().empty() ? std::string("none") : opt->get_default_str()) + ")";
  }
  bool is_required(const CLI::Option* opt) const { return required_.count(opt) > 0; }

  void add_requirement(const CLI::App* app, std::vector<const CLI::Option*> any_of) {
    std::string note = "required";
    if (any_of.size() > 1) {
      note += ": one of";
      for (size_t i = 0; i < any_of.size(); ++i) note += std::string(i ? ", " : " ") + any_of[i]->get_name();
    }
    for (const CLI::Option* o : any_of) required_[o] = note;
    requirements_[app].push_back(std::move(any_of));
  }
  // Throws CLI::RequiredError for the first unmet requirement of `app`.
  void check(const CLI::App* app) const {
    auto it = requirements_.find(app);
    if (it == requirements_.end()) return;
    for (const auto& any_of : it->second) {
      bool met = false;
      for (const CLI::Option* o : any_of) met = met || o->count() > 0;
      if (met) continue;
      if (any_of.size() == 1) throw CLI::RequiredError(any_of[0]->get_name());
      std::string names;
      for (size_t i = 0; i < any_of.size(); ++i) names += std::string(i ? ", " : "") + any_of[i]->get_name();
      throw CLI::RequiredError("one of " + names);
    }
  }

 private:
  std::map<const CLI::Option*, std::string> required_;
  std::map<const CLI::App*, std::vector<std::vector<const CLI::Option*>>> requirements_;
};

HouseStyle& style(const CLI::App& app) {
  auto* s = dynamic_cast<HouseStyle*>(app.get_formatter().get());
  DIL_CHECK(s != nullptr, "an app not made by make_top_app (or a subcommand of one)");
  return *s;
}

std::vector<const CLI::App*> subcommands(const CLI::App& app) {
  std::vector<const CLI::App*> out;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    if (!s->get_name().empty()) out.push_back(s);  // unnamed ones are option groups
  return out;
}

// "serve", "bench prefill": the deepest parsed subcommand's path below the top level.
std::string parsed_path(const CLI::App& top, const CLI::App** leaf) {
  std::string path;
  const CLI::App* cur = &top;
  for (;;) {
    const CLI::App* next = nullptr;
    for (const CLI::App* s : subcommands(*cur))
      if (s->parsed()) next = s;
    if (!next) break;
    path += (path.empty() ? "" : " ") + next->get_name();
    cur = next;
  }
  if (leaf) *leaf = cur;
  return path;
}

void describe(const CLI::App& app, const std::string& path, const HouseStyle& st, nlohmann::json* out) {
  nlohmann::json opts = nlohmann::json::array();
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_group().empty()) continue;  // hidden
    std::vector<std::string> names;
    for (const auto& s : o->get_snames()) names.push_back("-" + s);
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    opts.push_back({{"names", names},
                    {"type", o->get_expected_min() > 0 ? o->get_type_name() : ""},
                    {"default", o->get_default_str()},
                    {"note", st.default_note(o)},
                    {"flag", o->get_expected_min() == 0},
                    {"required", st.is_required(o)}});
  }
  out->push_back({{"command", path}, {"options", opts}, {"subcommands", subcommands(app).size()}});
  for (const CLI::App* s : subcommands(app)) describe(*s, path.empty() ? s->get_name() : path + " " + s->get_name(), st, out);
}

}  // namespace

std::unique_ptr<CLI::App> make_top_app(const std::string& description) {
  auto app = std::make_unique<CLI::App>(description, "deepinfer-lab");
  app->formatter(std::make_shared<HouseStyle>());
  app->option_defaults()->always_capture_default();
  return app;
}

void require(CLI::App* sub, std::vector<std::string> names) {
  std::vector<const CLI::Option*> opts;
  for (const auto& n : names) opts.push_back(sub->get_option(n));  // throws OptionNotFound: a typo here
  style(*sub).add_requirement(sub, std::move(opts));
}

CLI::Option* add_switch(CLI::App* app, const std::string& name, bool& field, const std::string& help) {
  return app->add_flag(name, field, help)->default_str(field ? "on" : "off");
}

int parse_and_run(CLI::App& top, const std::vector<Declared>& commands, const ProgramArgs& prog) {
  const Declared* chosen = nullptr;
  try {
    top.parse(prog.argc, prog.argv);
    const CLI::App* leaf = nullptr;
    parsed_path(top, &leaf);
    for (const auto& c : commands)
      if (c.app == leaf) chosen = &c;
    // A group (`bench`) requires its subcommand; the top level requires a command.
    if (!chosen) throw CLI::RequiredError(leaf == &top ? "a command" : "a subcommand of " + leaf->get_name());
    style(top).check(leaf);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return top.exit(e);  // --help (of the parsed command), --options-json
    const std::string path = parsed_path(top, nullptr);
    const std::string prog_path = "deepinfer-lab" + (path.empty() ? "" : " " + path);
    std::string msg = e.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      // CLI11 lists the leftovers last first; name the unknown options in command-line order.
      std::string opts, args;
      for (const auto& a : top.remaining(true)) {
        std::string& list = a.rfind("-", 0) == 0 ? opts : args;
        list += (list.empty() ? "" : " ") + a;
      }
      msg = opts.empty() ? "unexpected argument " + args
                         : "unknown option " + opts + (args.empty() ? "" : " (and arguments: " + args + ")");
    }
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for its options.\n", prog_path.c_str(), msg.c_str(), prog_path.c_str());
    return 2;
  }
  try {
    return chosen->run(prog);
  } catch (const dil::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

nlohmann::json describe_options(const CLI::App& top) {
  nlohmann::json out = nlohmann::json::array();
  describe(top, "", style(top), &out);
  return out;
}

}  // namespace dil::cli
