#include "server/adoption_window.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ipc/unix_socket.h"

namespace allocd {

// The file's lines: "session PID" for each session, "chunk TENANT DEVICE
// ID BYTES" for each chunk handed out (tenant ids and device UUIDs have no
// blanks).
absl::StatusOr<SessionsFile> ReadSessionsFile(
    const std::string& path, const std::function<bool(pid_t)>& alive) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    const int error = errno;
    const std::string why = absl::StrCat(path, ": ", strerror(error));
    return error == ENOENT ? absl::NotFoundError(why)
                           : absl::PermissionDeniedError(why);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        path, " is not a file of the daemon's user that only it may read "
        "and write (0600): not the daemon's own, so not believed"));
  }
  std::string text;
  char buffer[1 << 16];
  for (ssize_t n; (n = read(fd.get(), buffer, sizeof buffer)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::PermissionDeniedError(
          absl::StrCat("reading ", path, ": ", strerror(errno)));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  SessionsFile contents;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t pid = 0;
    HandedChunk chunk;
    if (fields.size() == 2 && fields[0] == "session" &&
        absl::SimpleAtoi(fields[1], &pid) && pid > 0 &&
        alive(static_cast<pid_t>(pid))) {
      ++contents.sessions[static_cast<pid_t>(pid)];
    } else if (fields.size() == 5 && fields[0] == "chunk" &&
               absl::SimpleAtoi(fields[3], &chunk.id) &&
               absl::SimpleAtoi(fields[4], &chunk.bytes)) {
      chunk.device = std::string(fields[2]);
      contents.chunks[TenantId(fields[1])].push_back(std::move(chunk));
    }
  }
  return contents;
}

namespace {

void AppendChunkLines(std::string& text, const TenantId& tenant,
                      const std::vector<HandedChunk>& chunks) {
  for (const HandedChunk& c : chunks) {
    absl::StrAppend(&text, "chunk ", tenant, " ", c.device, " ", c.id, " ",
                    c.bytes, "\n");
  }
}

// All of `text` to `fd`, or why not.
absl::Status WriteAll(int fd, absl::string_view text, absl::string_view to) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("writing ", to, ": ", strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UniqueFd> WriteSessionsFile(const std::string& path,
                                           const SessionsFile& contents) {
  std::string text;
  for (const auto& [pid, count] : contents.sessions) {
    for (int i = 0; i < count; ++i) absl::StrAppend(&text, "session ", pid, "\n");
  }
  for (const auto& [tenant, chunks] : contents.chunks) {
    AppendChunkLines(text, tenant, chunks);
  }
  // A name of its own beside the file (mkstemp: 0600, never an existing
  // file or link), renamed over it. Not fsync'ed: the file must survive
  // the daemon, not the machine (the processes it names do not either).
  std::string temporary = path + ".XXXXXX";
  UniqueFd fd(mkostemp(temporary.data(), O_CLOEXEC | O_APPEND));
  if (!fd.valid()) {
    return absl::InternalError(
        absl::StrCat("creating ", temporary, ": ", strerror(errno)));
  }
  if (absl::Status s = WriteAll(fd.get(), text, temporary); !s.ok()) {
    unlink(temporary.c_str());
    return s;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("renaming ", temporary, " to ",
                                            path, ": ", strerror(error)));
  }
  return fd;
}

absl::Status AppendHandedChunks(int fd, const TenantId& tenant,
                                const std::vector<HandedChunk>& chunks) {
  std::string text;
  AppendChunkLines(text, tenant, chunks);
  // One write() of an O_APPEND file: whole, at its end.
  const ssize_t n = write(fd, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::InternalError(absl::StrCat(
        "appending to the sessions file: ",
        n < 0 ? strerror(errno) : "a short write"));
  }
  return absl::OkStatus();
}

bool ProcessAlive(pid_t pid) {
  // EPERM: it exists, as another user's.
  return kill(pid, 0) == 0 || errno == EPERM;
}

AdoptionWindow::AdoptionWindow(SessionsByPid expected, absl::Time deadline,
                               std::function<bool(pid_t)> alive)
    : deadline_(deadline),
      alive_(std::move(alive)),
      pending_(std::move(expected)),
      open_(!pending_.empty()) {}

void AdoptionWindow::CloseIfDone(absl::Time now) {
  if (open_ && (pending_.empty() || now >= deadline_)) open_ = false;
}

void AdoptionWindow::Returned(pid_t pid) {
  absl::MutexLock lock(&mu_);
  if (auto it = pending_.find(pid); it != pending_.end() && --it->second == 0) {
    pending_.erase(it);
  }
  CloseIfDone(absl::Now());
}

void AdoptionWindow::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!open_) return;
  std::erase_if(pending_, [&](const auto& p) { return !alive_(p.first); });
  CloseIfDone(now);
}

void AdoptionWindow::Wait() {
  absl::MutexLock lock(&mu_);
  auto closed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !open_; };
  mu_.AwaitWithDeadline(absl::Condition(&closed), deadline_);
  CloseIfDone(absl::Now());
}

bool AdoptionWindow::open() const {
  absl::MutexLock lock(&mu_);
  return open_ && absl::Now() < deadline_;
}

SessionsByPid AdoptionWindow::pending() const {
  absl::MutexLock lock(&mu_);
  return open_ ? pending_ : SessionsByPid{};
}

}  // namespace allocd
