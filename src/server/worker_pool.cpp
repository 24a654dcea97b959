#include "server/worker_pool.h"

#include <algorithm>

namespace dil::server::http {

WorkerPool::WorkerPool(int max_threads, int keep_idle, std::chrono::milliseconds idle_exit)
    : max_threads_(std::max(1, max_threads)), keep_idle_(std::max(0, keep_idle)), idle_exit_(idle_exit) {}

WorkerPool::~WorkerPool() {
  std::vector<std::thread> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    all.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : all) t.join();
}

void WorkerPool::reap_locked() {
  if (exited_.empty()) return;
  for (const auto& id : exited_) {
    auto it = std::find_if(threads_.begin(), threads_.end(), [&](const std::thread& t) { return t.get_id() == id; });
    if (it == threads_.end()) continue;
    it->join();  // it has returned from work(): joins at once
    threads_.erase(it);
  }
  exited_.clear();
}

void WorkerPool::submit(std::function<void()> task) {
  std::lock_guard<std::mutex> l(mu_);
  reap_locked();
  tasks_.push_back(std::move(task));
  if (idle_ < int(tasks_.size()) && alive_ < max_threads_) {
    ++alive_;
    ++idle_;  // counted idle until it takes a task
    threads_.emplace_back([this] { work(); });
  }
  cv_.notify_one();
}

void WorkerPool::work() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (tasks_.empty()) {
      if (stop_) break;
      const bool timed_out = !cv_.wait_for(l, idle_exit_, [&] { return stop_ || !tasks_.empty(); });
      if (timed_out && idle_ > keep_idle_) break;
      continue;
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    --idle_;
    l.unlock();
    task();
    task = nullptr;  // destroy captured state outside the lock too
    l.lock();
    ++idle_;
  }
  --idle_;
  --alive_;
  // Joined by the next submit() (or the destructor); nothing touches the pool after unlock.
  if (!stop_) exited_.push_back(std::this_thread::get_id());
}

int WorkerPool::threads() const {
  std::lock_guard<std::mutex> l(mu_);
  return alive_;
}

int WorkerPool::busy() const {
  std::lock_guard<std::mutex> l(mu_);
  return alive_ - idle_;
}

size_t WorkerPool::queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return tasks_.size();
}

}  // namespace dil::server::http
