// The host's memory as Linux reports it (/proc/meminfo), for sizing caches on the CPU.
#pragma once
#include <cstddef>

namespace dil {

struct HostMemory {
  size_t total = 0;      // MemTotal
  size_t available = 0;  // MemAvailable: what can be allocated without swapping (page cache included)
};

// Zeros when /proc/meminfo cannot be read (not Linux).
HostMemory host_memory();

}  // namespace dil
