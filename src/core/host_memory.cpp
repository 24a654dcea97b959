#include "core/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace dil {

HostMemory host_memory() {
  HostMemory m;
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    size_t kb = 0;
    if (!(is >> key >> kb)) continue;
    if (key == "MemTotal:") m.total = kb << 10;
    else if (key == "MemAvailable:") m.available = kb << 10;
  }
  return m;
}

}  // namespace dil
