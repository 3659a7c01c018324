#include "tools/common/cli.h"

#include <memory>
#include <ostream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace allocd {
namespace {

// "allocd replay": the app and the subcommands the parse got to.
std::string CommandPath(const CLI::App& app) {
  std::string path = app.get_name();
  for (const CLI::App* sub = &app;;) {
    // Option groups are nameless subcommands.
    const std::vector<const CLI::App*> chosen = sub->get_subcommands(
        [](const CLI::App* s) { return s->parsed() && !s->get_name().empty(); });
    if (chosen.empty()) return path;
    sub = chosen.front();
    absl::StrAppend(&path, " ", sub->get_name());
  }
}

// The deepest subcommand that runs, or the parse got to.
CLI::App* Selected(CLI::App& app) {
  CLI::App* sub = &app;
  for (;;) {
    std::vector<CLI::App*> chosen = sub->get_subcommands(
        [](CLI::App* s) { return s->parsed() && !s->get_name().empty(); });
    if (chosen.empty()) return sub;
    sub = chosen.front();
  }
}

int UsageError(CLI::App& app, const std::string& message, std::ostream& err) {
  const std::string command = CommandPath(app);
  const CLI::App* selected = Selected(app);
  err << command << ": " << message << "\n";
  // CLI11's own formatter knows the usage line; a custom one gets the help.
  if (auto formatter =
          std::dynamic_pointer_cast<CLI::Formatter>(selected->get_formatter())) {
    err << formatter->make_usage(selected, command)
        << "Run '" << command << " --help' for the options.\n";
  } else {
    err << "\n" << app.help();
  }
  return kExitUsage;
}

// Hands the app's global options that were given to the subcommand that
// runs; a usage error when it has no such option.
std::optional<std::string> ApplyGlobals(CLI::App& app) {
  CLI::App* selected = Selected(app);
  if (selected == &app) return std::nullopt;
  for (CLI::Option* global : app.get_options()) {
    if (global->count() == 0 || global->get_name() == "--help" ||
        global->get_name() == "--version" || global->get_lnames().empty()) {
      continue;
    }
    const std::string name = "--" + global->get_lnames().front();
    CLI::Option* own = selected->get_option_no_throw(name);
    if (own == nullptr) {
      // allocctl's globals serve every subcommand from the app itself.
      if (app.get_fallthrough()) continue;
      return absl::StrCat(name, " does not apply to `", CommandPath(app),
                          "`");
    }
    if (own->count() > 0) continue;  // the subcommand's own value wins
    for (const std::string& result : global->results()) own->add_result(result);
    own->run_callback();
  }
  return std::nullopt;
}

}  // namespace

std::string ExitStatusHelp(const std::string& extra) {
  return absl::StrCat(
      "Exit status:\n"
      "  0: done\n"
      "  1: an error; stderr says what happened and what to do\n"
      "  2: a usage error (unknown flag, missing or bad argument); the usage "
      "is printed\n",
      extra);
}

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                    std::ostream& out, std::ostream& err) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    out << e.what() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // A misspelt subcommand is left over, and CLI11 says only that a
    // subcommand is required.
    CLI::App* selected = Selected(app);
    const std::vector<std::string> left = app.remaining(/*recurse=*/true);
    if (selected->get_require_subcommand_min() > 0 && !left.empty() &&
        left.front().rfind("-", 0) != 0) {
      return UsageError(app,
                        absl::StrCat("'", left.front(), "' is not a subcommand"),
                        err);
    }
    return UsageError(app, e.what(), err);
  }
  if (std::optional<std::string> error = ApplyGlobals(app)) {
    return UsageError(app, *error, err);
  }
  return std::nullopt;
}

CLI::Validator SizeSyntax(const SizeContext& context) {
  SizeContext syntax = context;
  // Any base will do to check that a percentage is well formed.
  syntax.percent_of = 100;
  return CLI::Validator(
      [syntax](std::string& value) -> std::string {
        absl::StatusOr<uint64_t> size = ParseSize(value, syntax);
        return size.ok() ? "" : std::string(size.status().message());
      },
      "SIZE");
}

absl::StatusOr<uint64_t> ParseSizeFlag(const std::string& flag,
                                       const std::string& value,
                                       const SizeContext& context) {
  if (value.empty()) return 0;
  absl::StatusOr<uint64_t> size = ParseSize(value, context);
  if (!size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", size.status().message()));
  }
  if (*size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be more than 0"));
  }
  return size;
}

}  // namespace allocd
