#include <cstdio>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tools/allocctl/commands.h"

namespace allocd {

void AddHealthCommand(CLI::App& app, AdminCommands& commands) {
  CLI::App* health = app.add_subcommand(
      "health", "grpc.health.v1 check: prints SERVING; exit 0 only then");
  commands.push_back({health, [](const AdminContext& c) {
    auto stub = grpc::health::v1::Health::NewStub(c.channel);
    grpc::health::v1::HealthCheckRequest request;
    return Call<grpc::health::v1::HealthCheckResponse>(
        c.json,
        [&](grpc::ClientContext* context,
            grpc::health::v1::HealthCheckResponse* r) {
          return stub->Check(context, request, r);
        },
        [](const grpc::health::v1::HealthCheckResponse& r) {
          std::printf("%s\n",
                      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                          r.status())
                          .c_str());
        });
  }});
}

}  // namespace allocd
