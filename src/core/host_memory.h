#pragma once
// How much memory this process may still allocate on the host, so that loaders refuse a model or
// a KV cache that cannot fit before they allocate (an allocation that the kernel overcommits
// would otherwise end in the OOM killer, and a refused one in std::bad_alloc).
#include <cstdint>
#include <string>

#include "core/status.h"

namespace origami {

// MemAvailable from /proc/meminfo, capped by the cgroup's memory limit less its usage (cgroup v2
// memory.max / v1 memory.limit_in_bytes) when one is set. -1 when nothing can be read.
int64_t available_host_memory_bytes();

// "1.5 GiB", "312 MiB", "8.0 PiB": a byte count for messages.
std::string format_bytes(double bytes);

// resource_exhausted "<what> needs about <needed>, but only <available> of host memory is
// available" when `needed_bytes` exceeds available_host_memory_bytes(); ok when it fits or the
// available memory is unknown.
Status check_host_memory(double needed_bytes, const std::string& what);

}  // namespace origami
