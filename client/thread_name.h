// NameThisThread: names the calling thread for the system's tools (top -H,
// /proc/PID/task/TID/comm, nsys, gdb), so that what allocd's background
// threads cost a job's process shows per thread.
#ifndef ALLOCD_CLIENT_THREAD_NAME_H_
#define ALLOCD_CLIENT_THREAD_NAME_H_

#include <string>

namespace allocd {

// Names the calling thread `name`, cut to the 15 bytes Linux keeps. Every
// client thread's name starts with "allocd-" so that a profile can sum them.
void NameThisThread(const std::string& name);

// The calling thread's name ("" where the system cannot say).
std::string ThisThreadName();

}  // namespace allocd

#endif  // ALLOCD_CLIENT_THREAD_NAME_H_
