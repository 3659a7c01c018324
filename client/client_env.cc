#include "client/client_env.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"

namespace allocd {
namespace {

// The variable's value; `fallback` when it is unset.
std::string Get(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

// A duration in whole milliseconds, 0 or more; `fallback` when unset.
absl::Status ReadMilliseconds(const char* name, absl::Duration& out) {
  const std::string text =
      Get(name, std::to_string(absl::ToInt64Milliseconds(out)));
  int ms = 0;
  if (!absl::SimpleAtoi(text, &ms) || ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be milliseconds (0 or more); got \"", text, "\""));
  }
  out = absl::Milliseconds(ms);
  return absl::OkStatus();
}

// A count or index in `out`, 0 or more; unchanged when unset.
absl::Status ReadCount(const char* name, uint32_t& out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a whole number (0 or more); got \"", v, "\""));
  }
  return absl::OkStatus();
}

// The longest run id the daemon takes (a job label's).
constexpr size_t kMaxRunId = 128;

}  // namespace

bool NcclRegistersSegments() {
  const std::string hook = absl::AsciiStrToLower(Get(env::kTorchNcclRegisterHook, ""));
  return hook == "1" || hook == "true" || hook == "t" || hook == "yes" || hook == "y" ||
         hook == "on";
}

std::string JobFeatureNames() {
  const google::protobuf::Descriptor& fields = *v1::JobFeatures::descriptor();
  std::vector<std::string> names;
  for (int i = 0; i < fields.field_count(); ++i) {
    names.push_back(std::string(fields.field(i)->name()));
  }
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<v1::JobFeatures> DeclaredFeatures() {
  v1::JobFeatures features;
  features.set_nccl_registration(NcclRegistersSegments());
  const google::protobuf::Descriptor& fields = *v1::JobFeatures::descriptor();
  for (absl::string_view name :
       absl::StrSplit(Get(env::kFeatures, ""), ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    const google::protobuf::FieldDescriptor* field = fields.FindFieldByName(std::string(name));
    if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_BOOL) {
      return absl::InvalidArgumentError(absl::StrCat(env::kFeatures, " names \"", name,
                                                     "\", which is not one of ",
                                                     JobFeatureNames()));
    }
    features.GetReflection()->SetBool(&features, field, true);
  }
  return features;
}

std::string JobRunId(const std::string& run_id, const std::string& master_addr,
                     const std::string& master_port) {
  std::string id = run_id;
  if (id == "none" && !master_addr.empty()) {
    absl::StrAppend(&id, "/", master_addr, ":", master_port);
  }
  for (char& c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
    if (!ok) c = '_';
  }
  if (id.size() > kMaxRunId) id.resize(kMaxRunId);
  return id;
}

std::string SocketOrDefault(const std::string& socket) {
  return socket.empty() ? kDefaultSocket : socket;
}

absl::StatusOr<ClientEnv> ClientEnv::FromEnvironment() {
  ClientEnv e;
  e.socket = SocketOrDefault(Get(env::kSocket, ""));
  e.job = Get(env::kJob, "");
  e.autotune = Get(env::kAutotune, "");
  e.autostart = Get(env::kAutostart, "") == "1";
  if (absl::Status s = ReadMilliseconds(env::kReadAheadMs, e.read_ahead);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadMilliseconds(env::kHandoverMs, e.handover);
      !s.ok()) {
    return s;
  }
  const std::string client_creates = Get(env::kClientCreates, "1");
  if (client_creates != "0" && client_creates != "1") {
    return absl::InvalidArgumentError(absl::StrCat(
        env::kClientCreates,
        " must be 1 (this process makes the chunks the daemon has not "
        "cached) or 0 (the daemon creates them); got \"",
        client_creates, "\""));
  }
  e.client_creates = client_creates == "1";
  if (absl::StatusOr<v1::JobFeatures> features = DeclaredFeatures(); !features.ok()) {
    return features.status();
  }
  const std::string running = Get(env::kPytorchCudaAllocConf, "");
  e.started_on_learned = Get(env::kLearnedAllocConf, "");
  if (e.started_on_learned != running) e.started_on_learned.clear();
  e.initial_config = e.started_on_learned.empty()
                         ? running
                         : Get(env::kInitialAllocConf, "");
  e.run_id = JobRunId(Get(env::kTorchRunId, ""), Get(env::kMasterAddr, ""),
                      Get(env::kMasterPort, ""));
  if (absl::Status s = ReadCount(env::kRank, e.rank); !s.ok()) return s;
  if (absl::Status s = ReadCount(env::kWorldSize, e.world_size); !s.ok()) return s;
  if (e.world_size > 0 && e.rank >= e.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(env::kRank, " ", e.rank, " is not below ",
                                                   env::kWorldSize, " ", e.world_size));
  }
  return e;
}

}  // namespace allocd
