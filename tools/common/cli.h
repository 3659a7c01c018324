// What allocd and allocctl share on the command line: exit codes, parsing
// with usage errors that print the usage, flags that may come before or
// after the subcommand, and size arguments.
#ifndef ALLOCD_TOOLS_COMMON_CLI_H_
#define ALLOCD_TOOLS_COMMON_CLI_H_

#include <iosfwd>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "allocator/bytes.h"

namespace allocd {

// Exit status of both tools (each --help and the README list them).
inline constexpr int kExitOk = 0;
// What was asked failed (no daemon, a bad file, a rejected config): the
// message on stderr says why and what to do.
inline constexpr int kExitError = 1;
// The command line is wrong (an unknown flag, a missing argument, a value
// that is not one): the message and the command's usage are on stderr.
inline constexpr int kExitUsage = 2;

// The "Exit status:" paragraph for a --help footer; `extra` adds the
// command's own codes, one "N: what" line each.
std::string ExitStatusHelp(const std::string& extra = "");

// Parses the command line into `app`. Returns nullopt when the command is to
// run, else the exit status to return: kExitOk after --help or --version
// (printed to `out`), kExitUsage after a usage error, printed to `err` as
// "<command>: <what is wrong>", the usage line of the subcommand it
// concerns and where its options are explained.
//
// An option of `app` itself is a global flag: when the subcommand that runs
// has an option of the same name that was not given, the app's value is
// given to it, so `allocd --json replay T` is `allocd replay T --json`. A
// global flag the subcommand has no use for is a usage error. (allocctl's
// globals, which its subcommands do not repeat, come after the subcommand
// through CLI11's fallthrough.)
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                    std::ostream& out, std::ostream& err);

// A CLI11 check that the value is a size as ParseSize reads it (a
// percentage counts: what it is a percentage of is known only later).
CLI::Validator SizeSyntax(const SizeContext& context = {});

// Parses a size flag with ParseSize, the flag's name in the error; "" is 0
// (not given). 0 bytes is an error: no flag here means "nothing".
absl::StatusOr<uint64_t> ParseSizeFlag(const std::string& flag,
                                       const std::string& value,
                                       const SizeContext& context = {});

}  // namespace allocd

#endif  // ALLOCD_TOOLS_COMMON_CLI_H_
