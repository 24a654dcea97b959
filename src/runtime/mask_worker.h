// One background thread that runs one job at a time: the engine hands it the step's token mask
// computation before the model's forward and collects it after, so the two overlap.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dil::runtime {

class MaskWorker {
 public:
  MaskWorker() = default;
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;
  ~MaskWorker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Starts `job` on the worker (the thread starts on first use). One job at a time: wait()
  // before the next start().
  void start(std::function<void()> job) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    job_ = std::move(job);
    pending_ = true;
    cv_.notify_all();
  }

  // Until the job has run; rethrows what it threw.
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !pending_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return quit_ || (pending_ && job_); });
      if (quit_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lk.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      error_ = err;
      pending_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool pending_ = false, quit_ = false;  // pending_: started, not finished
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace dil::runtime
