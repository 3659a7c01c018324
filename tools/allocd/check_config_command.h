// `allocd check-config`: says whether PyTorch 2.11 accepts a
// PYTORCH_CUDA_ALLOC_CONF, explains each key, warns about surprises and
// suggests a fix for near misses.
#ifndef ALLOCD_TOOLS_ALLOCD_CHECK_CONFIG_COMMAND_H_
#define ALLOCD_TOOLS_ALLOCD_CHECK_CONFIG_COMMAND_H_

#include <iosfwd>
#include <string_view>

namespace allocd {

// Prints the check of `conf` for people, or as one JSON object with
// `accepted`, `error` (in words), `pytorch_error` (PyTorch's own), `keys` ({key, value, explanation}), `warnings`,
// `suggestions`, `fixed_config` and `canonical`. Returns the process exit
// code: 0 when PyTorch accepts `conf`, 1 when it rejects it.
int RunCheckConfig(std::string_view conf, bool json, std::ostream& out);

}  // namespace allocd

#endif  // ALLOCD_TOOLS_ALLOCD_CHECK_CONFIG_COMMAND_H_
