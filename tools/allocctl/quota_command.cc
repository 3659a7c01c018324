#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/bytes.h"
#include "tools/allocctl/commands.h"

namespace allocd {
namespace {

struct QuotaOptions {
  // A size, a percentage of a GPU pool's capacity, or "none".
  std::string quota;
  // The target: one of the three.
  std::optional<uint64_t> session;
  std::optional<uint32_t> uid;
  std::optional<std::string> tenant;
};

// What a quota of "N%" is a percentage of: a quota limits what is held on
// one GPU, so the smallest device pool's capacity (a daemon before per-GPU
// pools reports only the one capacity).
absl::StatusOr<uint64_t> PoolCapacity(v1::Admin::Stub& admin) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::StatusResponse status;
  if (grpc::Status s = admin.Status(&context, v1::StatusRequest(), &status);
      !s.ok()) {
    return absl::UnavailableError(s.error_message());
  }
  uint64_t smallest = status.capacity_bytes();
  for (const v1::DeviceStatus& d : status.devices()) {
    smallest = std::min(smallest, d.capacity_bytes());
  }
  return smallest;
}

int RunSet(const QuotaOptions& o, const AdminContext& c) {
  v1::SetQuotaRequest request;
  if (o.session) request.set_session_id(*o.session);
  if (o.uid) request.set_uid(*o.uid);
  if (o.tenant) request.set_tenant(*o.tenant);
  if (o.quota != "none") {
    SizeContext of_pool;
    if (absl::EndsWith(o.quota, "%")) {
      absl::StatusOr<uint64_t> capacity = PoolCapacity(c.admin);
      if (!capacity.ok()) {
        std::cerr << "allocctl: " << capacity.status().message() << "\n";
        return kExitError;
      }
      of_pool.percent_of = *capacity;
    }
    // SizeSyntax checked the form.
    request.set_bytes(*ParseSize(o.quota, of_pool));
  }
  return CallAdmin(c, &v1::Admin::Stub::SetQuota, request,
                   [&](const v1::SetQuotaResponse&) {
                     const std::string target =
                         o.session ? absl::StrCat("session ", *o.session)
                         : o.uid   ? absl::StrCat("uid ", *o.uid)
                                   : absl::StrCat("tenant ", *o.tenant);
                     std::printf("quota of %s: %s\n", target.c_str(),
                                 o.quota.c_str());
                   });
}

}  // namespace

void AddQuotaCommand(CLI::App& app, AdminCommands& commands) {
  auto o = std::make_shared<QuotaOptions>();
  CLI::App* quota =
      app.add_subcommand("quota", "per-session, per-uid and per-tenant quotas");
  quota->require_subcommand(1);
  CLI::App* set = quota->add_subcommand(
      "set", "most memory a session, a uid or a tenant may hold; 'none' "
             "clears it");
  set->add_option("SIZE", o->quota,
                  "e.g. 20GiB, 20Gi, 25% of a GPU pool's capacity, or none "
                  "(a quota holds on each GPU)")
      ->required()
      ->check(CLI::Validator(
          [size = SizeSyntax()](std::string& value) {
            return value == "none" ? std::string() : size(value);
          },
          "SIZE|none"));
  auto* target = set->add_option_group("target");
  target->add_option("--session", o->session, "session id");
  target->add_option("--uid", o->uid, "uid");
  target->add_option("--tenant", o->tenant,
                     "tenant, as `allocctl sessions` shows it: uid:1001, "
                     "pod:<pod UID> or node");
  target->require_option(1);
  commands.push_back({set, [o](const AdminContext& c) { return RunSet(*o, c); }});
}

}  // namespace allocd
