#include "backend/backend.h"

namespace dil {

int Backend::record_event() {
  synchronize();
  host_events_.push_back(std::chrono::steady_clock::now());
  return int(host_events_.size()) - 1;
}

double Backend::elapsed_ms(int from, int to) {
  DIL_CHECK(from >= 0 && to >= from && to < int(host_events_.size()), "bad event ids ", from, " ", to);
  return std::chrono::duration<double, std::milli>(host_events_[size_t(to)] - host_events_[size_t(from)]).count();
}

}  // namespace dil
