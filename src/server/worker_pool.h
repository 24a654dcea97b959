// The threads that run request handlers: elastic and bounded. A task starts a thread when
// none is idle and fewer than max_threads exist; beyond that tasks wait in FIFO order. A thread
// idle for longer than idle_exit leaves (down to keep_idle), so an idle server holds almost no
// threads, and a burst of streams holds one thread per stream only while it streams.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dil::server::http {

class WorkerPool {
 public:
  WorkerPool(int max_threads, int keep_idle, std::chrono::milliseconds idle_exit);
  ~WorkerPool();  // runs the queued tasks, then joins every thread
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(std::function<void()> task);
  int threads() const;  // alive now
  int busy() const;     // running a task now
  size_t queued() const;

 private:
  void work();
  void reap_locked();  // joins threads that have left

  const int max_threads_, keep_idle_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  std::vector<std::thread::id> exited_;
  int alive_ = 0, idle_ = 0;
  bool stop_ = false;
};

}  // namespace dil::server::http
