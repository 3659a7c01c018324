// RunAs: a command run as another uid, for the security tests' attackers and
// victims. The child drops root before it execs (setgroups to `groups`,
// setgid, setuid: nothing between fork and exec but system calls).
#ifndef ALLOCD_TESTS_SECURITY_RUN_AS_H_
#define ALLOCD_TESTS_SECURITY_RUN_AS_H_

#include <fcntl.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace allocd {

struct RanAs {
  // Its exit code; 128 when a signal ended it.
  int exit_code = -1;
  // What it printed on stdout (and stderr, `with_stderr`).
  std::string output;
};

inline RanAs RunAs(uid_t uid, const std::vector<gid_t>& groups,
                   std::vector<std::string> args, bool with_stderr = true) {
  RanAs ran;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return ran;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    if (with_stderr) dup2(out[1], 2);
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(uid) != 0 ||
        setuid(uid) != 0) {
      _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  char buffer[4096];
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) {
    ran.output.append(buffer, n);
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return ran;
}

}  // namespace allocd

#endif  // ALLOCD_TESTS_SECURITY_RUN_AS_H_
