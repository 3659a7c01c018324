#include <cstdio>
#include <memory>
#include <string>

#include "allocator/bytes.h"
#include "tools/allocctl/commands.h"

namespace allocd {

void AddPoolCommand(CLI::App& app, AdminCommands& commands) {
  // --device: a GPU UUID or node index; empty: every device.
  auto device = std::make_shared<std::string>();
  CLI::App* pool = app.add_subcommand("pool", "the node pool's memory");
  pool->require_subcommand(1);
  CLI::App* trim = pool->add_subcommand(
      "trim",
      "give every cached chunk back to the device now (held chunks stay)");
  trim->add_option("--device,-d", *device,
                   "only this device: its GPU UUID or its index in "
                   "allocctl status (default: every device)");
  commands.push_back({trim, [device](const AdminContext& c) {
    v1::TrimPoolRequest request;
    request.set_device(*device);
    return CallAdmin(c, &v1::Admin::Stub::TrimPool, request,
                     [&](const v1::TrimPoolResponse& r) {
                       std::printf("gave %s of cached chunks back to the %s\n",
                                   FormatSize(r.trimmed_bytes()).c_str(),
                                   device->empty()
                                       ? "devices"
                                       : ("device " + *device).c_str());
                     });
  }});
}

}  // namespace allocd
