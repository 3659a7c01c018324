// SessionObserver: what DaemonCore tells a listener about its sessions — the
// hooks the autotuner is fed through (server/daemon_autotune.h). The core
// only reports what sessions said; it decides nothing on an observer's
// behalf. Calls come from RPC threads, after the core validated the input;
// implementations are thread-safe, cheap, and do not call back into the
// core synchronously.
#ifndef ALLOCD_SERVER_SESSION_OBSERVER_H_
#define ALLOCD_SERVER_SESSION_OBSERVER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "allocd.pb.h"
#include "server/config_pusher.h"
#include "server/session_registry.h"

namespace allocd {

class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  // The config a registering session (or a job about to start: the
  // LearnedConfig RPC) is to start on instead of its own
  // (identity.initial_config), unless its job has a config of its own: the
  // config the job learned in an earlier run (the autotuner's
  // LearnedConfigs), or the node's prior (the seed while none agrees), or
  // its harmful config made safe
  // (server/autotune/start_config.h); nullopt: none. `preferences`: what
  // the job asks for (its mode, its pinned keys); `features`: what its
  // process said it does with CUDA memory when it registered (a config
  // they break is never started on). Called before SessionStarted, with
  // the config fan-out lock held.
  virtual std::optional<ConfigPusher::Learned> LearnedConfigFor(
      const SessionIdentity& identity, const v1::AutotunePreferences& preferences,
      const v1::JobFeatures& features) = 0;
  // A session registered; it runs `running` (its initial config as version
  // 0, or what a reconnecting client re-declared), was handed `learned`
  // (LearnedConfigFor's config, under its version: pushed to it, or what it
  // runs already; nullopt: none), was pushed `pushed` at registration (its
  // job's or its learned config, which it runs once it ACKs that version;
  // nullopt: nothing pushed) and the job asked for `preferences`.
  virtual void SessionStarted(const SessionIdentity& identity,
                              const AppliedConfig& running,
                              const std::optional<AppliedConfig>& learned,
                              const std::optional<AppliedConfig>& pushed,
                              const v1::AutotunePreferences& preferences) = 0;
  // What of session `id`'s (started) allocation stream the daemon reads,
  // as RegisterResponse.stream_from_reserved says it (0: all of it;
  // kStreamNotRead: none; else only past that reserved):
  // Autotuner::StreamReadFrom.
  virtual uint64_t StreamReadFrom(SessionId /*id*/) const { return 0; }
  virtual void SessionEnded(SessionId id) = 0;
  // Allocator events, validated (columns of one length, ops 0..2).
  virtual void Events(SessionId id, const v1::EventBatch& batch) = 0;
  virtual void Stats(SessionId id, const std::map<std::string, int64_t>& stats,
                     uint64_t config_version) = 0;
  virtual void Oom(SessionId id, uint64_t config_version) = 0;
  // What the session's process does with its CUDA memory, at registration
  // and each time it starts doing more (only what it reported, never none).
  virtual void Features(SessionId id, const v1::JobFeatures& features) = 0;
  // An ACK (applied) or NACK of a pushed version.
  virtual void Acked(SessionId id, uint64_t version, bool applied,
                     const std::string& error) = 0;
};

}  // namespace allocd

#endif  // ALLOCD_SERVER_SESSION_OBSERVER_H_
