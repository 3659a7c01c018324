// kUnderAsan: whether this test binary (and so the daemon it starts, built
// alike) runs under AddressSanitizer, whose shadow memory and quarantine
// swell a process's RSS and whose checks slow replays several times: tests
// of memory bounds or of timing-dependent decisions skip there, and the
// release build runs them as meant.
#ifndef ALLOCD_TESTS_SECURITY_UNDER_ASAN_H_
#define ALLOCD_TESTS_SECURITY_UNDER_ASAN_H_

namespace allocd {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAsan = true;
#else
inline constexpr bool kUnderAsan = false;
#endif
#else
inline constexpr bool kUnderAsan = false;
#endif

}  // namespace allocd

#endif  // ALLOCD_TESTS_SECURITY_UNDER_ASAN_H_
