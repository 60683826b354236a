// backend/cpu/target_clones.h: SPLICE_TARGET_CLONES(...), a hot CPU kernel compiled once per
// listed ISA and picked at load time by an ifunc resolver (GCC's target_clones).
//
// Only where GCC builds for x86-64 Linux (clang's and other targets' clone support differs), and
// never under ThreadSanitizer: the dynamic loader runs ifunc resolvers before any sanitizer
// runtime has started, and TSan instruments the resolver itself, so the process faults at load
// (session 51). Elsewhere the function is compiled once for the build's baseline ISA.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define SPLICE_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#else
#define SPLICE_TARGET_CLONES(...)
#endif
